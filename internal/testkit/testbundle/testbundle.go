// Package testbundle compiles the reference facts into a real bundle for
// tests that run it under runsc: every fact path is moved beneath a fresh
// temporary "host" directory, the image is a small rootfs with a static
// busybox (plus any files the test adds), and the pi-session profile's argv
// is replaced by the test's own program. Everything else (mounts, env,
// limits, network, checks) is the real profile and the real compiler.
package testbundle

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/profiles"
	"paseo.dev/paseo-policy/policy/schema"
)

// Scene is one compiled bundle and the host tree it refers to.
type Scene struct {
	// Host stands for / on the host side: every fact path lives under it.
	Host   string
	Bundle string
	State  string
	Rootfs string
	Runsc  string
	// Facts and Registry are the inputs the bundle was compiled from (for
	// tests that compile again, such as the supervisor's).
	Facts, Registry []byte
}

// Workspace is the host path of the reference workspace.
func (s *Scene) Workspace() string { return filepath.Join(s.Host, "srv/paseo/workspace/proj-feature") }

// Options shape the scene.
type Options struct {
	// Host is the directory that stands for /; empty means a fresh one.
	// Give it when argv must name host paths before the scene exists.
	Host string
	// Argv replaces the profile's argv, as literal words; "slot:NAME" is
	// the profile slot NAME (e.g. "slot:mcp-config"), filled from the facts.
	Argv []string
	// RegistryPatch and FactsPatch are JSON merge patches (RFC 7396)
	// applied after the paths are moved; host paths in them must already
	// be absolute (use Scene.Host via a two-step build if needed).
	RegistryPatch string
	FactsPatch    string
	// RootfsFiles copies host files into the rootfs: rootfs path -> host path.
	RootfsFiles map[string]string
	// Rootfs, when set, is an existing image to run instead of the busybox
	// rootfs (the real Pi image); RootfsFiles is then ignored.
	Rootfs string
	// Profile is the embedded profile compiled (default pi-session); with
	// no Argv it is used exactly as reviewed.
	Profile string
	// Prepare, when set, changes the host tree (rooted at host) after it
	// is built and before the compile, which sees what it leaves.
	Prepare func(t testing.TB, host string)
}

// Repo returns the absolute path of a file in the repository.
func Repo(t testing.TB, rel string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", rel)
}

// Prerequisites skips the test without root (skip.UnlessRoot) and fails
// it, saying what is missing, without the pinned runsc and a static
// busybox; it returns runsc's path.
func Prerequisites(t testing.TB) string {
	t.Helper()
	skip.UnlessRoot(t, "it runs runsc")
	runsc := Repo(t, "bin/runsc")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("pinned runsc missing at %s: run `make runsc` (%v)", runsc, err)
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatal("static busybox missing at /bin/busybox: apt-get install busybox-static")
	}
	return runsc
}

