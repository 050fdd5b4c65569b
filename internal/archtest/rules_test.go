package archtest

import (
	"testing"
)

// baseline is a small module that keeps every rule: each case below adds
// one edge to it.
func baseline() []Package {
	var pkgs []Package
	for _, n := range append(append(append(append(keys(cueImporters), keys(execImporters)...), TestSupport...), testOnly...), append(launchSide, notOnLaunchSide...)...) {
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
	tests := func(imps ...string) func(*Package) {
		return func(p *Package) { p.TestImports = append(p.TestImports, imps...) }
	}
	cases := []struct {
		name     string
		pkg      string
		edit     func(*Package)
		wantRule string // "" means allowed; else one of the violations
	}{
		{"schema imports CUE", "schema", imports("cuelang.org/go/cue"), ""},
		{"schema's tests import CUE", "schema", tests("cuelang.org/go/cue/cuecontext"), ""},
		{"compiler's benchmark imports CUE", "compiler", tests("cuelang.org/go/cue"), ""},
		{"compiler imports CUE", "compiler", imports("cuelang.org/go/cue"), "cue-only-in-schema"},
		{"launcher imports CUE", "launcher", imports("cuelang.org/go/cue"), "cue-only-in-schema"},
		{"cmd/paseo-policy imports the CUE module root", "cmd/paseo-policy", imports("cuelang.org/go"), "cue-only-in-schema"},
		{"launcher's tests import CUE", "launcher", tests("cuelang.org/go/cue"), "cue-only-in-schema"},
		{"launcher execs", "launcher", imports("os/exec"), ""},
		{"the holder package spawns holders", "supervisor/holder", imports("os/exec"), ""},
		{"supervisor execs (its holder spawn lives in supervisor/holder)", "supervisor", imports("os/exec"), "exec-allowlist"},
		{"a launcher subpackage execs", "launcher/preflight", imports("os/exec"), "exec-allowlist"},
		{"compiler execs", "compiler", imports("os/exec"), "exec-allowlist"},
		{"bridge execs", "bridge", imports("os/exec"), "exec-allowlist"},
		{"bridge's tests exec", "bridge", tests("os/exec"), ""},
		{"launcher links a test world", "launcher", deps("internal/testnet"), "no-test-support-in-product"},
		{"cli links the fake model transitively", "cli", deps("internal/fakemodel"), "no-test-support-in-product"},
		{"supervisor links the probe", "supervisor", deps("probe"), "no-test-support-in-product"},
		{"launcher's tests use a test bundle", "launcher", tests("internal/testbundle"), ""},
		{"acceptance links the probe", "acceptance", deps("probe"), ""},
		{"test support links test support", "internal/testbundle", deps("internal/testtree"), ""},
		{"the demo runs the fake model and a test world", "cmd/paseo-demo", deps("internal/fakemodel", "internal/testnet"), ""},
		{"the CLI links the demo", "cmd/paseo-policy", deps("cmd/paseo-demo"), "no-test-support-in-product"},
		{"launcher depends on compiler", "launcher", deps("compiler"), "launch-reads-output-only"},
		{"sandboxnet depends on schema", "launcher/sandboxnet", deps("schema"), "launch-reads-output-only"},
		{"execution depends on CUE transitively", "execution", deps("cuelang.org/go/cue"), "launch-reads-output-only"},
		{"launcher depends on pathsafe", "launcher", deps("compiler/pathsafe"), ""},
		{"supervisor compiles", "supervisor", deps("compiler", "schema"), ""},
		{"the holder depends on compiler", "supervisor/holder", deps("compiler"), "launch-reads-output-only"},
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
