// Package preflight checks, before the launcher starts anything, that the
// host can run a bundle safely: root, a kernel with openat2, a pinned static
// runsc, cgroups (v2, or v1 controllers) with the controllers the limits need, working nftables,
// and (given a bundle, or a launch plan already loaded from one) that the
// bundle validator (ocicheck, through launchplan) has no finding: intact,
// hook-free, every invariant kept; that every bind source it pinned at
// compile time is still the same object and that the image's EROFS files
// it mounts still have their digests.
//
// Every check runs and reports; nothing stops at the first failure, so one
// run tells an operator everything that is wrong. Details carry the reason
// and name paths, digests and identities, never file contents, so a report
// is safe to print or log.
package preflight

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

// Check names, stable for scripts that read the JSON report.
const (
	CheckRoot          = "root"
	CheckKernel        = "kernel"
	CheckRunscStatic   = "runsc-static"
	CheckRunscDigest   = "runsc-digest"
	CheckCgroup        = "cgroup"
	CheckNftables      = "nftables"
	CheckBundleDigests = "bundle-digests"
	CheckBundleHooks   = "bundle-no-hooks"
	CheckBundlePins    = "bundle-pins"
	CheckImageErofs    = "image-erofs"
	// CheckBundleValid is reported, failed, when the bundle validator
	// (ocicheck, as `validate` runs it) has findings none of the bundle
	// checks above covers.
	CheckBundleValid = "bundle-valid"
)

// codes is each check's stable code (package diag), carried by a failed
// check and by the launch it refuses.
var codes = map[string]diag.Code{
	CheckRoot:          diag.PreflightRoot,
	CheckKernel:        diag.PreflightKernel,
	CheckRunscStatic:   diag.PreflightRunscStatic,
	CheckRunscDigest:   diag.PreflightRunscDigest,
	CheckCgroup:        diag.PreflightCgroup,
	CheckNftables:      diag.PreflightNftables,
	CheckBundleDigests: diag.PreflightBundleDigests,
	CheckBundleHooks:   diag.PreflightBundleHooks,
	CheckBundlePins:    diag.PreflightBundlePins,
	CheckImageErofs:    diag.PreflightImageErofs,
	CheckBundleValid:   diag.PreflightBundleValid,
}

// Code is the stable code of the check named name ("" for no such check).
func Code(name string) diag.Code { return codes[name] }

// Check is the outcome of one check. Detail says what was found when OK and
// why the check failed when not; Code is the check's code when it failed.
type Check struct {
	Name   string    `json:"name"`
	OK     bool      `json:"ok"`
	Code   diag.Code `json:"code,omitempty"`
	Detail string    `json:"detail"`
	// err is the failure, kept whole (Report.Err unwraps to it).
	err error
}

// CheckError is one failed check: its name and code, and its error kept
// whole (Unwrap), so errors.Is sees both the check's code
// (errors.Is(err, diag.PreflightRunscDigest)) and the codes and sentinels
// beneath it (a pin's diag.PathCrossMount, fs.ErrNotExist).
type CheckError struct {
	Check string
	Code  diag.Code
	Err   error
}

func (e *CheckError) Error() string { return e.Check + ": " + e.Err.Error() }

func (e *CheckError) Unwrap() error { return e.Err }

// Is matches the check's code.
func (e *CheckError) Is(target error) bool { c, ok := target.(diag.Code); return ok && c == e.Code }

// Error is a failed preflight: every failed check, in the order they ran.
// The launcher returns it inside its *UnavailableError; the holder sends
// it to the supervisor as diagnostics (Diagnostics), which answers
// unavailable with them.
type Error struct {
	Failed []*CheckError
}

func (e *Error) Error() string {
	if len(e.Failed) == 0 {
		return "preflight: no checks ran"
	}
	msgs := make([]string, len(e.Failed))
	for i, c := range e.Failed {
		msgs[i] = c.Error()
	}
	return "preflight failed: " + strings.Join(msgs, "; ")
}

func (e *Error) Unwrap() []error {
	out := make([]error, len(e.Failed))
	for i, c := range e.Failed {
		out[i] = c
	}
	return out
}

// Diagnostics are the failed checks as diagnostics: the check's code, the
// path preflight.<check>, the check's detail (paths, digests and
// identities, never file contents).
func (e *Error) Diagnostics() diag.List {
	out := make(diag.List, len(e.Failed))
	for i, c := range e.Failed {
		out[i] = diag.Diagnostic{Code: c.Code, Path: "preflight." + c.Check, Message: c.Err.Error()}
	}
	return out
}

// Report is every check in the order it ran. Its JSON form is
//
//	{"ok": false, "checks": [{"name": "root", "ok": true, "detail": "…"},
//	  {"name": "runsc-digest", "ok": false, "code": "PP-PREFLIGHT-RUNSC-DIGEST", "detail": "…"}, …]}
type Report struct {
	Checks []Check `json:"checks"`
}

