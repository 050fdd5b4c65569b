package launchplan

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/ocicheck"
)

// copyGolden writes a golden bundle into a fresh directory and applies
// edit to its files first.
func copyGolden(t *testing.T, name string, edit func(bundle.Files)) string {
	t.Helper()
	files, err := bundle.Read(testbundle.Repo(t, "testdata/"+name+"/golden"))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(files)
	}
	dir := t.TempDir()
	if err := files.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Load opens every bundle file exactly once, whoever in the process might
// open it: inotify counts the opens the kernel sees.
func TestLoadOpensEachFileOnce(t *testing.T) {
	dir := copyGolden(t, "host-pi-session-api-key", nil)
	stop := testbundle.WatchOpens(t, dir)
	p, err := Load(dir)
	opens := stop()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verdict.Err(); err != nil {
		t.Fatalf("the golden bundle has findings: %v", err)
	}
	want := map[string]int{}
	for name := range p.Files {
		want[name] = 1
	}
	if want[bundle.ConfigFile] != 1 {
		t.Fatalf("plan lacks %s: %v", bundle.ConfigFile, p.Files.Names())
	}
	if diff := cmp.Diff(want, opens); diff != "" {
		t.Errorf("opens per bundle file (-want +got):\n%s", diff)
	}
	if p.Spec == nil || p.Egress == nil || p.Manifest == nil || p.Pins == nil {
		t.Fatalf("plan lacks a decoded document: %+v", p)
	}
	// Each digest is of the file on disk, read here on its own: not the
	// plan's bytes digested again.
	for name := range want {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(data); p.Digests[name] != "sha256:"+hex.EncodeToString(sum[:]) {
			t.Errorf("digest of %s: %s", name, p.Digests[name])
		}
	}
	if got := RunscFlags("/r", p.Network); !slices.Equal(got, []string{"--root", "/r", "--network=sandbox", "--directfs=false"}) {
		t.Errorf("runsc flags %v", got)
	}
}

// The plan's verdict is ocicheck's on the same bytes: validate, doctor and
// a launch report one set of findings under one set of check names.
func TestVerdictIsTheValidators(t *testing.T) {
	for name, edit := range map[string]func(bundle.Files){
		"intact": nil,
		"hook": func(f bundle.Files) {
			f[bundle.ConfigFile] = []byte(strings.Replace(string(f[bundle.ConfigFile]), `"root": {`, `"hooks": {"prestart": [{"path": "/bin/sh"}]}, "root": {`, 1))
		},
		"rw-root": func(f bundle.Files) {
			f[bundle.ConfigFile] = []byte(strings.Replace(string(f[bundle.ConfigFile]), `"readonly": true`, `"readonly": false`, 1))
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := copyGolden(t, "host-pi-session-api-key", edit)
			p, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ocicheck.Dir(dir, ocicheck.Options{})
			if err != nil {
				t.Fatal(err)
			}
			// A finding's Err is its reason as a value, made afresh by each
			// check: the same reason is the same text.
			sameReason := cmp.Comparer(func(a, b error) bool {
				return (a == nil) == (b == nil) && (a == nil || a.Error() == b.Error())
			})
			if diff := cmp.Diff(want, p.Verdict, sameReason); diff != "" {
				t.Errorf("verdict (-validate +plan):\n%s", diff)
			}
			if (p.Verdict.Err() == nil) != (edit == nil) {
				t.Errorf("Err %v for %s", p.Verdict.Err(), name)
			}
		})
	}
}

// A bundle file that is a symlink, or not a regular file, is refused at
// the read: the plan is made of the files in the bundle dir, nothing
// they point at.
func TestLoadRefusesLinksAndSpecialFiles(t *testing.T) {
	dir := copyGolden(t, "host-pi-session-api-key", nil)
	outside := filepath.Join(t.TempDir(), "egress.json")
	data, _ := os.ReadFile(filepath.Join(dir, bundle.EgressFile))
	if err := os.WriteFile(outside, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, bundle.EgressFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, bundle.EgressFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("a symlinked egress.json: %v, want ELOOP", err)
	}
	if err := os.Remove(filepath.Join(dir, bundle.EgressFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, bundle.EgressFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a directory for egress.json: %v", err)
	}
	// A file past the bound is refused, not held in memory; one at the
	// bound is read (and then judged by the validator).
	if err := os.Remove(filepath.Join(dir, bundle.EgressFile)); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{bundle.MaxFileBytes, bundle.MaxFileBytes + 1} {
		if err := os.WriteFile(filepath.Join(dir, bundle.EgressFile), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if tooBig := err != nil && strings.Contains(err.Error(), "larger than"); tooBig != (size > bundle.MaxFileBytes) {
			t.Fatalf("an egress.json of %d bytes: %v", size, err)
		}
	}
}

// BenchmarkLoad is what a launch spends on its plan before preflight's
// host checks: the read, and the validator on the bytes read.
func BenchmarkLoad(b *testing.B) {
	dir := testbundle.Repo(b, "testdata/host-pi-session-api-key/golden")
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			if _, err := bundle.Read(dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	files, err := bundle.Read(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("judge", func(b *testing.B) {
		for b.Loop() {
			FromFiles(dir, files)
		}
	})
	b.Run("validator", func(b *testing.B) {
		for b.Loop() {
			ocicheck.Files(files, dir, ocicheck.Options{})
		}
	})
}

// The limits come from the typed grants as they are (grants of other kinds
// are not limits, whatever their numbers) and the memory limit from the
// spec runsc applies.
func TestLimitsAreTyped(t *testing.T) {
	limit := int64(1 << 30)
	d := ocicheck.Decoded{
		Manifest: &bundle.Manifest{Grants: grant.List{
			grant.Rlimit{Type: "RLIMIT_NOFILE", Max: 7},
			grant.WallLimit{Wall: 90 * time.Second},
			grant.OutputLimit{Bytes: 4096},
			grant.CgroupMax{Resource: "pids", Max: 9},
		}},
		Spec: &rspec.Spec{Linux: &rspec.Linux{Resources: &rspec.LinuxResources{Memory: &rspec.LinuxMemory{Limit: &limit}}}},
	}
	if got, want := limitsOf(d), (Limits{Wall: 90 * time.Second, Output: 4096, Memory: 1 << 30}); got != want {
		t.Errorf("limits = %+v, want %+v", got, want)
	}
	if none := limitsOf(ocicheck.Decoded{}); none != (Limits{}) {
		t.Errorf("no documents: %+v", none)
	}
}

// A plan of a golden bundle carries what a launch needs, read from its
// documents once: the network mode, the routes, the limits.
func TestPlanCarriesTheLaunchInputs(t *testing.T) {
	p, err := Load(copyGolden(t, "host-pi-session-api-key", nil))
	if err != nil {
		t.Fatal(err)
	}
	if p.Network != p.Egress.Mode || p.Network != "sandbox" {
		t.Errorf("network %q, egress.json's %q", p.Network, p.Egress.Mode)
	}
	if diff := cmp.Diff(p.Egress.Routes, p.Routes); diff != "" || len(p.Routes) == 0 {
		t.Errorf("routes (-egress.json +plan):\n%s", diff)
	}
	if want := *p.Spec.Linux.Resources.Memory.Limit; p.Limits.Memory != want || p.Limits.Wall <= 0 || p.Limits.Output <= 0 {
		t.Errorf("limits %+v, want the grants' wall and output and the spec's memory %d", p.Limits, want)
	}
}
