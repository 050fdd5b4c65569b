package archtest

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Module is the module path every Package.Path is relative to.
const Module = "paseo.dev/paseo-policy"

// Package is one package of the module: Path relative to Module, imports
// as `go list` gives them (module packages made relative too).
type Package struct {
	Path        string
	Imports     []string // direct, non-test files
	Deps        []string // transitive, non-test files
	TestImports []string // _test.go files, in-package and external
	Skips       []string // files (test or not) that call a testing Skip method
}

// Violation is one forbidden edge (Pkg imports or depends on Import), with
// the rule that forbids it.
type Violation struct {
	Rule   string
	Pkg    string
	Import string
	Why    string
}

func (v Violation) String() string {
	if v.Import == "" {
		return fmt.Sprintf("%s: %s: %s", v.Rule, v.Pkg, v.Why)
	}
	return fmt.Sprintf("%s: %s -> %s: %s", v.Rule, v.Pkg, v.Import, v.Why)
}

const cueModule = "cuelang.org/go"

// cueImporters may import CUE; every other package works on the Go types
// schema decodes into, so CUE's evaluation stays in one place: the
// launcher reads the compiler's output, never CUE, and cmd does no CUE
// (docs/spec.md, "Import direction").
var cueImporters = map[string]string{
	"policy/schema": "the CUE contracts and the one place facts, registry and profiles are unified and decoded",
}

// cueTestImporters may import CUE from their _test.go files only.
var cueTestImporters = map[string]string{
	"policy/schema":   "its tests",
	"policy/compiler": "bench_test.go's bare-CUE baseline (BenchmarkCUEBaseline), the yardstick for a compile",
}

// execImporters are the non-test packages allowed os/exec. runsc is
// exec'd only by runtime/launcher/runsc; each other entry runs something
// that is not runsc, and says what.
var execImporters = map[string]string{
	launcherRunsc:                    "runs runsc (run, restore, state, list, checkpoint, kill, delete) with the fixed flags: the only package that execs it",
	"internal/childproc":             "starts the *exec.Cmd runtime/launcher/runsc (or the search jail) built from a thread that lives until it is reaped; builds no command",
	"internal/testkit/localexec":     "test support: the contract test's second execution backend runs a plain host process",
	"runtime/supervisor/holder":      "re-execs its own binary (/proc/self/exe) as a sandbox's holder process (Spawn, client.go); the holder runs runsc through the launcher (runtime/launcher/runsc)",
	"runtime/launcher/nativesearch":  "re-execs its own binary (/proc/self/exe) as a search jail's init, which execs the image's rg, fd or find (fixed per tool, never a program the request names), or the image's git for the launcher's untracked cache (RunGit, never a request's)",
	"internal/hostgit":               "runs host git, the one hardened runner (clean environment, no hooks, fsmonitor, replace objects or transport but a local path) for runtime/gitadopt and runtime/gitimport; never runsc",
	"internal/testkit/testbundle":    "test support: builds static probe binaries with go build",
	"internal/testkit/testnet":       "test support: starts test hosts' processes inside the namespaces it made",
	"internal/testkit/testcontainer": "test support: re-execs the test binary into the container's namespaces",
	"test/cmd/fake-pi":               "test support: spawns copies of itself for the process-tree tests",
	"test/cmd/paseo-demo":            "test support: the demo's host git as the daemon user (an empty first commit, the branch's log after the import)",
	"internal/testkit/gitplant":      "test support: builds repositories with real git and runs the daemon's host git commands on them",
	"internal/testkit/mcpstandin":    "test support: npm ci of test/mcpstandin's lock, and node running the stand-in of Paseo's MCP endpoint",
}

// testSupport are the roots of the fakes, test worlds, probes and test
// programs (`make demo`'s among them: it runs the real supervisor, launcher
// and runsc, but against the fake model on a test network). The product
// never depends on anything below them, so no test double can ship in a
// binary; the folder says what a package is, and no list has to.
var testSupport = []string{"internal/testkit", "test/cmd"}

// skipHelper is the one package that calls t.Skip: every other test skips
// through it, so `make test` can turn every skip into a failure
// (internal/testkit/skip says how).
const skipHelper = "internal/testkit/skip"

// testOnly are packages that are tests themselves; every other package
// that is not TestSupport is product.
var testOnly = []string{"test/acceptance", "test/e2e", "test/picontract", "internal/archtest"}

// launchSide run a bundle; they read the compiler's output types and must
// not be able to compile, so a launch cannot depend on CUE or profiles.
// The holder process runs one (the supervisor, which compiles, only
// hands it a bundle on disk). The cluster gateway serves a bundle's routes
// from the same verified plan.
var launchSide = []string{"runtime/launcher", "runtime/execution", "runtime/bridge", "runtime/supervisor/holder", "runtime/gateway"}

