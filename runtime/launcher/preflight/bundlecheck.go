package preflight

import (
	"errors"
	"fmt"
	"path/filepath"
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
// could not be read). resolvePins re-resolves pinned sources by path:
// doctor's advisory check. A launch checks each pin on the descriptor it
// mounts instead (runtime/launcher/binds.go), so there it only requires pins.json
// to belong to the manifest with one pin per host bind.
func checkBundlePlan(plan *launchplan.Plan, readErr error, dir string, resolvePins bool) bundleResult {
	if readErr != nil {
		skipped := errors.New("not checked: the bundle could not be read")
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
	for _, f := range v.Findings {
		switch f.Check {
		case ocicheck.CheckDigests, ocicheck.CheckDecode, ocicheck.CheckNoHooks, ocicheck.CheckPins:
			continue // reported above (pins: the plan's pairing is the same check)
		}
		rest = append(rest, f.Check+": "+f.Detail)
	}
	if len(rest) > 0 {
		r.invalid = fmt.Errorf("%d finding(s) of the bundle validator: %s", len(rest), strings.Join(rest, "; "))
	}
	return r
}

func details(fs []ocicheck.Finding) string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Detail
	}
	return strings.Join(out, "; ")
}

// checkPins requires pins.json to belong to this bundle's manifest with one
// pin per host bind (bundle.PinnedBinds) and, with resolve, re-resolves every pinned bind source by path and requires
// the same device, inode and kind as at compile time, so a directory
// renamed away and replaced (or swapped for a symlink) since compile is
// reported. That is advice for doctor: only the launcher's check on the
// descriptor it mounts holds for the launch (runtime/launcher/binds.go).
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
	var problems []string
	for _, p := range pins {
		if err := checkPin(p); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("%d of %d pinned bind source(s) changed since compile: %s", len(problems), len(pins), strings.Join(problems, "; "))
	}
	return fmt.Sprintf("%d pinned bind source(s) resolve to the same device, inode and kind", len(pins)), nil
}

func checkPin(p bundle.Pin) error {
	where := fmt.Sprintf("pin %s (source %s)", p.Destination, p.Source)
	if !filepath.IsAbs(p.Source) || filepath.Clean(p.Source) != p.Source {
		return fmt.Errorf("%s: source is not an absolute clean path", where)
	}
	// No O_NOFOLLOW: with RESOLVE_NO_SYMLINKS a trailing symlink then fails
	// with ELOOP instead of opening the link itself, so the reason is clear.
	fd, err := unix.Openat2(unix.AT_FDCWD, p.Source, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("%s: %s", where, openat2Reason(err))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: stat: %v", where, err)
	}
	kind := string(pathsafe.KindOf(st.Mode))
	if st.Dev != p.Dev || st.Ino != p.Ino || kind != p.Kind {
		return fmt.Errorf("%s: now dev %d inode %d kind %s, compiled as dev %d inode %d kind %s; the path was replaced", where, st.Dev, st.Ino, kind, p.Dev, p.Ino, p.Kind)
	}
	return nil
}

func openat2Reason(err error) string {
	switch {
	case errors.Is(err, unix.ELOOP):
		return "a path component is a symlink; pinned sources are re-resolved without following links"
	case errors.Is(err, unix.ENOENT):
		return "no longer exists"
	case errors.Is(err, unix.ENOTDIR):
		return "a component of the path is not a directory"
	case errors.Is(err, unix.ENOSYS):
		return "openat2 is unavailable (kernel older than 5.6)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "permission denied while resolving"
	}
	return "openat2: " + err.Error()
}
