package launcher

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// These tests run real bundles under the pinned runsc as root, in a
// busybox rootfs (internal/testkit/testbundle): they need root, bin/runsc (make
// runsc) and a static busybox (Debian's busybox-static). Missing
// prerequisites fail the test.

type sandbox struct {
	host   string // stands for / on the host side: every fact path lives under it
	bundle string
	state  string
	runsc  string
	// Sandbox mode: the test world's uplink and its name resolution.
	uplink    string
	resolve   sandboxnet.Resolver
	onNetwork func(*sandboxnet.Network)
	// modelRoots verify the test model's TLS certificate (the model route).
	modelRoots *x509.CertPool
}

// compileScript compiles the reference facts with the pi-session argv
// replaced by a busybox shell script.
func compileScript(t *testing.T, script string, registryPatch string) *sandbox {
	t.Helper()
	return compileScriptFacts(t, script, registryPatch, "")
}

// directModel is the facts patch of a launch without a provider key
// (credential mode none): its model host is a plain egress destination,
// which the network tests use as "the one host the sandbox may reach".
// With a key (api-key), the model is reached only through the model route.
const directModel = `{"credential":{"mode":"none","env":null,"secretRef":null}}`

func compileScriptFacts(t *testing.T, script, registryPatch, factsPatch string) *sandbox {
	t.Helper()
	sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(script), RegistryPatch: registryPatch, FactsPatch: factsPatch})
	return sceneSandbox(sc)
}

// sceneSandbox is the sandbox a compiled test scene launches as.
func sceneSandbox(sc *testbundle.Scene) *sandbox {
	return &sandbox{host: sc.Host, bundle: sc.Bundle, state: sc.State, runsc: sc.Runsc}
}

func (s *sandbox) launch(t *testing.T, secrets SecretSource) (Result, string, string, error) {
	t.Helper()
	var out, errb, log bytes.Buffer
	res, err := Launch(context.Background(), Options{
		BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: secrets, Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Log: &log,
		Uplink: s.uplink, Resolve: s.resolve, ModelRoots: s.modelRoots, OnNetwork: s.onNetwork,
	})
	// Every launch's teardown must be whole, whatever the launch did.
	if len(res.Teardown) > 0 || log.Len() > 0 {
		t.Errorf("teardown failed: %v\nlog: %s", res.Teardown, log.String())
	}
	return res, out.String(), errb.String(), err
}

func staticSecret(v string) SecretSource {
	return func(deployment, ref string) ([]byte, error) {
		if deployment != "host-alice" || ref != "alice/fake-llm" {
			return nil, errors.New("unknown secret " + ref)
		}
		return []byte(v), nil
	}
}

