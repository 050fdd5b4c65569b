package launcher

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/compiler"
	"paseo.dev/paseo-policy/internal/testnet"
	"paseo.dev/paseo-policy/internal/testtree"
	"paseo.dev/paseo-policy/launcher/sandboxnet"
	"paseo.dev/paseo-policy/profiles"
	"paseo.dev/paseo-policy/schema"
)

// These tests run real bundles under the pinned runsc as root, in a
// busybox rootfs: they need root, bin/runsc (make runsc) and a static
// busybox (Debian's busybox-static). Missing prerequisites fail the test.

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func prerequisites(t *testing.T) (runscPath string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("launcher tests run runsc and need root; run them as root (CI does)")
	}
	runscPath = repoFile(t, "bin/runsc")
	if _, err := os.Stat(runscPath); err != nil {
		t.Fatalf("pinned runsc missing at %s: run `make runsc` (%v)", runscPath, err)
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatal("static busybox missing at /bin/busybox: apt-get install busybox-static")
	}
	return runscPath
}

type sandbox struct {
	host   string // stands for / on the host side: every fact path lives under it
	bundle string
	state  string
	runsc  string
	// Sandbox mode: the test world's uplink and its name resolution.
	uplink    string
	resolve   sandboxnet.Resolver
	onNetwork func(*sandboxnet.Network)
}

// compileScript compiles the reference facts with every path moved under a
// fresh temp dir and the pi-session argv replaced by a busybox shell script;
// everything else (mounts, env, limits, checks) is the real profile.
func compileScript(t *testing.T, script string, registryPatch string) *sandbox {
	t.Helper()
	s := &sandbox{runsc: prerequisites(t)}
	tmp := t.TempDir()
	s.host, s.bundle, s.state = filepath.Join(tmp, "host"), filepath.Join(tmp, "bundle"), filepath.Join(tmp, "state")

	rootfs := filepath.Join(tmp, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc", "home/sandbox"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}

	prefix := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(`"/srv/`), []byte(`"`+s.host+`/srv/`)) }
	facts := prefix(readRepo(t, "testdata/base/facts.json"))
	reg := prefix(readRepo(t, "testdata/base/registry.json"))
	reg, err = testtree.MergePatch(reg, []byte(`{"image":{"rootfs":"`+rootfs+`"},"network":{"mode":"none"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if registryPatch != "" {
		if reg, err = testtree.MergePatch(reg, []byte(registryPatch)); err != nil {
			t.Fatal(err)
		}
	}
	tree := strings.ReplaceAll(string(readRepo(t, "testdata/base/tree.txt")), " /srv/", " "+strings.TrimPrefix(s.host, "/")+"/srv/")
	tree = strings.ReplaceAll(tree, " "+strings.TrimPrefix(s.host, "/"), " /"+strings.TrimPrefix(s.host, "/"))
	cleanup, err := testtree.Build("/", tree)
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	// The workspace belongs to the sandbox user, as Paseo's does to the daemon user.
	if err := os.Chown(filepath.Join(s.host, "srv/paseo/workspace/proj-feature"), 1000, 1000); err != nil {
		t.Fatal(err)
	}

	prof := string(mustProfile(t))
	i := strings.Index(prof, "argv: [")
	j := strings.Index(prof[i:], "]\n") + i + 2
	quoted, _ := jsonString(script)
	prof = prof[:i] + `argv: [{lit: "/bin/busybox"}, {lit: "sh"}, {lit: "-c"}, {lit: ` + quoted + `}]` + "\n" + prof[j:]
	profs := fstest.MapFS{"pi-session.cue": {Data: []byte(prof)}}

	res, diags := compiler.Compile(compiler.Inputs{
		Facts:    schema.Input{Name: "facts.json", Data: facts},
		Registry: schema.Input{Name: "registry.json", Data: reg},
	}, compiler.Options{Profiles: profs})
	if len(diags) > 0 {
		t.Fatalf("compile: %v", diags)
	}
	if err := res.Files.Write(s.bundle); err != nil {
		t.Fatal(err)
	}
	return s
}

func readRepo(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustProfile(t *testing.T) []byte {
	b, err := profiles.FS.ReadFile("pi-session.cue")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonString(s string) (string, error) {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String(), nil
}

func (s *sandbox) launch(t *testing.T, secrets SecretSource) (Result, string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := Launch(context.Background(), Options{
		BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: secrets, Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Uplink: s.uplink, Resolve: s.resolve, OnNetwork: s.onNetwork,
	})
	return res, out.String(), errb.String(), err
}

func staticSecret(v string) SecretSource {
	return func(ref string) ([]byte, error) {
		if ref != "alice/fake-llm" {
			return nil, errors.New("unknown secret " + ref)
		}
		return []byte(v), nil
	}
}

// The agent runs in gVisor as the sandbox user with no capabilities, sees
// the injected secret while the bundle keeps the placeholder, writes the
// workspace, and cannot see host paths it was not granted.
func TestLaunchEnforcesBundle(t *testing.T) {
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host-secret-canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -u
/bin/busybox dmesg | /bin/busybox grep -q gVisor && echo gvisor=yes
echo uid=$(/bin/busybox id -u) gid=$(/bin/busybox id -g)
/bin/busybox grep CapEff /proc/self/status
echo key=$FAKE_LLM_KEY
echo written > "$PASEO_AGENT_CWD/out.txt" && echo write=ok
/bin/busybox cat ` + canary + ` 2>/dev/null && echo canary=visible || echo canary=hidden
/bin/busybox touch /bin/evil 2>/dev/null && echo rootfs=writable || echo rootfs=readonly
/bin/busybox ls /srv/paseo 2>/dev/null; true
exit 7`
	s := compileScript(t, script, "")
	res, out, stderr, err := s.launch(t, staticSecret("s3cr3t-value"))
	if err != nil {
		t.Fatalf("launch: %v\nstderr: %s", err, stderr)
	}
	for _, want := range []string{"gvisor=yes", "uid=1000 gid=1000", "CapEff:\t0000000000000000", "key=s3cr3t-value", "write=ok", "canary=hidden", "rootfs=readonly"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr: %s", want, out, stderr)
		}
	}
	if res.ExitCode != 7 {
		t.Errorf("exit code %d, want 7 (the agent's own)", res.ExitCode)
	}
	data, err := os.ReadFile(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/out.txt"))
	if err != nil || string(data) != "written\n" {
		t.Errorf("workspace write not visible on the host: %q %v", data, err)
	}
	cfg, _ := os.ReadFile(filepath.Join(s.bundle, bundle.ConfigFile))
	if bytes.Contains(cfg, []byte("s3cr3t-value")) || !bytes.Contains(cfg, []byte("@@paseo-secret:alice/fake-llm@@")) {
		t.Error("the reviewed bundle was modified with the secret")
	}
	s.assertClean(t)
}

// assertClean checks teardown left no container, run dir or mount.
func (s *sandbox) assertClean(t *testing.T) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(s.state, "run"))
	if len(entries) > 0 {
		t.Errorf("run dirs left behind: %v", entries)
	}
	out, err := exec.Command(s.runsc, "--root", filepath.Join(s.state, "runsc"), "list", "-quiet").CombinedOutput()
	if err != nil {
		t.Errorf("runsc list: %v: %s", err, out)
	}
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("containers left behind: %s", out)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), s.state) {
		t.Errorf("mounts left under %s", s.state)
	}
	for _, dir := range []string{"net/netns", "net/leases"} {
		if entries, _ := os.ReadDir(filepath.Join(s.state, dir)); len(entries) > 0 {
			t.Errorf("%s left behind: %v", dir, entries)
		}
	}
}

