package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// Read-only searches answered outside gVisor (the plan's search grant;
// docs/spec.md, "Read-only searches answered outside gVisor")
//
// When the plan grants the search (an operator's opt-in per deployment,
// registry deployments.<id>.search "native"), the launcher serves the
// sandbox's rg, fd, find and cat (bundle.SearchClientNames) from the host: on
// the sandbox network's gateway, on the grant's port, admitted by the
// sandbox's nftables table from its own address only and answered for
// that address only. Each request is a typed search or listing
// (nativesearch.Request) run by the image's own rg, fd or find in a jail
// of its own (nativesearch.Jail): the staged workspace bind and the
// image's /usr, read-only, as the process's uid and gid. The client (the
// bundle's files/search-client, naming the gateway, the port and the
// workspace, one script answering under each of the names), its read-only
// binds at bundle.SearchDir, the spool's read-only bind at
// bundle.SearchSpoolPath (cat's bytes, written by the server into the run
// dir's copy) and PATH starting with that directory are compiled grants:
// the launcher adds nothing to the run copy for the search. The plan's
// validator (ocicheck CheckSearch, before
// anything is made) checked the client is the one the grant's port and
// workspace give, bound read-only under each of its names, with PATH
// starting there, and that the port is no route's and not the monitor's.
//
// It widens the trusted boundary (the agent's files meet the host kernel
// through rg and the jail, not gVisor's Sentry), so it is never a default:
// a plan that grants it without a gateway (network mode none; the compiler
// never makes one) is refused, and so is a kernel without Landlock or user
// namespaces (PP-SEARCH-JAIL), never served another way.

// ErrNativeSearchNoGateway refuses a plan that grants the search without a
// sandbox network: the server listens on the gateway only.
var ErrNativeSearchNoGateway = errors.New("nativesearch: searches are served on the sandbox network's gateway only, which needs network mode sandbox")

// nativeSearchState is what the launch made for the search server.
type nativeSearchState struct {
	jail nativesearch.Jail
	port int
	srv  *nativesearch.Server
}

// startNativeSearch checks the jail can be built here and what it will
// hold; the network phase serves it (serveNativeSearch). A jail that
// cannot be built as designed refuses the launch with its code
// (PP-SEARCH-JAIL at launch.search).
func (l *launch) startNativeSearch() error {
	err := l.checkNativeSearch()
	var je *nativesearch.ErrJail
	if errors.As(err, &je) {
		return refused(diag.SearchJail, "search", err)
	}
	return err
}

func (l *launch) checkNativeSearch() error {
	g := l.plan.Search
	if err := nativesearch.Probe(); err != nil {
		return err
	}
	p := l.spec.Process
	if p == nil || p.Cwd == "" || p.Cwd != g.Path {
		return fmt.Errorf("nativesearch: the grant searches %s, which is not the process's working directory", g.Path)
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
	// What the sandbox sees beneath the workspace through mounts of its
	// own (the Git layout's .git): a cat of it is the sandbox's.
	for _, m := range l.spec.Mounts {
		if m.Destination != p.Cwd && pathform.Beneath(p.Cwd, m.Destination) {
			j.Covered = append(j.Covered, pathform.Rel(p.Cwd, m.Destination))
		}
	}
	if err := j.Check(); err != nil {
		return err
	}
	if err := j.CheckTools(); err != nil {
		return err
	}
	l.state.search = &nativeSearchState{jail: j, port: g.Port}
	return nil
}

// serveNativeSearch listens on the gateway's search port, for the
// sandbox's address only (the compiled client asks there, by the
// gateway's name).
func (l *launch) serveNativeSearch(n *sandboxnet.Network) error {
	st := l.state.search
	ln, err := n.ListenGateway(st.port)
	if err != nil {
		return fmt.Errorf("nativesearch: listening on the gateway: %w", err)
	}
	// The run dir's spool (root's, 0700 above it, written by materialize):
	// the launcher's own file, opened without following a link.
	spool, err := os.OpenFile(filepath.Join(l.run.dir, filepath.FromSlash(bundle.SearchSpoolFile)), os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		ln.Close()
		return fmt.Errorf("nativesearch: the spool: %w", err)
	}
	srv := nativesearch.Serve(st.jail, ln, n.Address, spool)
	l.cleanup.push("nativesearch listener", func() error {
		err := srv.Close()
		s := srv.Stats()
		l.res.NativeSearch = &s
		return errors.Join(err, spool.Close())
	})
	st.srv = srv
	return nil
}