// OK reports whether there is at least one check and every check passed.
func (r Report) OK() bool {
	if len(r.Checks) == 0 {
		return false
	}
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Get returns the check with the given name.
func (r Report) Get(name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Err is nil when the report is OK and otherwise an *Error naming every
// failed check with its code and reason.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	e := &Error{}
	for _, c := range r.Checks {
		if !c.OK {
			err := c.err
			if err == nil { // a report read back from JSON
				err = errors.New(c.Detail)
			}
			e.Failed = append(e.Failed, &CheckError{Check: c.Name, Code: codes[c.Name], Err: err})
		}
	}
	return e
}

// MarshalJSON adds the overall verdict next to the checks.
func (r Report) MarshalJSON() ([]byte, error) {
	checks := r.Checks
	if checks == nil {
		checks = []Check{}
	}
	return json.Marshal(struct {
		OK     bool    `json:"ok"`
		Checks []Check `json:"checks"`
	}{r.OK(), checks})
}

// Options say what to check.
type Options struct {
	// RunscPath is the runsc binary the launcher will execute.
	RunscPath string
	// RunscDigestFile holds "<sha256-hex>  <name>" lines as written by
	// tools/runsc/build.sh (sha256sum format). Empty means RunscPath+".sha256".
	RunscDigestFile string
	// BundleDir is a compiled bundle to verify; empty skips the bundle checks.
	BundleDir string
	// Plan, when set, is the bundle already read from BundleDir and
	// judged (launchplan.Load): the launcher reads it once and these
	// checks report on the very bytes it then runs. It also means a
	// launch: pins are checked on the descriptors the launcher mounts, not
	// re-resolved here by path.
	Plan *launchplan.Plan
	// DigestCache is a root-only file caching the runsc digest by file
	// identity (digestcache.go); empty hashes the binary every time.
	DigestCache string
	// ImageDigestCache is a root-only directory caching the digests of the
	// image's EROFS files by file identity (erofs.go); empty hashes them
	// every time.
	ImageDigestCache string
	// SkipNftablesProbe leaves out the nftables probe. The launcher sets
	// it: network mode none uses no packet filter, and in sandbox mode
	// programming the real rules proves nftables and fails closed.
	// doctor always probes.
	SkipNftablesProbe bool
}

// Run runs every check and returns the report; it never stops early.
func Run(opts Options) Report {
	var r Report
	add := func(name string, err error, ok string) {
		if err != nil {
			r.Checks = append(r.Checks, Check{Name: name, OK: false, Code: codes[name], Detail: err.Error(), err: err})
			return
		}
		r.Checks = append(r.Checks, Check{Name: name, OK: true, Detail: ok})
	}

	euid := os.Geteuid()
	add(CheckRoot, checkRoot(euid), fmt.Sprintf("euid %d", euid))

	release, err := kernelRelease()
	if err == nil {
		err = checkKernel(release)
	}
	add(CheckKernel, err, fmt.Sprintf("kernel %s is at least %d.%d", release, minKernelMajor, minKernelMinor))

	digestFile := opts.RunscDigestFile
	if digestFile == "" && opts.RunscPath != "" {
		digestFile = opts.RunscPath + ".sha256"
	}
	rs := inspectRunscCached(opts.RunscPath, opts.DigestCache)
	add(CheckRunscStatic, rs.staticErr(), fmt.Sprintf("%s is a static ELF", opts.RunscPath))
	add(CheckRunscDigest, rs.digestErr(digestFile), fmt.Sprintf("%s sha256 %s matches %s", opts.RunscPath, rs.sha256, digestFile))

	controllers, err := checkCgroup(cgroupRoot)
	add(CheckCgroup, err, controllers)

	if !opts.SkipNftablesProbe {
		detail, err := checkNftables()
		add(CheckNftables, err, detail)
	}

	if opts.BundleDir != "" || opts.Plan != nil {
		plan, readErr := opts.Plan, error(nil)
		if plan == nil {
			plan, readErr = launchplan.Load(opts.BundleDir)
		}
		b := checkBundlePlan(plan, readErr, opts.BundleDir, opts.Plan == nil)
		add(CheckBundleDigests, b.digests, fmt.Sprintf("%s: every output matches the manifest digest", opts.BundleDir))
		add(CheckBundleHooks, b.hooks, fmt.Sprintf("%s: no hooks", bundleConfigName))
		add(CheckBundlePins, b.pins, b.pinsOK)
		detail, err := checkErofsPlan(plan, readErr, opts.ImageDigestCache)
		add(CheckImageErofs, err, detail)
		// The validator's other findings (runtime-tools, invariants,
		// secret placeholders, egress destinations) have no check of
		// their own above; they appear, failed, only when there are any,
		// so a launchable bundle's report keeps its shape.
		if b.invalid != nil {
			add(CheckBundleValid, b.invalid, "")
		}
	}
	return r
}
