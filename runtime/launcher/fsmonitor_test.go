package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// The monitor's additions to the run copy: its read-only bind, and
// core.fsmonitor as one more Git setting after the profile's; a compiled
// env that already names core.fsmonitor, or a count that is not one, is
// refused rather than overridden.
func TestWithFSMonitor(t *testing.T) {
	spec := &rspec.Spec{Process: &rspec.Process{Env: []string{"PATH=/bin", "GIT_CONFIG_COUNT=2",
		"GIT_CONFIG_KEY_0=core.checkStat", "GIT_CONFIG_VALUE_0=minimal", "GIT_CONFIG_KEY_1=core.untrackedCache", "GIT_CONFIG_VALUE_1=true"}}}
	if err := withFSMonitor(spec, &fsmonitorState{dir: "/run-dir/fsmonitor"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"GIT_CONFIG_COUNT=3", "GIT_CONFIG_KEY_2=core.fsmonitor", "GIT_CONFIG_VALUE_2=" + fsmonitor.HookPath} {
		if !slices.Contains(spec.Process.Env, want) {
			t.Errorf("env lacks %s: %q", want, spec.Process.Env)
		}
	}
	if slices.Contains(spec.Process.Env, "GIT_CONFIG_COUNT=2") {
		t.Error("the old count is still there")
	}
	m := spec.Mounts[len(spec.Mounts)-1]
	if m.Destination != fsmonitor.Dir || m.Source != "/run-dir/fsmonitor" || !slices.Contains(m.Options, "ro") {
		t.Errorf("the bind: %+v", m)
	}

	none := &rspec.Spec{Process: &rspec.Process{Env: []string{"PATH=/bin"}}}
	if err := withFSMonitor(none, &fsmonitorState{dir: "/d"}); err != nil || !slices.Contains(none.Process.Env, "GIT_CONFIG_COUNT=1") ||
		!slices.Contains(none.Process.Env, "GIT_CONFIG_KEY_0=core.fsmonitor") {
		t.Errorf("no Git settings before: %v, %q", err, none.Process.Env)
	}
	for _, env := range [][]string{
		{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.fsmonitor", "GIT_CONFIG_VALUE_0=/x"},
		{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=Core.FSMonitor", "GIT_CONFIG_VALUE_0=/x"},
		{"GIT_CONFIG_COUNT=x"},
		{"GIT_CONFIG_COUNT=-1"},
	} {
		s := &rspec.Spec{Process: &rspec.Process{Env: env}}
		if err := withFSMonitor(s, &fsmonitorState{dir: "/d"}); err == nil || !strings.Contains(err.Error(), "fsmonitor") {
			t.Errorf("env %q: %v, want a refusal", env, err)
		}
	}
}

// The monitor's port is FSMonitorPort unless a route has it.
func TestFSMonitorPort(t *testing.T) {
	if p := fsmonitorPort(nil); p != FSMonitorPort {
		t.Errorf("no routes: %d", p)
	}
	routes := []bundle.Route{{Port: 18080}, {Port: FSMonitorPort}, {Port: FSMonitorPort + 1}}
	if p := fsmonitorPort(routes); p != FSMonitorPort+2 {
		t.Errorf("routes on %d and %d: %d", FSMonitorPort, FSMonitorPort+1, p)
	}
}

// runsc's flags are the launcher's fixed ones whatever the launch serves:
// no --host-uds, which would let the agent connect to any host Unix
// socket beneath its binds (threat 87).
func TestRunscFlagsOpenNoHostSockets(t *testing.T) {
	for _, mode := range []string{"none", "sandbox"} {
		f := (&runsc{root: "/r", network: mode}).flags()
		if !slices.Equal(f, launchplan.RunscFlags("/r", mode)) || slices.ContainsFunc(f, func(a string) bool { return strings.Contains(a, "host-uds") }) {
			t.Errorf("mode %s: %q", mode, f)
		}
	}
}

// A bundle without a sandbox network (mode none) has no gateway to serve
// the monitor on: the launch is refused before anything is made or run,
// never served another way.
func TestFSMonitorRefusedWithoutGateway(t *testing.T) {
	s := compileScript(t, "echo ran", "")
	var out, errb, log bytes.Buffer
	_, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Log: &log, FSMonitor: true})
	var ue *UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, ErrFSMonitorNoGateway) || !errors.Is(err, diag.LaunchBundle) {
		t.Fatalf("launch: %v, want ErrFSMonitorNoGateway", err)
	}
	if out.Len() > 0 || log.Len() > 0 {
		t.Errorf("output %q, log %q", out.String(), log.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(s.state, "records")); len(entries) > 0 {
		t.Errorf("records left: %v", entries)
	}
	s.assertClean(t)
}

// With the monitor on in network mode sandbox, the sandbox reaches it on
// its gateway's monitor port over TCP (the hook names that address), is
// answered (everything for a token the watcher did not issue, then the
// names it wrote), and the port's rule counted the packets. The run's
// runsc has no --host-uds (TestRunscFlagsOpenNoHostSockets); the e2e
// TestPiToolsGitWithFSMonitor shows a host socket in the workspace
// refused from a real sandbox with the monitor on, and its control.
func TestLaunchFSMonitorOverTCP(t *testing.T) {
	world := testnet.New(t)
	model := world.Host("model")
	bb := "/bin/busybox "
	ask := func(tok string) string {
		return "printf \"since " + tok + "\\n\" | " + bb + "timeout 5 " + bb + "nc -w 2 $GW " + strconv.Itoa(FSMonitorPort) + " | " + bb + "tr '\\0' '\\n'"
	}
	script := "GW=$(" + bb + "ip route | " + bb + "awk '/^default/{print $3}')\n" +
		bb + "grep -qF \"pack_sockaddr_in(" + strconv.Itoa(FSMonitorPort) + ", inet_aton('$GW'))\" " + fsmonitor.HookPath + " && echo hook=gateway\n" +
		"A=$(" + ask("1") + ")\n" +
		"echo \"$A\" | " + bb + "grep -qx / && echo first=everything\n" +
		"TOK=$(echo \"$A\" | " + bb + "head -n 1)\n" +
		"echo x >made-inside.txt\n" +
		"B=$(" + ask("$TOK") + ")\n" +
		"echo \"$B\" | " + bb + "grep -qx made-inside.txt && echo second=list\n" +
		"echo hi | " + bb + "timeout 4 " + bb + "nc -w 2 $GW " + strconv.Itoa(FSMonitorPort+1) + " && echo other-port=reached || echo other-port=blocked\n"
	s := compileScriptFacts(t, script, `{"network":{"mode":"sandbox"}}`, directModel)
	s.uplink, s.fsmonitor = world.Uplink, true
	s.resolve = func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{model.Addr}, nil }
	res, out, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatalf("launch: %v\nstderr: %s", err, stderr)
	}
	for _, want := range []string{"hook=gateway", "first=everything", "second=list", "other-port=blocked"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr: %s", want, out, stderr)
		}
	}
	if st := res.FSMonitor; st == nil || st.Lists == 0 || st.Everything == 0 {
		t.Errorf("the monitor's counters: %+v", st)
	}
	if n := res.Packets[fmt.Sprintf("%s%d", sandboxnet.TagRoutePrefix, FSMonitorPort)]; n == 0 {
		t.Errorf("the monitor port's rule counted nothing: %v", res.Packets)
	}
	s.assertClean(t)
}
