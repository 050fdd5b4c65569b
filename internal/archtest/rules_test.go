package archtest

import (
	"maps"
	"slices"
	"testing"
)

// baseline is a small module that keeps every rule: each case below adds
// one edge to it.
func baseline() []Package {
	var pkgs []Package
	for _, n := range append(append(append(append(append(append(append(append(slices.Sorted(maps.Keys(launcherParts)), keys(cueImporters)...), keys(execImporters)...), testOnly...), launchSide...), notOnLaunchSide...), lineCarriers...), hostGitUsers...), skipHelper) {
		pkgs = append(pkgs, Package{Path: n})
	}
	// Module packages no rule names, for edges to them (the standard
	// library's runtime is no module package).
	for _, n := range append([]string{"runtime/supervisor/rpcerr", "policy/bundle", "policy/grant", "policy/render/oci", "policy/render/kubernetes", "runtime/supervisor", "diag", "runtime/launcher/launchplan", "runtime/launcher/sandboxnet", "runtime/launcher/routeproxy"}, append(supervisorClients, notForClients...)...) {
		pkgs = append(pkgs, Package{Path: n})
	}
	return pkgs
}

func with(pkgs []Package, path string, edit func(*Package)) []Package {
	for i := range pkgs {
		if pkgs[i].Path == path {
			edit(&pkgs[i])
			return pkgs
		}
	}
	p := Package{Path: path}
	edit(&p)
	return append(pkgs, p)
}

