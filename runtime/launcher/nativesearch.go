package launcher

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// Read-only searches answered outside gVisor (Options.NativeSearch;
// docs/spec.md, "Read-only searches answered outside gVisor")
//
// With the option on, the launcher serves the sandbox's rg, fd and find
// (nativesearch.Names) from the host:
// on the sandbox network's gateway, on a port of its own
// (NativeSearchPort, or the next port no route or the monitor has),
// admitted by the sandbox's nftables table from its own address only and
// answered for that address only. Each request is a typed search
// (nativesearch.Request) run by the image's rg in a jail of its own
// (nativesearch.Jail): the staged workspace bind and the image's /usr,
// read-only, as the process's uid and gid. The client, a Perl script
// naming the gateway, the port and the workspace, sits in <run>/search
// under each of nativesearch.Names, bound read-only into the sandbox at
// nativesearch.Dir, and the run copy's PATH starts with that directory, so
// `rg`, `fd` and `find` are the client; whatever it does not forward runs
// the image's binary in the sandbox, as before.
//
// It widens the trusted boundary (the agent's files meet the host kernel
// through rg and the jail, not gVisor's Sentry), so it is never a default:
// the option refuses a bundle without a gateway (network mode none) and a
// kernel without Landlock or user namespaces (PP-SEARCH-JAIL).

// NativeSearchPort is the search server's port on the gateway, unless a
// route or the monitor has it (then the next free one).
const NativeSearchPort = 18091

// ErrNativeSearchNoGateway refuses the option for a bundle without a
// sandbox network: the server listens on the gateway only.
var ErrNativeSearchNoGateway = errors.New("nativesearch: searches are served on the sandbox network's gateway only, which needs network mode sandbox")

// nativeSearchState is what the launch made for the search server.
type nativeSearchState struct {
	dir  string // <run>/search
	jail nativesearch.Jail
	port int
	srv  *nativesearch.Server
}

// nativeSearchPort is NativeSearchPort or the next port no route and not
// the monitor has.
func nativeSearchPort(routes []bundle.Route, taken ...int) int {
	p := NativeSearchPort
	for slices.ContainsFunc(routes, func(r bundle.Route) bool { return r.Port == p }) || slices.Contains(taken, p) {
		p++
	}
	return p
}

// startNativeSearch checks the jail can be built here and what it will
// hold; the network phase serves it (serveNativeSearch).
func (l *launch) startNativeSearch() error {
	if err := nativesearch.Probe(); err != nil {
		return err
	}
	p := l.spec.Process
	if p == nil || p.Cwd == "" {
		return errors.New("nativesearch: the process has no working directory")
	}
	var src string
	for _, b := range l.state.binds {
		if b.pin.Destination == p.Cwd && b.pin.Kind == string(pathsafe.Dir) {
			src = b.path
		}
	}
	if src == "" {
		return fmt.Errorf("nativesearch: the working directory %s is not a staged directory bind (the workspace)", p.Cwd)
	}
	j := nativesearch.Jail{Workspace: src, Dest: p.Cwd, Usr: filepath.Join(l.spec.Root.Path, "usr"),
		UID: p.User.UID, GID: p.User.GID, Limits: nativesearch.DefaultLimits}
	if err := j.Check(); err != nil {
		return err
	}
	if fi, err := os.Lstat(filepath.Join(j.Usr, "bin/rg")); err != nil || !fi.Mode().IsRegular() {
		return &nativesearch.ErrJail{Msg: fmt.Sprintf("the image has no rg at %s/bin/rg", j.Usr)}
	}
	dir := filepath.Join(l.run.dir, "search")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("nativesearch: %w", err)
	}
	var taken []int
	if l.state.fsmonitor != nil {
		taken = append(taken, l.state.fsmonitor.port)
	}
	l.state.search = &nativeSearchState{dir: dir, jail: j, port: nativeSearchPort(l.plan.Routes, taken...)}
	return nil
}

// serveNativeSearch listens on the gateway's search port, for the
// sandbox's address only, and writes the client that asks there.
func (l *launch) serveNativeSearch(n *sandboxnet.Network) error {
	st := l.state.search
	ln, err := n.ListenGateway(st.port)
	if err != nil {
		return fmt.Errorf("nativesearch: listening on the gateway: %w", err)
	}
	srv := nativesearch.Serve(st.jail, ln, n.Address)
	l.cleanup.push("nativesearch listener", func() error {
		err := srv.Close()
		s := srv.Stats()
		l.res.NativeSearch = &s
		return err
	})
	st.srv = srv
	client := nativesearch.Client(netip.AddrPortFrom(n.Gateway, uint16(st.port)), st.jail.Dest)
	for _, name := range nativesearch.Names {
		if err := os.WriteFile(filepath.Join(st.dir, name), []byte(client), 0o555); err != nil {
			return fmt.Errorf("nativesearch: %w", err)
		}
	}
	return nil
}

// withNativeSearch adds the client's bind to the run copy and puts its
// directory first on the process's PATH.
func withNativeSearch(spec *rspec.Spec, st *nativeSearchState) error {
	spec.Mounts = append(spec.Mounts, rspec.Mount{Destination: nativesearch.Dir, Type: "bind", Source: st.dir,
		Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	for i, e := range spec.Process.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			spec.Process.Env[i] = "PATH=" + nativesearch.Dir + ":" + v
			return nil
		}
	}
	return errors.New("nativesearch: the compiled env has no PATH")
}