// A missing secret, a tampered bundle and an unenforced network mode all
// refuse to start anything.
func TestLaunchFailsClosed(t *testing.T) {
	script := "echo started > $PASEO_AGENT_CWD/started"
	t.Run("missing secret", func(t *testing.T) {
		s := compileScript(t, script, "")
		_, _, _, err := s.launch(t, nil)
		wantUnavailable(t, err, "secret alice/fake-llm")
		s.assertNotStarted(t)
	})
	t.Run("tampered bundle", func(t *testing.T) {
		s := compileScript(t, script, "")
		p := filepath.Join(s.bundle, bundle.EgressFile)
		data, _ := os.ReadFile(p)
		if err := os.WriteFile(p, bytes.Replace(data, []byte(`"deny"`), []byte(`"allow"`), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailable(t, err, "digest")
		s.assertNotStarted(t)
	})
	t.Run("swapped workspace", func(t *testing.T) {
		s := compileScript(t, script, "")
		ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
		if err := os.Rename(ws, ws+".orig"); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(ws, 0o777); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailable(t, err, "pin")
		s.assertNotStarted(t)
	})
	t.Run("egress name that cannot be resolved", func(t *testing.T) {
		s := compileScript(t, script, `{"network":{"mode":"sandbox"}}`)
		s.uplink = testnet.New(t).Uplink
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailable(t, err, "resolving egress host")
		s.assertNotStarted(t)
	})
}

func (s *sandbox) assertNotStarted(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/started")); err == nil {
		t.Error("the agent ran although the launch was refused")
	}
	s.assertClean(t)
}

func wantUnavailable(t *testing.T, err error, substr string) {
	t.Helper()
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want sandbox-unavailable", err)
	}
	if !strings.Contains(strings.ToLower(ue.Reason), substr) {
		t.Errorf("reason %q does not mention %q", ue.Reason, substr)
	}
	if strings.Contains(ue.Error(), "s3cr3t") {
		t.Error("error mentions a secret value")
	}
}

// Wall time ends the sandbox and teardown still leaves nothing behind.
func TestLaunchWallTime(t *testing.T) {
	s := compileScript(t, "echo begin; /bin/busybox sleep 60; echo end", `{"limits":{"wallSeconds":2}}`)
	res, out, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	if res.Reason != "wall time exceeded" || strings.Contains(out, "end") || !strings.Contains(out, "begin") {
		t.Errorf("reason %q output %q", res.Reason, out)
	}
	if res.ExitCode == 0 {
		t.Error("a killed sandbox reported exit 0")
	}
	s.assertClean(t)
}

// Output past outputBytes ends the sandbox.
func TestLaunchOutputLimit(t *testing.T) {
	s := compileScript(t, "while true; do echo 0123456789abcdef0123456789abcdef; done", `{"limits":{"outputBytes":65536}}`)
	res, out, _, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != "output limit exceeded" || len(out) > 65536 {
		t.Errorf("reason %q, %d bytes passed", res.Reason, len(out))
	}
	s.assertClean(t)
}