func TestRules(t *testing.T) {
	imports := func(imps ...string) func(*Package) {
		return func(p *Package) { p.Imports = append(p.Imports, imps...); p.Deps = append(p.Deps, imps...) }
	}
	deps := func(ds ...string) func(*Package) { return func(p *Package) { p.Deps = append(p.Deps, ds...) } }
	skips := func(files ...string) func(*Package) { return func(p *Package) { p.Skips = append(p.Skips, files...) } }
	tests := func(imps ...string) func(*Package) {
		return func(p *Package) { p.TestImports = append(p.TestImports, imps...) }
	}
	cases := []struct {
		name     string
		pkg      string
		edit     func(*Package)
		wantRule string // "" means allowed; else one of the violations
	}{
		{"schema imports CUE", "policy/schema", imports("cuelang.org/go/cue"), ""},
		{"schema's tests import CUE", "policy/schema", tests("cuelang.org/go/cue/cuecontext"), ""},
		{"compiler's benchmark imports CUE", "policy/compiler", tests("cuelang.org/go/cue"), ""},
		{"compiler imports CUE", "policy/compiler", imports("cuelang.org/go/cue"), "cue-only-in-schema"},
		{"launcher imports CUE", "runtime/launcher", imports("cuelang.org/go/cue"), "cue-only-in-schema"},
		{"cmd/paseo-policy imports the CUE module root", "cmd/paseo-policy", imports("cuelang.org/go"), "cue-only-in-schema"},
		{"launcher's tests import CUE", "runtime/launcher", tests("cuelang.org/go/cue"), "cue-only-in-schema"},
		{"the runsc package execs", "runtime/launcher/runsc", imports("os/exec"), ""},
		{"the launcher execs (runsc is run by runtime/launcher/runsc)", "runtime/launcher", imports("os/exec"), "exec-allowlist"},
		{"the inventory execs runsc itself", "runtime/launcher/inventory", imports("os/exec"), "exec-allowlist"},
		{"the launcher imports its parts", "runtime/launcher", imports("runtime/launcher/runsc", "runtime/launcher/statedir", "runtime/launcher/mounts", "runtime/launcher/inventory"), ""},
		{"the inventory imports runsc, the state root, mounts and the network state", "runtime/launcher/inventory", imports("runtime/launcher/runsc", "runtime/launcher/statedir", "runtime/launcher/mounts", "runtime/launcher/sandboxnet"), ""},
		{"the inventory imports the launcher", "runtime/launcher/inventory", imports("runtime/launcher"), "launcher-parts-one-way"},
		{"the inventory depends on the launcher through another package", "runtime/launcher/inventory", deps("runtime/launcher/ociexec", "runtime/launcher"), "launcher-parts-one-way"},
		{"runsc imports the launcher", "runtime/launcher/runsc", imports("runtime/launcher"), "launcher-parts-one-way"},
		{"statedir imports the launcher", "runtime/launcher/statedir", imports("runtime/launcher"), "launcher-parts-one-way"},
		{"mounts depends on the launcher", "runtime/launcher/mounts", deps("runtime/launcher"), "launcher-parts-one-way"},
		{"statedir imports runsc", "runtime/launcher/statedir", imports("runtime/launcher/runsc"), "launcher-parts-one-way"},
		{"mounts imports statedir", "runtime/launcher/mounts", imports("runtime/launcher/statedir"), "launcher-parts-one-way"},
		{"runsc imports the route proxy", "runtime/launcher/runsc", imports("runtime/launcher/routeproxy"), "launcher-parts-one-way"},
		{"runsc's tests import the launcher", "runtime/launcher/runsc", tests("runtime/launcher"), ""},
		{"the holder package spawns holders", "runtime/supervisor/holder", imports("os/exec"), ""},
		{"supervisor execs (its holder spawn lives in supervisor/holder)", "runtime/supervisor", imports("os/exec"), "exec-allowlist"},
		{"a launcher subpackage execs", "runtime/launcher/preflight", imports("os/exec"), "exec-allowlist"},
		{"compiler execs", "policy/compiler", imports("os/exec"), "exec-allowlist"},
		{"bridge execs", "runtime/bridge", imports("os/exec"), "exec-allowlist"},
		{"bridge's tests exec", "runtime/bridge", tests("os/exec"), ""},
		{"launcher links a test world", "runtime/launcher", deps("internal/testkit/testnet"), "no-test-support-in-product"},
		{"cli links the fake model transitively", "cli", deps("internal/testkit/fakemodel"), "no-test-support-in-product"},
		{"supervisor links the probe", "runtime/supervisor", deps("internal/testkit/probe"), "no-test-support-in-product"},
		{"supervisor links a fake no list names (the folder says it is test support)", "runtime/supervisor", deps("internal/testkit/fakemcp"), "no-test-support-in-product"},
		{"a test program links the probe", "test/cmd/paseo-probe", deps("internal/testkit/probe"), ""},
		{"launcher's tests use a test bundle", "runtime/launcher", tests("internal/testkit/testbundle"), ""},
		{"acceptance links the probe", "test/acceptance", deps("internal/testkit/probe"), ""},
		{"test support links test support", "internal/testkit/testbundle", deps("internal/testkit/testtree"), ""},
		{"the demo runs the fake model and a test world", "test/cmd/paseo-demo", deps("internal/testkit/fakemodel", "internal/testkit/testnet"), ""},
		{"the CLI links the demo", "cmd/paseo-policy", deps("test/cmd/paseo-demo"), "no-test-support-in-product"},
		{"launcher depends on compiler", "runtime/launcher", deps("policy/compiler"), "launch-reads-output-only"},
		{"the cluster gateway depends on compiler", "runtime/gateway", deps("policy/compiler"), "launch-reads-output-only"},
		{"sandboxnet depends on schema", "runtime/launcher/sandboxnet", deps("policy/schema"), "launch-reads-output-only"},
		{"execution depends on CUE transitively", "runtime/execution", deps("cuelang.org/go/cue"), "launch-reads-output-only"},
		{"the seam imports the launcher", "runtime/execution", imports("runtime/launcher"), "seam-imports-no-backend"},
		{"the seam depends on the route proxy", "runtime/execution", deps("runtime/launcher/routeproxy"), "seam-imports-no-backend"},
		{"the OCI adapter imports the seam and the launcher", "runtime/launcher/ociexec", imports("runtime/execution", "runtime/launcher"), ""},
		{"the seam's contract test uses the OCI adapter", "runtime/execution", tests("runtime/launcher/ociexec"), ""},
		{"launcher depends on pathsafe", "runtime/launcher", deps("internal/pathsafe"), ""},
		{"the Git steps run host git", "runtime/gitimport", imports("internal/hostgit"), ""},
		{"the adopt step runs host git", "runtime/gitadopt", imports("internal/hostgit"), ""},
		{"a Git step execs git on its own", "runtime/gitimport", imports("os/exec"), "exec-allowlist"},
		{"the launcher runs host git", "runtime/launcher", imports("internal/hostgit"), "host-git-for-git-steps"},
		{"the CLI runs host git", "cli", imports("internal/hostgit"), "host-git-for-git-steps"},
		{"the host git runner imports a layer", "internal/hostgit", deps("diag"), "host-git-imports-no-layer"},
		{"the host git runner uses the standard library", "internal/hostgit", imports("os/exec", "syscall"), ""},
		{"launcher depends on a compiler subpackage", "runtime/launcher", deps("policy/compiler/gitindex"), "launch-reads-output-only"},
		{"the skip helper skips", "internal/testkit/skip", skips("skip.go"), ""},
		{"a launcher test skips on its own", "runtime/launcher", skips("network_test.go"), "one-skip-helper"},
		{"test support skips on its own", "internal/testkit/testnet", skips("testnet.go"), "one-skip-helper"},
		{"supervisor compiles", "runtime/supervisor", deps("policy/compiler", "policy/schema"), ""},
		{"the Pi command compiles", "runtime/pilaunch", imports("policy/compiler"), "clients-only-ask"},
		{"the Pi command launches", "runtime/pilaunch", imports("runtime/launcher"), "clients-only-ask"},
		{"the Pi command execs", "runtime/pilaunch", imports("os/exec"), "exec-allowlist"},
		{"the Pi command uses the supervisor's client and schema's types", "runtime/pilaunch", imports("runtime/supervisor", "policy/schema"), ""},
		{"the holder depends on compiler", "runtime/supervisor/holder", deps("policy/compiler"), "launch-reads-output-only"},
		{"the server loop uses x/sys and the standard library's runtime", "internal/lineserve", imports("golang.org/x/sys/unix", "runtime", "runtime/cgo"), ""},
		{"the server loop imports the supervisor's error codes", "internal/lineserve", imports("runtime/supervisor/rpcerr"), "line-carriers-know-no-layer"},
		{"the client loop depends on the bundle", "internal/linerpc", deps("policy/bundle"), "line-carriers-know-no-layer"},
		{"the OCI rendering reads the plan's types", "policy/render/oci", imports("policy/grant", "policy/bundle"), ""},
		{"the compiler calls the OCI rendering", "policy/compiler", imports("policy/render/oci"), ""},
		{"a rendering uses the standard library's runtime", "policy/render/kubernetes", imports("runtime"), ""},
		{"the OCI rendering depends on the compiler", "policy/render/oci", deps("policy/compiler"), "renderers-read-the-plan"},
		{"a rendering evaluates the schema", "policy/render/kubernetes", deps("policy/schema"), "renderers-read-the-plan"},
		{"a rendering depends on the launcher", "policy/render/kubernetes", deps("runtime/launcher"), "renderers-read-the-plan"},
		{"a new rendering depends on the supervisor", "policy/render/other", deps("runtime/supervisor"), "renderers-read-the-plan"},
		{"the supervisor and the holder import the server loop", "runtime/supervisor/holder", imports("internal/lineserve"), ""},
	}
	if vs := Check(baseline()); len(vs) != 0 {
		t.Fatalf("baseline breaks a rule: %v", vs)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vs := Check(with(baseline(), c.pkg, c.edit))
			if c.wantRule == "" {
				if len(vs) != 0 {
					t.Fatalf("allowed edge refused: %v", vs)
				}
				return
			}
			if len(vs) == 0 {
				t.Fatalf("forbidden edge passed; want %s", c.wantRule)
			}
			for _, v := range vs {
				if v.Rule == c.wantRule && v.Pkg == c.pkg {
					return
				}
			}
			t.Fatalf("got %v, want rule %s for %s", vs, c.wantRule, c.pkg)
		})
	}
}

// A rule naming a package the module no longer has is reported, so a move
// cannot leave an allow list pointing at nothing.
func TestStaleRule(t *testing.T) {
	var pkgs []Package
	for _, p := range baseline() {
		if p.Path != "internal/childproc" {
			pkgs = append(pkgs, p)
		}
	}
	vs := Check(pkgs)
	if len(vs) != 1 || vs[0].Rule != "stale-rule" || vs[0].Pkg != "internal/childproc" {
		t.Fatalf("got %v, want one stale-rule for internal/childproc", vs)
	}
}

// A test-support folder with no package below it is reported too.
func TestStaleSupportRoot(t *testing.T) {
	var pkgs []Package
	for _, p := range baseline() {
		if !within(p.Path, []string{"test/cmd"}) {
			pkgs = append(pkgs, p)
		}
	}
	for _, v := range Check(pkgs) {
		if v.Rule == "stale-rule" && v.Pkg == "test/cmd" {
			return
		}
	}
	t.Fatal("no stale-rule for test/cmd, which has no package left")
}
