package launcher

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/mounts"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// Bind staging (binds.go) against the pinned runsc. The workspace is the
// source an attacker swaps: its parent is the daemon's, the swap a rename.

// swapForSymlink renames path away and puts a symlink to target in its
// place, as an attacker with rename rights in the parent would; the
// returned func puts the original back.
func swapForSymlink(t *testing.T, path, target string) func() {
	t.Helper()
	if err := os.Rename(path, path+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".real", path); err != nil {
			t.Fatal(err)
		}
	}
}

// outsideDir is a host directory beneath no root, holding a marker file.
func outsideDir(t *testing.T, marker string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "outside")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeMarker(t *testing.T, dir, marker string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// bareRunsc runs a materialized, staged run dir under runsc directly, with
// edit applied to its config.json first, and returns the agent's stdout.
func bareRunsc(t *testing.T, s *sandbox, edit func(*rspec.Spec), swap func()) string {
	t.Helper()
	out, stderr, err := bareRunscErr(t, s, edit, swap)
	if err != nil {
		t.Fatalf("runsc run: %v\nstderr: %s", err, stderr)
	}
	return out
}

// bareRunscErr is bareRunsc for a run that may fail: runsc's error and
// stderr are returned, not fatal.
func bareRunscErr(t *testing.T, s *sandbox, edit func(*rspec.Spec), swap func()) (string, string, error) {
	t.Helper()
	plan, err := launchplan.Load(s.bundle)
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	rs := &runsc.Runner{Path: s.runsc, Root: statedir.RunscRoot(s.state), Network: "none"}
	if err := os.MkdirAll(rs.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	run, err := newRunDir(s.state, id)
	if err != nil {
		t.Fatal(err)
	}
	defer run.remove()
	spec, err := run.materialize(plan)
	if err != nil {
		t.Fatal(err)
	}
	staged, err := run.stageBinds(plan)
	if err != nil {
		t.Fatal(err)
	}
	// The edit sees the run copy as the launcher would write it, staged
	// binds and private root included.
	if err := run.writeSpec(spec, runtimeState{cgroupsPath: statedir.CgroupsPath(id), privateRoot: true, binds: staged}); err != nil {
		t.Fatal(err)
	}
	edit(spec)
	data, _ := bundle.Marshal(spec)
	if err := os.WriteFile(filepath.Join(run.dir, bundle.ConfigFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	swap()
	defer rs.Delete(id)
	cmd := rs.Command(id, run.dir)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(""), &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// What staging relies on in the pinned runsc, so that an upgrade that
// changes it fails here: (a) a mount source named by host path is resolved
// by runsc itself and a symlink there is followed, which is why the launcher
// never hands runsc a host path (the control); (b) a source that is a bind
// mount in the run dir is what the sandbox sees, even when the original
// path is swapped for a symlink to another directory after staging.
func TestRunscMountSourceBehaviour(t *testing.T) {
	s := compileScript(t, "cat $PASEO_AGENT_CWD/marker", "")
	ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	writeMarker(t, ws, "pinned")
	outside := outsideDir(t, "outside")
	t.Run("host path: runsc follows a symlink", func(t *testing.T) {
		var restore func()
		out := bareRunsc(t, s, func(spec *rspec.Spec) {
			for i, m := range spec.Mounts {
				if m.Destination == ws {
					spec.Mounts[i].Source = ws // the old, path-based flow
				}
			}
		}, func() { restore = swapForSymlink(t, ws, outside) })
		restore()
		if strings.TrimSpace(out) != "outside" {
			t.Fatalf("runsc given a host path that became a symlink showed %q, want the link target's marker: "+
				"if runsc stopped following links here, staging is still right but this control needs a new attack", out)
		}
	})
	t.Run("staged bind: the pinned object", func(t *testing.T) {
		var restore func()
		out := bareRunsc(t, s, func(*rspec.Spec) {}, func() { restore = swapForSymlink(t, ws, outside) })
		restore()
		if strings.TrimSpace(out) != "pinned" {
			t.Fatalf("runsc given the staged bind showed %q, want the pinned workspace's marker", out)
		}
	})
	s.assertClean(t)
}

func (s *sandbox) launchStaged(t *testing.T, hook func(runDir string)) (Result, string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := Launch(context.Background(), Options{
		BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		afterStaging: hook,
	})
	return res, out.String(), errb.String(), err
}

// A swap after staging changes nothing: the sandbox works in the pinned
// workspace (reads its marker, writes into it), and the file bind (the
// extension) is staged as a read-only, nosuid, nodev file mount.
func TestStagedBindsSurviveSwap(t *testing.T) {
	// The extension's sandbox path is its host path: <host>/srv/paseo/launch/….
	s := compileScript(t, `cat $PASEO_AGENT_CWD/marker; cat "${PASEO_AGENT_CWD%/srv/paseo/*}/srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"; `+
		`echo w > $PASEO_AGENT_CWD/written`, "")
	ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	ext := filepath.Join(s.host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs")
	writeMarker(t, ws, "pinned")
	if err := os.WriteFile(ext, []byte("extension\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ext, 0o644); err != nil { // the test tree makes files 0600
		t.Fatal(err)
	}
	outside := outsideDir(t, "outside")
	reviewed := mustReadFile(t, filepath.Join(s.bundle, bundle.ConfigFile))
	pins, err := bundle.Files{bundle.PinsFile: mustReadFile(t, filepath.Join(s.bundle, bundle.PinsFile)),
		bundle.ManifestFile: mustReadFile(t, filepath.Join(s.bundle, bundle.ManifestFile))}.Pins()
	if err != nil {
		t.Fatal(err)
	}
	var restore func()
	res, out, stderr, err := s.launchStaged(t, func(run string) {
		staged := mounts.Beneath(filepath.Join(run, "binds"))
		if len(staged) != len(pins.Pins) {
			t.Errorf("%d staged mounts for %d pins: %v", len(staged), len(pins.Pins), staged)
		}
		files := 0
		for _, line := range strings.Split(string(mustReadFile(t, "/proc/self/mountinfo")), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || !strings.HasPrefix(f[4], run+"/binds/") {
				continue
			}
			if !strings.Contains(f[5], "nosuid") || !strings.Contains(f[5], "nodev") {
				t.Errorf("staged mount %s has options %s, want nosuid and nodev", f[4], f[5])
			}
			if fi, err := os.Stat(f[4]); err == nil && fi.Mode().IsRegular() {
				files++
				if !strings.HasPrefix(f[5], "ro") {
					t.Errorf("staged file %s (a read-only grant: the extension, the daemon's agent files, the repository's config) is mounted %s", f[4], f[5])
				}
			}
		}
		filePins := 0
		for _, p := range pins.Pins {
			if p.Kind == "file" {
				filePins++
			}
		}
		if files == 0 || files != filePins {
			t.Errorf("%d staged file binds for %d file pins (the extension at least)", files, filePins)
		}
		restore = swapForSymlink(t, ws, outside)
	})
	if restore != nil {
		restore()
	}
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v (exit %d)\nstdout: %s\nstderr: %s", err, res.ExitCode, out, stderr)
	}
	if !strings.HasPrefix(out, "pinned\nextension\n") {
		t.Errorf("the sandbox saw %q, want the pinned workspace's marker and the extension\nstderr: %s", out, stderr)
	}
	if _, err := os.Stat(filepath.Join(ws, "written")); err != nil {
		t.Errorf("the sandbox's write did not land in the pinned workspace: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "written")); err == nil {
		t.Error("the sandbox wrote into the symlink's target")
	}
	if !bytes.Equal(mustReadFile(t, filepath.Join(s.bundle, bundle.ConfigFile)), reviewed) || !bytes.Contains(reviewed, []byte(`"source": "`+ws+`"`)) {
		t.Error("the reviewed config.json changed or no longer names the host source")
	}
	s.assertClean(t)
}

// rewritePins replaces the bundle's pins with edit's result, still naming
// the bundle's manifest, so only the edit is wrong.
func rewritePins(t *testing.T, dir string, edit func([]bundle.Pin) []bundle.Pin) {
	t.Helper()
	files, err := bundle.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := files.Pins()
	if err != nil {
		t.Fatal(err)
	}
	p.Pins = edit(p.Pins)
	data, _ := bundle.Marshal(p)
	if err := os.WriteFile(filepath.Join(dir, bundle.PinsFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every way a bind could reach runsc other than through its own pin is
// refused before anything starts.
func TestBindPinsRefused(t *testing.T) {
	script := "echo started > $PASEO_AGENT_CWD/started"
	t.Run("source swapped for a symlink since compile", func(t *testing.T) {
		s := compileScript(t, script, "")
		ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
		restore := swapForSymlink(t, ws, ws+".real") // even to the pinned object itself
		defer restore()
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailableIs(t, err, diag.PathSymlink)
		wantReasonNames(t, err, strings.ToLower("pin "+ws)) // names the pin
		s.assertNotStarted(t)
	})
	t.Run("root swapped for a symlink", func(t *testing.T) {
		s := compileScript(t, script, "")
		root := filepath.Join(s.host, "srv/paseo/launch")
		restore := swapForSymlink(t, root, root+".real")
		defer restore()
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailableIs(t, err, diag.PathSymlink)
		wantReasonNames(t, err, strings.ToLower("root "+root)) // names the root
		s.assertNotStarted(t)
	})
	t.Run("unpinned bind", func(t *testing.T) {
		s := compileScript(t, script, "")
		rewritePins(t, s.bundle, func(ps []bundle.Pin) []bundle.Pin {
			var out []bundle.Pin
			for _, p := range ps {
				if !strings.HasSuffix(p.Source, "/proj-feature") {
					out = append(out, p)
				}
			}
			return out
		})
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailableIs(t, err, diag.PreflightBundlePins, bundle.ErrPinsUnpaired)
		s.assertNotStarted(t)
	})
	t.Run("pin moved to another root", func(t *testing.T) {
		s := compileScript(t, script, "")
		rewritePins(t, s.bundle, func(ps []bundle.Pin) []bundle.Pin {
			for i := range ps {
				ps[i].Root = "/"
			}
			return ps
		})
		// From / the path resolves to the same objects: allowed, since the
		// object mounted is still the pinned one, checked on its descriptor.
		res, _, stderr, err := s.launch(t, staticSecret("v"))
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("launch with pins rooted at /: %v\n%s", err, stderr)
		}
	})
	t.Run("pins from another compile", func(t *testing.T) {
		s, other := compileScript(t, script, ""), compileScript(t, script, "")
		data := mustReadFile(t, filepath.Join(other.bundle, bundle.PinsFile))
		if err := os.WriteFile(filepath.Join(s.bundle, bundle.PinsFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailableIs(t, err, diag.PreflightBundleDigests, diag.PreflightBundlePins, bundle.ErrPinsForeign)
		s.assertNotStarted(t)
	})
}

// A run dir whose path mountinfo escapes (a space) is still unmounted
// before it is removed, and what is bound there survives the removal.
func TestRemoveRunDirUnmountsEscapedPaths(t *testing.T) {
	skip.UnlessRoot(t, "it mounts")
	dir := filepath.Join(t.TempDir(), "run dir\twith\\odd names")
	src := t.TempDir()
	writeMarker(t, src, "kept")
	target := filepath.Join(dir, "binds", "0")
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if got := mounts.Beneath(dir); len(got) != 1 || got[0] != target {
		t.Fatalf("mounts beneath %q: %q", dir, got)
	}
	if err := mounts.RemoveDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run dir not removed: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(src, "marker")); err != nil || string(data) != "kept\n" {
		t.Errorf("the bind's source lost its contents: %q %v", data, err)
	}
}