// neutralSeams are the interfaces every backend meets, with the packages
// no seam may depend on, even transitively: a seam that linked its
// adapter would hand its callers the adapter's types, and a second
// backend would have to drag the first one in.
var neutralSeams = map[string][]string{
	"runtime/execution": {"runtime/launcher"}, // the OCI adapter lives beside the launcher: runtime/launcher/ociexec
}

// notOnLaunchSide are what the launch side must not depend on, even
// transitively, nor on any package below them: what both sides share (the
// path resolver, the destination classifier) lives in internal/.
var notOnLaunchSide = []string{"policy/compiler", "policy/schema", "policy/profiles"}

// lineCarriers carry the supervisor's and the holders' JSON lines, the
// client side and the server side. They know no layer: what an op means,
// its error codes and who may ask stay in runtime/supervisor, so the loop
// cannot grow a protocol's rules (nor an import cycle with it).
var lineCarriers = []string{"internal/linerpc", "internal/lineserve"}

// supervisorClients speak to the supervisor over its socket (Paseo's Pi
// command): they hand it facts and bridge bytes, and may not import what
// compiles, launches or judges a sandbox themselves, so a refused or
// unavailable launch cannot fall back to running anything on their own.
// (They cannot exec either: they are not in execImporters.)
var supervisorClients = []string{"runtime/pilaunch"}

// notForClients are the packages a supervisor client may not import.
var notForClients = []string{"policy/compiler", "policy/profiles", "runtime/launcher", "runtime/supervisor/holder"}

// hostGit runs host git; hostGitUsers are the host-side Git steps, the
// only packages that may import it (a new user is a new place git runs on
// what an agent wrote, and is reviewed as one). It imports nothing of the
// module, so its hardening cannot depend on a layer's types.
const hostGit = "internal/hostgit"

var hostGitUsers = []string{"runtime/gitadopt", "runtime/gitimport"}

// renderers are the renderings of a plan (the OCI bundle runsc runs, the
// Kubernetes and agent-sandbox objects): they read the plan's types
// (policy/grant, policy/bundle) and never what builds a plan or runs one,
// so a rendering can say nothing the plan does not.
const renderers = "policy/render"

// notForRenderers are what a rendering must not depend on, even
// transitively, nor on any package below them.
var notForRenderers = []string{"policy/compiler", "policy/schema", "policy/profiles", "runtime"}

// launcherRoot is the launcher package: launch, wake and checkpoint.
// Its other jobs are packages below it (launcherParts), which it imports
// and which never import it.
const launcherRoot = "runtime/launcher"

const launcherRunsc = "runtime/launcher/runsc"

// launcherParts are the launcher's jobs besides launching, each with the
// launcher's packages it may import directly: runsc (the one place runsc
// is executed), statedir (the state root's layout and the one record
// lookup), mounts (mountinfo housekeeping) and inventory (ps, kill, gc:
// it works from runsc, the state root and mountinfo, never from the
// launcher). None of them depends on the launcher, even transitively, so
// the launcher's imports of them run one way.
var launcherParts = map[string][]string{
	launcherRunsc:                {"runtime/launcher/launchplan", "runtime/launcher/mounts"},
	"runtime/launcher/statedir":  nil,
	"runtime/launcher/mounts":    nil,
	"runtime/launcher/inventory": {launcherRunsc, "runtime/launcher/statedir", "runtime/launcher/mounts", "runtime/launcher/sandboxnet"},
}