// New builds the host tree, the rootfs and the bundle.
func New(t testing.TB, o Options) *Scene {
	t.Helper()
	s := &Scene{Runsc: Prerequisites(t)}
	tmp := t.TempDir()
	s.Host, s.Bundle, s.State, s.Rootfs = filepath.Join(tmp, "host"), filepath.Join(tmp, "bundle"), filepath.Join(tmp, "state"), filepath.Join(tmp, "rootfs")
	if o.Host != "" {
		s.Host = o.Host
	}

	files := map[string]string{"/bin/busybox": "/bin/busybox"}
	for k, v := range o.RootfsFiles {
		files[k] = v
	}
	if o.Rootfs != "" {
		s.Rootfs, files = o.Rootfs, nil
	} else {
		for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc", "home/sandbox"} {
			mkdir(t, filepath.Join(s.Rootfs, d))
		}
		// The shipped profiles start Pi through /bin/sh, which seeds the
		// jiti cache and the Git dir with these tools
		// (policy/profiles/pi-session.cue).
		for _, applet := range []string{"sh", "rm", "cp"} {
			if err := os.Symlink("busybox", filepath.Join(s.Rootfs, "bin", applet)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for dst, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		mkdir(t, filepath.Dir(filepath.Join(s.Rootfs, dst)))
		if err := os.WriteFile(filepath.Join(s.Rootfs, dst), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	prefix := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(`"/srv/`), []byte(`"`+s.Host+`/srv/`)) }
	prefixHome := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(`"/home/`), []byte(`"`+s.Host+`/home/`)) }
	facts := prefix(read(t, "testdata/base/facts.json"))
	reg := prefixHome(prefix(read(t, "testdata/base/registry.json")))
	reg = patch(t, reg, `{"image":{"rootfs":"`+s.Rootfs+`"},"network":{"mode":"none"}}`)
	if o.RegistryPatch != "" {
		reg = patch(t, reg, o.RegistryPatch)
	}
	if o.FactsPatch != "" {
		facts = patch(t, facts, o.FactsPatch)
	}
	hostRel := strings.TrimPrefix(s.Host, "/")
	tree := strings.ReplaceAll(string(read(t, "testdata/base/tree.txt")), " /srv/", " "+hostRel+"/srv/")
	tree = strings.ReplaceAll(tree, " /home/", " "+hostRel+"/home/")
	tree = strings.ReplaceAll(tree, " "+hostRel, " /"+hostRel)
	cleanup, err := testtree.Build("/", tree)
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	// The workspace belongs to the sandbox user, as Paseo's does to the daemon user.
	if err := os.Chown(s.Workspace(), 1000, 1000); err != nil {
		t.Fatal(err)
	}

	if o.Prepare != nil {
		o.Prepare(t, s.Host)
	}

	name := o.Profile
	if name == "" {
		name = "pi-session"
	}
	var profFS fs.FS // nil: the embedded, reviewed profiles
	if o.Argv != nil {
		prof, err := profiles.FS.ReadFile(name + ".cue")
		if err != nil {
			t.Fatal(err)
		}
		p := string(prof)
		i := strings.Index(p, "argv: [")
		j := strings.Index(p[i:], "]\n") + i + 2
		var words []string
		for _, w := range o.Argv {
			if slot, ok := strings.CutPrefix(w, "slot:"); ok {
				q, _ := json.Marshal(slot)
				words = append(words, `{slot: `+string(q)+`}`)
				continue
			}
			q, _ := json.Marshal(w)
			words = append(words, `{lit: `+string(q)+`}`)
		}
		p = p[:i] + "argv: [" + strings.Join(words, ", ") + "]\n" + p[j:]
		profFS = fstest.MapFS{name + ".cue": {Data: []byte(p)}}
	}
	if name != "pi-session" {
		facts = patch(t, facts, `{"agent":{"profile":"`+name+`"}}`)
	}

	res, diags := compiler.Compile(compiler.Inputs{
		Facts:    schema.Input{Name: "facts.json", Data: facts},
		Registry: schema.Input{Name: "registry.json", Data: reg},
	}, compiler.Options{Profiles: profFS})
	if len(diags) > 0 {
		t.Fatalf("compile: %v", diags)
	}
	s.Facts, s.Registry = facts, reg
	if err := res.Files.Write(s.Bundle); err != nil {
		t.Fatal(err)
	}
	return s
}

// Script is the argv that runs a busybox shell script.
func Script(script string) []string { return []string{"/bin/busybox", "sh", "-c", script} }

func mkdir(t testing.TB, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func read(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(Repo(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func patch(t testing.TB, doc []byte, p string) []byte {
	t.Helper()
	out, err := testtree.MergePatch(doc, []byte(p))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	builtMu sync.Mutex
	built   = map[string]string{}
)

// BuildStatic builds the repository's package pkg (e.g. "./test/cmd/fake-pi")
// as a static binary, once per test process, and returns its path.
func BuildStatic(t testing.TB, pkg string) string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "paseo-static-")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = Repo(t, "")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}
