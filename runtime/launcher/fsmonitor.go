package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
)

// The workspace's fsmonitor (Options.FSMonitor; docs/spec.md, "An agent's
// tools and the file path")
//
// With the option on, the launcher watches the staged workspace bind (the
// mount the sandbox's gofer serves, so host edits and the agent's writes
// both reach the watcher) and serves its answers on a socket in
// <run>/fsmonitor, a directory bound read-only into the sandbox at
// fsmonitor.Dir beside the hook (read-only, root's). The socket is the
// sandbox user's, mode 0600. It adds three things to the run copy of
// config.json beyond the three launch-time fields (runstate.go): that
// bind, and core.fsmonitor = the hook as one more of the Git settings in
// the process's GIT_CONFIG_COUNT/KEY_n/VALUE_n; and runsc gets
// --host-uds=open, without which the Sentry connects to no host socket.
// That flag is sandbox-wide: any host Unix socket beneath the sandbox's
// binds becomes connectable (docs/threat-model.md), which is why the
// option is off unless the caller sets it.
//
// The option applies only where the process's cwd is a staged directory
// bind (the workspace): anything else refuses the launch, since a monitor
// that watched another tree than the one Git scans would answer wrongly.

// fsmonitorState is what the launch made for the monitor.
type fsmonitorState struct {
	dir string // <run>/fsmonitor
	w   *fsmonitor.Watcher
	srv *fsmonitor.Server
}

// startFSMonitor watches the workspace's staged bind and serves the socket.
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
	if err := os.WriteFile(filepath.Join(dir, "hook"), []byte(fsmonitor.HookFor(fsmonitor.SocketPath, p.Cwd)), 0o555); err != nil {
		return fmt.Errorf("fsmonitor: %w", err)
	}
	w, err := fsmonitor.Watch(src, fsmonitor.DefaultLimits)
	if err != nil {
		return err
	}
	l.cleanup.push("fsmonitor watcher", w.Close)
	srv, err := fsmonitor.Serve(w, filepath.Join(dir, "sock"), int(p.User.UID), int(p.User.GID))
	if err != nil {
		return fmt.Errorf("fsmonitor: the socket: %w", err)
	}
	l.cleanup.push("fsmonitor socket", func() error {
		err := srv.Close()
		st := w.Stats()
		l.res.FSMonitor = &FSMonitorStats{Lists: st.Lists, Everything: st.Everything, Events: st.Events, Overflows: st.Overflows,
			Degraded: st.Degraded, Refused: srv.Refused()}
		return err
	})
	l.state.fsmonitor = &fsmonitorState{dir: dir, w: w, srv: srv}
	l.rs.hostUDS = true
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