// Check returns every violation in pkgs, sorted. A rule that names a
// package pkgs lacks is a violation too: after a move the rules must move
// with it instead of silently allowing nothing or guarding nothing.
func Check(pkgs []Package) []Violation {
	var vs []Violation
	add := func(rule, pkg, imp, why string) {
		vs = append(vs, Violation{Rule: rule, Pkg: pkg, Import: imp, Why: why})
	}
	known := map[string]bool{}
	for _, p := range pkgs {
		known[p.Path] = true
	}
	var forbidden []string
	for _, fs := range neutralSeams {
		forbidden = append(forbidden, fs...)
	}
	for _, names := range [][]string{slices.Sorted(maps.Keys(launcherParts)), {launcherRoot}, keys(cueImporters), keys(cueTestImporters), keys(execImporters), testOnly, launchSide, notOnLaunchSide, slices.Sorted(maps.Keys(neutralSeams)), forbidden, lineCarriers, supervisorClients, notForClients, hostGitUsers, {skipHelper, hostGit}} {
		for _, n := range names {
			if !known[n] {
				add("stale-rule", n, "", "a rule names this package but the module has none; update internal/archtest")
			}
		}
	}
	for _, root := range append(append([]string{renderers}, notForRenderers...), testSupport...) {
		if !anyWithin(pkgs, root) {
			add("stale-rule", root, "", "a rule names this folder but the module has no package below it; update internal/archtest")
		}
	}
	tests := set(testOnly)
	for _, p := range pkgs {
		for _, imp := range p.Imports {
			if isCUE(imp) && cueImporters[p.Path] == "" {
				add("cue-only-in-schema", p.Path, imp, "CUE is evaluated in schema only; use schema's Go types")
			}
			if imp == "os/exec" && execImporters[p.Path] == "" {
				add("exec-allowlist", p.Path, imp, "only runtime/launcher/runsc execs runsc; a new exec needs an entry in execImporters saying what it runs")
			}
		}
		for _, imp := range p.TestImports {
			if isCUE(imp) && cueTestImporters[p.Path] == "" {
				add("cue-only-in-schema", p.Path, imp+" (in _test.go)", "CUE is evaluated in schema only; test through schema")
			}
		}
		if len(p.Skips) > 0 && p.Path != skipHelper {
			add("one-skip-helper", p.Path, strings.Join(p.Skips, ", "), "tests skip through internal/testkit/skip only, which make test turns into a failure")
		}
		if !within(p.Path, testSupport) && !tests[p.Path] {
			for _, d := range p.Deps {
				if within(d, testSupport) {
					add("no-test-support-in-product", p.Path, d, "product code must not link fakes, test worlds or probes")
				}
			}
		}
		for _, d := range p.Deps {
			if within(d, neutralSeams[p.Path]) {
				add("seam-imports-no-backend", p.Path, d, "a backend-neutral seam holds interfaces and neutral types; its adapters import it, never the other way")
			}
		}
		if within(p.Path, launchSide) {
			for _, d := range p.Deps {
				if isCUE(d) || within(d, notOnLaunchSide) {
					add("launch-reads-output-only", p.Path, d, "the launch side reads the compiler's output, it never compiles or evaluates CUE")
				}
			}
		}
		if within(p.Path, []string{renderers}) {
			for _, d := range p.Deps {
				// known: the module's own runtime/, not the standard library's.
				if known[d] && within(d, notForRenderers) {
					add("renderers-read-the-plan", p.Path, d, "a rendering reads the plan's types (policy/grant, policy/bundle); it never compiles, evaluates CUE or runs a sandbox")
				}
			}
		}
		if allowed, ok := launcherParts[p.Path]; ok {
			for _, d := range p.Deps {
				if d == launcherRoot {
					add("launcher-parts-one-way", p.Path, d, "the launcher imports its parts (runsc, statedir, mounts, inventory), never the other way")
				}
			}
			for _, imp := range p.Imports {
				if within(imp, []string{launcherRoot}) && imp != launcherRoot && !slices.Contains(allowed, imp) {
					add("launcher-parts-one-way", p.Path, imp, "a part of the launcher imports only the launcher packages launcherParts names for it")
				}
			}
		}
		if slices.Contains(supervisorClients, p.Path) {
			for _, imp := range p.Imports {
				if within(imp, notForClients) {
					add("clients-only-ask", p.Path, imp, "a supervisor client hands over facts and bridges bytes; compiling and launching are the supervisor's")
				}
			}
		}
		if !slices.Contains(hostGitUsers, p.Path) && slices.Contains(p.Imports, hostGit) {
			add("host-git-for-git-steps", p.Path, hostGit, "host git runs on what an agent wrote in the host-side Git steps only (runtime/gitadopt, runtime/gitimport)")
		}
		if p.Path == hostGit {
			for _, d := range p.Deps {
				if known[d] {
					add("host-git-imports-no-layer", p.Path, d, "the host git runner is a leaf: its hardening depends on no layer of the module")
				}
			}
		}
		if slices.Contains(lineCarriers, p.Path) {
			for _, d := range p.Deps {
				// known: the module's own runtime/, not the standard library's.
				if known[d] && within(d, []string{"runtime", "policy"}) {
					add("line-carriers-know-no-layer", p.Path, d, "the JSON-lines client and server loops carry lines; the protocols' meaning stays in runtime/supervisor")
				}
			}
		}
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].String() < vs[j].String() })
	return vs
}

func isCUE(imp string) bool { return imp == cueModule || strings.HasPrefix(imp, cueModule+"/") }

// within reports whether path is one of roots or below one.
func within(path string, roots []string) bool {
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}

// anyWithin reports whether some package of pkgs is root or below it.
func anyWithin(pkgs []Package, root string) bool {
	for _, p := range pkgs {
		if within(p.Path, []string{root}) {
			return true
		}
	}
	return false
}

func set(list []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range list {
		m[s] = true
	}
	return m
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