// The agent runs in gVisor as the sandbox user with no capabilities, sees
// only the model route's stand-in for the key (the key never enters the
// sandbox or the bundle), writes the workspace, and cannot see host paths
// it was not granted.
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
	for _, want := range []string{"gvisor=yes", "uid=1000 gid=1000", "CapEff:\t0000000000000000", "key=paseo-model-route", "write=ok", "canary=hidden", "rootfs=readonly"} {
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
	if strings.Contains(out, "s3cr3t-value") {
		t.Error("the key reached the sandbox")
	}
	cfg, _ := os.ReadFile(filepath.Join(s.bundle, bundle.ConfigFile))
	if bytes.Contains(cfg, []byte("s3cr3t-value")) || bytes.Contains(cfg, []byte("@@paseo-secret:")) {
		t.Error("the reviewed bundle holds the key or a slot for it")
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
		// The key is needed by the model route alone, which only a
		// sandbox network has.
		s := compileScript(t, script, `{"network":{"mode":"sandbox"}}`)
		world := testnet.New(t)
		s.uplink = world.Uplink
		_, _, _, err := s.launch(t, nil)
		wantUnavailableIs(t, err, diag.LaunchSecret)
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
		wantUnavailableIs(t, err, diag.PreflightBundleDigests)
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
		wantUnavailableIs(t, err, diag.PathReplaced)
		s.assertNotStarted(t)
	})
	t.Run("egress name that cannot be resolved", func(t *testing.T) {
		s := compileScriptFacts(t, script, `{"network":{"mode":"sandbox"}}`, directModel)
		s.uplink = testnet.New(t).Uplink
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailableIs(t, err, diag.LaunchResolve)
		s.assertNotStarted(t)
	})
	t.Run("subscription login missing", func(t *testing.T) {
		// oauth-broker: the route reads the login from the deployment's
		// auth.json at launch; without the entry nothing starts, and the
		// refusal carries no token of the file's other entries.
		host := filepath.Join(t.TempDir(), "host")
		agent := filepath.Join(host, "srv/paseo/state/pi-agent")
		if err := os.MkdirAll(agent, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(agent, "auth.json"), []byte(`{"other":{"type":"oauth","access":"sk-ant-oat01-s3cr3t","refresh":"s3cr3t","expires":1}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		facts := strings.ReplaceAll(`{"model":{"baseURL":"https://llm.example.test:8443","api":"anthropic-messages"},
			"credential":{"mode":"oauth-broker","env":null,"secretRef":null,"authFile":"/srv/paseo/state/pi-agent/auth.json",
			"refreshURLs":["https://llm.example.test:8443/v1/oauth/token"]}}`, `"/srv/`, `"`+host+`/srv/`)
		sc := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(script), RegistryPatch: `{"network":{"mode":"sandbox"}}`, FactsPatch: facts})
		s := sceneSandbox(sc)
		s.uplink = testnet.New(t).Uplink
		_, _, _, err := s.launch(t, nil)
		wantUnavailableIs(t, err, diag.LaunchSecret, routeproxy.ErrLoginRevoked)
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Error("the refusal names a token of the file's other entries")
		}
		s.assertNotStarted(t)
	})
	t.Run("model route host that cannot be resolved", func(t *testing.T) {
		s := compileScript(t, script, `{"network":{"mode":"sandbox"}}`)
		s.uplink = testnet.New(t).Uplink
		_, _, _, err := s.launch(t, staticSecret("v"))
		wantUnavailableIs(t, err, diag.LaunchResolve)
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

// wantUnavailableIs requires a refusal (sandbox-unavailable) whose chain
// holds each target: a code (diag.PathReplaced, diag.PreflightBundleDigests)
// or a reason (preflight.ErrDigestDiffers, bundle.ErrPinsForeign).
func wantUnavailableIs(t *testing.T, err error, targets ...error) {
	t.Helper()
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want sandbox-unavailable", err)
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("%v is not %q", err, target)
		}
	}
	// Every refusal carries a code to the supervisor, and the codes asked
	// for that are a step's or a check's are among them.
	diags := ue.Diagnostics()
	if len(diags) == 0 {
		t.Errorf("%v carries no code", err)
	}
	for _, target := range targets {
		if c, ok := target.(diag.Code); ok && (strings.HasPrefix(string(c), "PP-LAUNCH-") || strings.HasPrefix(string(c), "PP-PREFLIGHT-")) && !hasCode(diags, c) {
			t.Errorf("diagnostics %v lack %s", diags, c)
		}
	}
	if strings.Contains(ue.Error(), "s3cr3t") {
		t.Error("error mentions a secret value")
	}
}

func hasCode(l diag.List, c diag.Code) bool {
	for _, d := range l {
		if d.Code == c {
			return true
		}
	}
	return false
}

// wantReasonNames is for a refusal whose code is asserted apart: its
// reason must name what was refused (a pin, a root: the fact path).
func wantReasonNames(t *testing.T, err error, substr string) {
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
	if res.Reason != "wall time exceeded" || res.Limit != LimitWall || strings.Contains(out, "end") || !strings.Contains(out, "begin") {
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
	if res.Reason != "output limit exceeded" || res.Limit != LimitOutput || len(out) > 65536 {
		t.Errorf("reason %q, %d bytes passed", res.Reason, len(out))
	}
	s.assertClean(t)
}

// jsonString quotes s as a JSON (and CUE) string.
func jsonString(s string) (string, error) {
	b, err := json.Marshal(s)
	return string(b), err
}

// The image is shared by every sandbox and must not change: runsc creates
// missing bind-mount destinations on the host side of the root, so the
// launcher gives each launch a private overlay over the image.
func TestImageUnchangedByLaunch(t *testing.T) {
	sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script("echo hi > $PASEO_AGENT_CWD/x")})
	before := listTree(t, sc.Rootfs)
	s := sceneSandbox(sc)
	if _, _, stderr, err := s.launch(t, staticSecret("v")); err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	after := listTree(t, sc.Rootfs)
	if before != after {
		t.Errorf("the image changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	s.assertClean(t)
}

func listTree(t *testing.T, root string) string {
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, _ := d.Info()
		fmt.Fprintf(&b, "%s %v %d\n", strings.TrimPrefix(p, root), info.Mode(), info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// An image directory can come from an EROFS file (registry image.erofs):
// the agent runs the file's programs, cannot write there, and a file that
// no longer has the compiled digest stops the launch before anything runs.
func TestLaunchErofs(t *testing.T) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Fatal("mkfs.erofs missing: apt-get install erofs-utils (.ci/run does)")
	}
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "busybox"), busybox, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "from-erofs"), []byte("erofs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bin.erofs")
	if out, err := exec.Command("mkfs.erofs", "--quiet", "-E", "noinline_data", file, src).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v %s", err, out)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"image":{"erofs":[{"dir":"/bin","file":%q,"digest":%q}]}}`, file, bundle.Digest(data))
	script := "echo started > $PASEO_AGENT_CWD/started; cat /bin/from-erofs > $PASEO_AGENT_CWD/seen; touch /bin/x 2>> $PASEO_AGENT_CWD/seen; echo done"

	s := compileScript(t, script, patch)
	res, stdout, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil || res.ExitCode != 0 || !strings.Contains(stdout, "done") {
		t.Fatalf("launch: %v exit %d stdout %q stderr %q", err, res.ExitCode, stdout, stderr)
	}
	seen, _ := os.ReadFile(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/seen"))
	if !strings.HasPrefix(string(seen), "erofs\n") || !strings.Contains(string(seen), "Read-only file system") {
		t.Errorf("want /bin from the EROFS file and read-only, the agent saw %q", seen)
	}
	s.assertClean(t)

	// The same bundle after the file changed.
	s = compileScript(t, script, patch)
	if err := os.WriteFile(file, append(data, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, _, err = s.launch(t, staticSecret("v"))
	wantUnavailableIs(t, err, diag.PreflightImageErofs, preflight.ErrDigestDiffers)
	s.assertNotStarted(t)
}
