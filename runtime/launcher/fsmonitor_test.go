package launcher

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// runsc's flags are the launcher's fixed ones whatever the launch serves:
// no --host-uds, which would let the agent connect to any host Unix
// socket beneath its binds (threat 87).
func TestRunscFlagsOpenNoHostSockets(t *testing.T) {
	for _, mode := range []string{"none", "sandbox"} {
		f := (&runsc.Runner{Root: "/r", Network: mode}).Flags()
		if !slices.Equal(f, launchplan.RunscFlags("/r", mode)) || slices.ContainsFunc(f, func(a string) bool { return strings.Contains(a, "host-uds") }) {
			t.Errorf("mode %s: %q", mode, f)
		}
	}
}

// monitorPort is the compiler's port for the monitor when no route has it.
const monitorPort = 18090

// The monitor is the plan's (on by default for pi-session in network mode
// sandbox; no launcher option): the sandbox reaches it on its gateway's
// monitor port over TCP (the compiled hook names the gateway and the
// port), is answered (everything for a token the watcher did not issue,
// then the names it wrote), and the port's rule counted the packets. The
// control, the same launch with the registry's switch off: no hook, no
// listener, the port blocked, no counters. The run's
// runsc has no --host-uds (TestRunscFlagsOpenNoHostSockets); the e2e
// TestPiToolsGitWithFSMonitor shows a host socket in the workspace
// refused from a real sandbox with the monitor on, and its control.
func TestLaunchFSMonitorOverTCP(t *testing.T) {
	world := testnet.New(t)
	model := world.Host("model")
	bb := "/bin/busybox "
	ask := func(tok string) string {
		return "printf \"since " + tok + "\\n\" | " + bb + "timeout 5 " + bb + "nc -w 2 $GW " + strconv.Itoa(monitorPort) + " | " + bb + "tr '\\0' '\\n'"
	}
	script := "GW=$(" + bb + "ip route | " + bb + "awk '/^default/{print $3}')\n" +
		bb + "grep -qF \"2, " + strconv.Itoa(monitorPort) + ", \" " + fsmonitor.HookPath + " && " +
		bb + "grep -qF \"gethostbyname('" + bundle.GatewayName + "')\" " + fsmonitor.HookPath + " && " +
		bb + "grep -q \"$GW[[:space:]]" + bundle.GatewayName + "\" /etc/hosts && echo hook=gateway\n" +
		"A=$(" + ask("1") + ")\n" +
		"echo \"$A\" | " + bb + "grep -qx / && echo first=everything\n" +
		"TOK=$(echo \"$A\" | " + bb + "head -n 1)\n" +
		"echo x >made-inside.txt\n" +
		"B=$(" + ask("$TOK") + ")\n" +
		"echo \"$B\" | " + bb + "grep -qx made-inside.txt && echo second=list\n" +
		"echo hi | " + bb + "timeout 4 " + bb + "nc -w 2 $GW " + strconv.Itoa(monitorPort+1) + " && echo other-port=reached || echo other-port=blocked\n"
	launch := func(registryPatch string) (Result, string) {
		s := compileScriptFacts(t, script, registryPatch, directModel)
		s.uplink = world.Uplink
		s.resolve = func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{model.Addr}, nil }
		res, out, stderr, err := s.launch(t, staticSecret("v"))
		if err != nil {
			t.Fatalf("launch: %v\nstderr: %s", err, stderr)
		}
		s.assertClean(t)
		return res, out + stderr
	}
	res, out := launch(`{"network":{"mode":"sandbox"}}`)
	for _, want := range []string{"hook=gateway", "first=everything", "second=list", "other-port=blocked"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if st := res.FSMonitor; st == nil || st.Lists == 0 || st.Everything == 0 {
		t.Errorf("the monitor's counters: %+v", st)
	}
	if n := res.Packets[fmt.Sprintf("%s%d", sandboxnet.TagRoutePrefix, monitorPort)]; n == 0 {
		t.Errorf("the monitor port's rule counted nothing: %v", res.Packets)
	}

	res, out = launch(`{"network":{"mode":"sandbox"},"deployments":{"host-alice":{"fsmonitor":"off"}}}`)
	for _, bad := range []string{"hook=gateway", "first=everything", "second=list"} {
		if strings.Contains(out, bad) {
			t.Errorf("control (off): output has %q:\n%s", bad, out)
		}
	}
	if res.FSMonitor != nil {
		t.Errorf("control (off): the monitor ran: %+v", res.FSMonitor)
	}
}
