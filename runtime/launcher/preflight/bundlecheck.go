package preflight

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/ocicheck"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

const bundleConfigName = bundle.ConfigFile

// bundleResult holds the bundle checks; each is judged on its own so a
// report names every problem, not just the first. All but the pins'
// re-resolution come from one ocicheck run on the plan (the validator
// behind validate and every launch): digests, hooks and pins under their
// own names, every other finding under invalid.
type bundleResult struct {
	digests, hooks, pins error
	pinsOK               string
	invalid              error
}

// checkBundlePlan reports the plan's verdict (readErr: why the bundle
// could not be read). resolvePins opens the pinned sources as a launch
// would: doctor's advisory check. A launch checks each pin on the descriptor it
// mounts instead (runtime/launcher/binds.go), so there it only requires pins.json
// to belong to the manifest with one pin per host bind.
func checkBundlePlan(plan *launchplan.Plan, readErr error, dir string, resolvePins bool) bundleResult {
	if readErr != nil {
		skipped := because(ErrNotChecked, "not checked: the bundle could not be read")
		return bundleResult{digests: readErr, hooks: skipped, pins: skipped}
	}
	v := plan.Verdict
	var r bundleResult
	if f := v.Failed(ocicheck.CheckDigests); len(f) > 0 {
		r.digests = fmt.Errorf("bundle %s fails verification: %s", dir, details(f))
	}
	if f := append(v.Failed(ocicheck.CheckDecode), v.Failed(ocicheck.CheckNoHooks)...); len(f) > 0 {
		r.hooks = errors.New(details(f))
	}
	r.pinsOK, r.pins = checkPins(plan, resolvePins)
	var rest []string
	var errs []error
	for _, f := range v.Findings {
		switch f.Check {
		case ocicheck.CheckDigests, ocicheck.CheckDecode, ocicheck.CheckNoHooks, ocicheck.CheckPins:
			continue // reported above (pins: the plan's pairing is the same check)
		}
		rest = append(rest, f.Check+": "+f.Detail)
		if f.Err != nil { // one error's findings repeat it, which errors.Is does not mind
			errs = append(errs, f.Err)
		}
	}
	if len(rest) > 0 {
		r.invalid = &findingsError{msg: fmt.Sprintf("%d finding(s) of the bundle validator: %s", len(rest), strings.Join(rest, "; ")), errs: errs}
	}
	return r
}

// findingsError is the validator's other findings: the text lists each,
// Unwrap gives the errors they came from (a placeholder's
// diag.SecretMarker, a slot's diag.SecretSlot).
type findingsError struct {
	msg  string
	errs []error
}

func (e *findingsError) Error() string { return e.msg }

func (e *findingsError) Unwrap() []error { return e.errs }

func details(fs []ocicheck.Finding) string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Detail
	}
	return strings.Join(out, "; ")
}

// pinsError is every pin that no longer opens as compiled; Unwrap gives
// each one's pathsafe error (its code).
type pinsError struct {
	problems []error
	of       int
}

func (e *pinsError) Error() string {
	msgs := make([]string, len(e.problems))
	for i, p := range e.problems {
		msgs[i] = p.Error()
	}
	return fmt.Sprintf("%d of %d pinned bind source(s) changed since compile: %s", len(e.problems), e.of, strings.Join(msgs, "; "))
}

func (e *pinsError) Unwrap() []error { return e.problems }

// checkPins requires pins.json to belong to this bundle's manifest with one
// pin per host bind (bundle.PinnedBinds) and, with resolve, opens every
// pinned bind source as the launch opens it (pathsafe.OpenPinned) and
// requires the same device, inode and kind as at compile time, so a
// directory renamed away and replaced, swapped for a symlink or mounted
// over since compile is reported. That is advice for doctor: only the
// launcher's check on the descriptor it mounts holds for the launch
// (runtime/launcher/binds.go), with the same opener.
func checkPins(plan *launchplan.Plan, resolve bool) (string, error) {
	pairs, err := plan.Binds, plan.BindsErr // without pins.json, any host bind is refused
	if err != nil {
		return "", err
	}
	if _, ok := plan.Files[bundle.PinsFile]; !ok {
		return "no " + bundle.PinsFile + " and no bind with a host source", nil
	}
	if !resolve {
		return fmt.Sprintf("%d pin(s), one per host bind, for this manifest; each is checked on the descriptor the launcher mounts", len(pairs)), nil
	}
	pins := make([]bundle.Pin, len(pairs))
	for i, bp := range pairs {
		pins[i] = bp.Pin
	}
	var problems []error
	for _, p := range pins {
		if err := checkPin(p); err != nil {
			problems = append(problems, err)
		}
	}
	if len(problems) > 0 {
		return "", &pinsError{problems, len(pins)}
	}
	return fmt.Sprintf("%d pinned bind source(s) resolve to the same device, inode and kind", len(pins)), nil
}

// checkPin opens p's source as the launch does (pathsafe.OpenPinned: beneath
// its root, no symlinks, no mount crossing, the pinned identity), so
// doctor's verdict on a pin is the launch's; the refusal keeps pathsafe's
// code.
func checkPin(p bundle.Pin) error {
	fd, err := pathsafe.Resolver{}.OpenPinned(p.Root, p.Source, pathsafe.Identity{Dev: p.Dev, Ino: p.Ino, Kind: pathsafe.Kind(p.Kind)})
	if err != nil {
		return fmt.Errorf("pin %s (source %s): %w", p.Destination, p.Source, err)
	}
	unix.Close(fd)
	return nil
}
