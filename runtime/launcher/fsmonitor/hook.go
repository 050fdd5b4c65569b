package fsmonitor

import (
	"net/netip"

	"paseo.dev/paseo-policy/policy/bundle"
)

// HookPath is where the hook is in the sandbox (a read-only bind of the
// bundle's bundle.FSMonitorHookFile).
const HookPath = bundle.FSMonitorHookPath

// HookFor is the bundle's hook (bundle.FSMonitorHook) asking addr: the
// compiler's names the gateway; tests ask a listener of their own.
func HookFor(addr netip.AddrPort, worktree string) string {
	return string(bundle.FSMonitorHook(addr.Addr().String(), int(addr.Port()), worktree))
}
