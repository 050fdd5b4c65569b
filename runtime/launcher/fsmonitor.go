package launcher

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// The workspace's fsmonitor (Options.FSMonitor; docs/spec.md, "An agent's
// tools and the file path")
//
// With the option on, the launcher watches the staged workspace bind (the
// mount the sandbox's gofer serves, so host edits and the agent's writes
// both reach the watcher) and serves its answers over TCP on the sandbox
// network's gateway, where the private routes listen, on a port of its
// own (FSMonitorPort, or the next one no route has): the sandbox's
// nftables table admits that port from this sandbox's address only, as
// it admits the routes', and the server itself answers no other address.
// The hook, which names the gateway and the port, sits in <run>/fsmonitor,
// a directory bound read-only into the sandbox at fsmonitor.Dir. It adds
// two things to the run copy of config.json beyond the three launch-time
// fields (runstate.go): that bind, and core.fsmonitor = the hook as one
// more of the Git settings in the process's GIT_CONFIG_COUNT/KEY_n/VALUE_n.
// runsc's flags are the launcher's fixed ones: no host Unix socket is
// connectable from the sandbox (runsc's --host-uds stays off).
//
// The monitor needs the gateway: a bundle whose network mode is none is
// refused with the option (ErrFSMonitorNoGateway), never served another
// way. It applies only where the process's cwd is a staged directory bind
// (the workspace): anything else refuses the launch, since a monitor that
// watched another tree than the one Git scans would answer wrongly.

// FSMonitorPort is the monitor's port on the gateway, unless a route of
// the bundle has it (then the next port no route has).
const FSMonitorPort = 18090

// ErrFSMonitorNoGateway refuses the monitor for a bundle without a sandbox
// network: it is served on the gateway only.
var ErrFSMonitorNoGateway = errors.New("fsmonitor: the workspace monitor is served on the sandbox network's gateway only, which needs network mode sandbox")

// fsmonitorState is what the launch made for the monitor.
type fsmonitorState struct {
	dir  string // <run>/fsmonitor
	cwd  string // the workspace in the sandbox
	port int    // on the gateway
	w    *fsmonitor.Watcher
	srv  *fsmonitor.Server
}

// fsmonitorPort is FSMonitorPort or the next port no route has.
func fsmonitorPort(routes []bundle.Route) int {
	p := FSMonitorPort
	for slices.ContainsFunc(routes, func(r bundle.Route) bool { return r.Port == p }) {
		p++
	}
	return p
}

// startFSMonitor watches the workspace's staged bind; the network phase
// serves it (serveFSMonitor).
func (l *launch) startFSMonitor() error {
	p := l.spec.Process
	if p == nil || p.Cwd == "" {
		return errors.New("fsmonitor: the process has no working directory")
	}
	var src string
	for _, b := range l.state.binds {
		if b.pin.Destination == p.Cwd && b.pin.Kind == string(pathsafe.Dir) {
			src = b.path
		}
	}
	if src == "" {
		return fmt.Errorf("fsmonitor: the working directory %s is not a staged directory bind (the workspace)", p.Cwd)
	}
	dir := filepath.Join(l.run.dir, "fsmonitor")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("fsmonitor: %w", err)
	}
	w, err := fsmonitor.Watch(src, fsmonitor.DefaultLimits)
	if err != nil {
		return err
	}
	l.cleanup.push("fsmonitor watcher", w.Close)
	l.state.fsmonitor = &fsmonitorState{dir: dir, cwd: p.Cwd, port: fsmonitorPort(l.plan.Routes), w: w}
	return nil
}

// serveFSMonitor listens on the gateway's monitor port, for the sandbox's
// address only, and writes the hook that asks there.
func (l *launch) serveFSMonitor(n *sandboxnet.Network) error {
	st := l.state.fsmonitor
	ln, err := n.ListenGateway(st.port)
	if err != nil {
		return fmt.Errorf("fsmonitor: listening on the gateway: %w", err)
	}
	srv := fsmonitor.Serve(st.w, ln, n.Address)
	l.cleanup.push("fsmonitor listener", func() error {
		err := srv.Close()
		s := st.w.Stats()
		l.res.FSMonitor = &FSMonitorStats{Lists: s.Lists, Everything: s.Everything, Events: s.Events, Overflows: s.Overflows,
			Degraded: s.Degraded, Refused: srv.Refused()}
		return err
	})
	st.srv = srv
	hook := fsmonitor.HookFor(netip.AddrPortFrom(n.Gateway, uint16(st.port)), st.cwd)
	if err := os.WriteFile(filepath.Join(st.dir, "hook"), []byte(hook), 0o555); err != nil {
		return fmt.Errorf("fsmonitor: %w", err)
	}
	return nil
}

// FSMonitorStats are the monitor's counters at the end of a launch.
type FSMonitorStats struct {
	Lists, Everything, Events, Overflows, Refused uint64
	Degraded                                      bool
}

// withFSMonitor adds the monitor's bind and Git setting to the run copy.
func withFSMonitor(spec *rspec.Spec, st *fsmonitorState) error {
	spec.Mounts = append(spec.Mounts, rspec.Mount{Destination: fsmonitor.Dir, Type: "bind", Source: st.dir,
		Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	env := spec.Process.Env
	n, at := 0, -1
	for i, e := range env {
		if v, ok := strings.CutPrefix(e, "GIT_CONFIG_COUNT="); ok {
			c, err := strconv.Atoi(v)
			if err != nil || c < 0 || c > 100 {
				return fmt.Errorf("fsmonitor: GIT_CONFIG_COUNT=%q", v)
			}
			n, at = c, i
		}
		if k, v, _ := strings.Cut(e, "="); strings.HasPrefix(k, "GIT_CONFIG_KEY_") && strings.EqualFold(v, "core.fsmonitor") {
			return fmt.Errorf("fsmonitor: the compiled env already sets %s", e)
		}
	}
	count := "GIT_CONFIG_COUNT=" + strconv.Itoa(n+1)
	if at >= 0 {
		env[at] = count
	} else {
		env = append(env, count)
	}
	env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=core.fsmonitor", n), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", n, fsmonitor.HookPath))
	spec.Process.Env = env
	return nil
}
