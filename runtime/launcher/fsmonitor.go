package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor/untracked"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor/vouch"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// The workspace's fsmonitor (the plan's fsmonitor grant; docs/spec.md,
// "An agent's tools and the file path")
//
// When the plan grants the monitor, the launcher watches the staged
// workspace bind (the mount the sandbox's gofer serves, so host edits and
// the agent's writes both reach the watcher) and serves its answers over
// TCP on the sandbox network's gateway, where the private routes listen,
// on the grant's port: the sandbox's nftables table admits that port from
// this sandbox's address only, as it admits the routes', and the server
// itself answers no other address. The hook (the bundle's
// files/fsmonitor-hook, bound read-only at bundle.FSMonitorHookPath) and
// core.fsmonitor in the process's Git settings are compiled grants. The
// launcher writes one thing into the run copy for the monitor, before
// runsc starts: the vouched index (bundle.FSMonitorIndexFile, compiled
// empty), the worktree's index with an fsmonitor extension naming the
// watcher's token, which the start script seeds the private Git dir from
// (vouchIndex; runtime/launcher/fsmonitor/vouch). The plan's
// validator (ocicheck CheckFSMonitor, before anything is made) checked the
// hook is the one the grant's port and path give, bound read-only, and
// that the port is no route's. runsc's flags are
// the launcher's fixed ones: no host Unix socket is connectable from the
// sandbox (runsc's --host-uds stays off).
//
// The monitor needs the gateway: a plan that grants it with network mode
// none is refused (ErrFSMonitorNoGateway; the compiler never makes one),
// never served another way. It applies only where the process's cwd is
// the grant's path and a staged directory bind (the workspace): anything
// else refuses the launch, since a monitor that watched another tree than
// the one Git scans would answer wrongly.

// ErrFSMonitorNoGateway refuses a plan that grants the monitor without a
// sandbox network: it is served on the gateway only.
var ErrFSMonitorNoGateway = errors.New("fsmonitor: the workspace monitor is served on the sandbox network's gateway only, which needs network mode sandbox")

// fsmonitorState is what the launch made for the monitor.
type fsmonitorState struct {
	port int // on the gateway
	w    *fsmonitor.Watcher
	srv  *fsmonitor.Server
	// The vouch's counts, or why nothing was vouched for.
	vouched, notVouched int
	vouchReason         string
	// The untracked cache's build (untracked.go of fsmonitor/untracked):
	// done is closed when it ended, with the index to write or why none.
	untrackedDone   chan struct{}
	untrackedIndex  []byte
	untrackedReason string
	untrackedTime   time.Duration
	untrackedWait   time.Duration // what start waited for it
	// The entries the build's git refreshed that the index took, those
	// it did not, or why none were looked at (untracked.Spliced).
	refreshed, refreshSkipped int
	refreshReason             string
}

// startFSMonitor watches the workspace's staged bind; the network phase
// serves it (serveFSMonitor).
func (l *launch) startFSMonitor() error {
	g := l.plan.FSMonitor
	p := l.spec.Process
	if p == nil || p.Cwd == "" || p.Cwd != g.Path {
		return fmt.Errorf("fsmonitor: the grant watches %s, which is not the process's working directory", g.Path)
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
	pre := l.prepareUntracked(src)
	w, err := fsmonitor.Watch(src, fsmonitor.DefaultLimits)
	if err != nil {
		return err
	}
	l.cleanup.push("fsmonitor watcher", w.Close)
	st := &fsmonitorState{port: g.Port, w: w}
	l.state.fsmonitor = st
	return l.vouchIndex(st, src, pre)
}

// vouchIndex writes the run dir's vouched index, after the watches are in
// place (Watch returned) and the token taken, so every change after the
// sweep reaches Git through the watcher. What cannot be vouched for (no
// Git seed in this layout, no index, a split index, a degraded watcher)
// leaves the compiled empty file, and the start script copies the seed's
// index as it is: a full first scan, never a wrong one. The result says
// why (FSMonitorStats.VouchReason).
func (l *launch) vouchIndex(st *fsmonitorState, workspace string, pre *untrackedPrep) error {
	// The untracked cache's jail waits for the vouched index: without one
	// it is ended now, not at teardown.
	used := false
	defer func() {
		if !used {
			pre.discard()
		}
	}()
	var seed string
	for _, b := range l.state.binds {
		if b.pin.Destination == bundle.GitSeedPath && b.pin.Kind == string(pathsafe.Dir) {
			seed = b.path
		}
	}
	if _, ok := l.files[bundle.FSMonitorIndexFile]; !ok {
		st.vouchReason = "the bundle binds no vouched index"
		return nil
	}
	if l.wake != nil {
		// The restored sandbox keeps the Git dir its git last wrote; no
		// start script copies an index.
		st.vouchReason = "a wake: the sandbox's Git dir is restored, not seeded"
		return nil
	}
	if seed == "" {
		st.vouchReason = "the layout shows no Git seed (" + bundle.GitSeedPath + ")"
		return nil
	}
	// Read before the token: every change after the token is stamped at
	// or after it (the refreshed entries' racy rule, untracked.Racy).
	tokenTime := time.Now()
	tok := st.w.Token()
	if st.w.Stats().Degraded {
		st.vouchReason = "the watcher is degraded: every answer is everything"
		return nil
	}
	res, err := vouch.Vouch(seed, workspace, tok)
	if err != nil {
		st.vouchReason = err.Error()
		return nil
	}
	if err := l.run.writeFile(bundle.FSMonitorIndexFile, res.Index, 0o644); err != nil {
		return fmt.Errorf("fsmonitor: writing the vouched index: %w", err)
	}
	st.vouched, st.notVouched = res.Vouched, res.NotVouched
	used = l.startUntracked(st, pre, res.Index, tokenTime)
	return nil
}

// The untracked cache (runtime/launcher/fsmonitor/untracked)
//
// The jail is built (prepareUntracked) while the watcher walks the tree
// and the vouch sweeps the index; after the vouch, with its token, the
// image's git in it builds an untracked cache, beside the rest of the
// launch (the sandbox network is built meanwhile); before runsc starts,
// the launcher waits for it and, when it was built, writes the vouched
// index with it in place of the one without. Whatever fails (no Landlock
// or user namespaces, a workspace past MaxUntrackedEntries, a store config
// that could change the scan, the jail's wall time, a cache Splice
// refuses) leaves the vouched index as it is, and the result says why
// (FSMonitorStats.Untracked): a launch never fails for it.

// MaxUntrackedEntries bounds the index entries of a workspace whose
// untracked cache is built at a start: past it the build (a walk of the
// whole tree) is skipped.
const MaxUntrackedEntries = 200_000

// untrackedLimits bound the jailed git: it runs on the start's path.
var untrackedLimits = nativesearch.Limits{CPU: 10 * time.Second, Memory: 2 << 30, Wall: 10 * time.Second, Stdout: 64 << 20, Stderr: 64 << 10, Threads: 1}

// maxExcludeBytes bounds the info/exclude and config read from the
// agent's Git store.
const maxExcludeBytes = 1 << 20

// untrackedPrep is the untracked cache's jail, built while the watcher
// walks the tree and the vouch sweeps the index (untracked.Start): done is
// closed when it is built (pend) or failed (reason).
type untrackedPrep struct {
	done   chan struct{}
	pend   *untracked.Pending
	reason string
	start  time.Time
}

// prepareUntracked starts building the untracked cache's jail when a
// vouched index can be written (the layout has a Git seed, not a wake).
func (l *launch) prepareUntracked(workspace string) *untrackedPrep {
	pr := &untrackedPrep{done: make(chan struct{}), start: time.Now()}
	p := l.spec.Process
	seed := false
	for _, b := range l.state.binds {
		seed = seed || b.pin.Destination == bundle.GitSeedPath && b.pin.Kind == string(pathsafe.Dir)
	}
	_, file := l.files[bundle.FSMonitorIndexFile]
	var o untracked.Options
	err := nativesearch.Probe()
	if !file || l.wake != nil || !seed {
		err = errors.New("no vouched index")
	}
	if err == nil {
		var exclude, config []byte
		if exclude, err = l.storeFile("info/exclude"); err != nil {
			err = fmt.Errorf("the Git store's info/exclude: %w", err)
		} else if config, err = l.storeFile("config"); err != nil {
			err = fmt.Errorf("the Git store's config: %w", err)
		} else if k := scanConfig(config); k != "" {
			err = fmt.Errorf("the Git store's config sets %s, which the untracked scan depends on and the cache does not record", k)
		}
		var refreshOff string
		if k := convertConfig(config); k != "" {
			refreshOff = "the Git store's config sets " + k + ", which changes the bytes Git hashes and the jailed git does not read"
		} else if attrs, aerr := l.storeFile("info/attributes"); aerr != nil || attrs != nil {
			refreshOff = "the Git store has info/attributes, which the jailed git does not read"
		}
		var gitConfig []string
		for _, kv := range p.Env {
			if strings.HasPrefix(kv, "GIT_CONFIG_") {
				gitConfig = append(gitConfig, kv)
			}
		}
		o = untracked.Options{Jail: nativesearch.Jail{Workspace: workspace, Dest: p.Cwd, Usr: filepath.Join(l.spec.Root.Path, "usr"),
			UID: p.User.UID, GID: p.User.GID, Limits: untrackedLimits}, Parent: l.run.dir, GitConfig: gitConfig, Exclude: exclude, RefreshOff: refreshOff}
	}
	if err != nil {
		pr.reason = err.Error()
		close(pr.done)
		return pr
	}
	go func() {
		defer close(pr.done)
		pend, err := untracked.Start(o)
		if err != nil {
			pr.reason = err.Error()
			return
		}
		pr.pend = pend
	}()
	// Pushed before the build's own (startUntracked), so it runs after
	// the build ended: an unused jail is discarded, a used one is gone.
	l.cleanup.push("untracked cache jail", func() error {
		<-pr.done
		if pr.pend != nil {
			pr.pend.Close()
		}
		return nil
	})
	return pr
}

// discard ends pr's jail unused, once it is built, off the caller's path.
func (pr *untrackedPrep) discard() {
	go func() {
		<-pr.done
		if pr.pend != nil {
			pr.pend.Close()
		}
	}()
}

// startUntracked runs git in the prepared jail on the vouched index,
// beside the rest of the launch; finishUntracked waits for it. It reports
// whether it took the jail.
func (l *launch) startUntracked(st *fsmonitorState, pre *untrackedPrep, vouched []byte, tokenTime time.Time) bool {
	if ix, err := gitindex.Read(vouched); err != nil || len(ix.Entries) > MaxUntrackedEntries {
		st.untrackedReason = fmt.Sprintf("the index has more than %d entries", MaxUntrackedEntries)
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	st.untrackedDone = done
	go func() {
		defer close(done)
		<-pre.done
		if pre.pend == nil {
			st.untrackedReason = pre.reason
			return
		}
		sp, err := pre.pend.Finish(ctx, vouched, tokenTime)
		st.untrackedTime = time.Since(pre.start)
		if err != nil {
			st.untrackedReason = err.Error()
			return
		}
		st.untrackedIndex = sp.Index
		st.refreshed, st.refreshSkipped, st.refreshReason = sp.Refreshed, sp.Skipped, sp.RefreshReason
	}()
	l.cleanup.push("untracked cache build", func() error {
		cancel()
		<-done
		return nil
	})
	return true
}

// storeFile reads name (info/exclude, config) as the sandbox's git reads
// it from its commondir, the agent's Git store (the process's
// PASEO_GIT_COMMONDIR, a staged directory bind), through a descriptor
// opened beneath the bind without following a link. None is nil.
func (l *launch) storeFile(name string) ([]byte, error) {
	var dest string
	for _, kv := range l.spec.Process.Env {
		if v, ok := strings.CutPrefix(kv, "PASEO_GIT_COMMONDIR="); ok {
			dest = v
		}
	}
	var src string
	for _, b := range l.state.binds {
		if dest != "" && b.pin.Destination == dest && b.pin.Kind == string(pathsafe.Dir) {
			src = b.path
		}
	}
	if src == "" {
		return nil, nil
	}
	dfd, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxExcludeBytes {
		return nil, errors.New("not a regular file of at most 1 MiB")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxExcludeBytes+1))
	if err == nil && len(b) > maxExcludeBytes {
		err = errors.New("over 1 MiB")
	}
	return b, err
}

// untrackedResult is what the result says of the build: "built" or why
// not, and its wall time.
func (st *fsmonitorState) untrackedResult() (string, int64) {
	if st.untrackedDone != nil {
		select {
		case <-st.untrackedDone:
		default:
			return "the launch ended before the build", 0
		}
	}
	if st.untrackedIndex != nil {
		return "built", st.untrackedTime.Milliseconds()
	}
	if st.untrackedReason == "" {
		return "no vouched index", 0
	}
	return st.untrackedReason, st.untrackedTime.Milliseconds()
}

// scanConfig names what in the store's config (the agent's to write; the
// jailed git reads a scratch config instead) could make the sandbox's
// untracked scan differ from the jailed git's in a way Git's cache does
// not record: core.ignoreCase (the cache keeps no trace of it), an
// include (which could set it) or per-worktree config (the seed's
// config.worktree, read only with extensions.worktreeConfig). What the
// cache does record (core.excludesFile's hash, status.showUntrackedFiles
// as its flags) Git checks itself. A plain substring match: a false
// positive costs the cache, never a wrong answer.
func scanConfig(b []byte) string {
	low := strings.ToLower(string(b))
	for _, k := range []string{"ignorecase", "include", "worktreeconfig"} {
		if strings.Contains(low, k) {
			return k
		}
	}
	return ""
}

// convertConfig names what in the store's config could make the sandbox's
// git hash a file's bytes differently from the jailed git, which reads no
// store config: a filter driver, end-of-line conversion (core.autocrlf,
// core.eol) or another attributes file. The jailed git's refreshed
// entries (untracked.Spliced.Refreshed) are vouched for by its content
// comparison, so they are not taken then; the cache still is. A plain
// substring match, as scanConfig's: a false positive costs the refresh.
func convertConfig(b []byte) string {
	low := strings.ToLower(string(b))
	for _, k := range []string{"filter", "autocrlf", "eol", "attributesfile"} {
		if strings.Contains(low, k) {
			return k
		}
	}
	return ""
}

// finishUntracked waits for the untracked cache's build and, when it was
// built, writes the vouched index with it: before runsc starts, so before
// the start script copies the index.
func (l *launch) finishUntracked() error {
	st := l.state.fsmonitor
	if st == nil || st.untrackedDone == nil {
		return nil
	}
	t := time.Now()
	<-st.untrackedDone
	st.untrackedWait = time.Since(t)
	if st.untrackedIndex == nil {
		return nil
	}
	if err := l.run.writeFile(bundle.FSMonitorIndexFile, st.untrackedIndex, 0o644); err != nil {
		return fmt.Errorf("fsmonitor: writing the vouched index with its untracked cache: %w", err)
	}
	return nil
}

// serveFSMonitor listens on the gateway's monitor port, for the sandbox's
// address only (the compiled hook asks there, by the gateway's name).
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
			Unchanged: s.Unchanged, Degraded: s.Degraded, Refused: srv.Refused(),
			Vouched: st.vouched, NotVouched: st.notVouched, VouchReason: st.vouchReason}
		l.res.FSMonitor.Untracked, l.res.FSMonitor.UntrackedMillis = st.untrackedResult()
		l.res.FSMonitor.UntrackedWaitMillis = st.untrackedWait.Milliseconds()
		if st.untrackedIndex != nil {
			l.res.FSMonitor.Refreshed, l.res.FSMonitor.RefreshSkipped, l.res.FSMonitor.RefreshReason = st.refreshed, st.refreshSkipped, st.refreshReason
		}
		return err
	})
	st.srv = srv
	return nil
}

// FSMonitorStats are the monitor's counters at the end of a launch.
type FSMonitorStats struct {
	Lists, Everything, Events, Overflows, Refused uint64
	// Unchanged counts the close and attribute events left out: nothing
	// Git reads had changed (fsmonitor, times.go).
	Unchanged uint64
	Degraded  bool
	// Vouched and NotVouched count the index entries the vouched index
	// marks valid and not (fsmonitor/vouch); VouchReason says why none
	// was written (the sandbox's git then starts from the seed's index).
	Vouched, NotVouched int
	VouchReason         string `json:",omitempty"`
	// Untracked is "built" when the vouched index carries an untracked
	// cache the image's git built (fsmonitor/untracked), or why it does
	// not; UntrackedMillis is the build's wall time (from the jail's
	// start, beside the watcher's walk and the vouch, to the spliced
	// index) and
	// UntrackedWaitMillis what the start waited for it (the build runs
	// beside the network's setup: the rest is hidden).
	Untracked           string `json:",omitempty"`
	UntrackedMillis     int64  `json:",omitempty"`
	UntrackedWaitMillis int64  `json:",omitempty"`
	// Refreshed counts the entries not vouched for whose stat data the
	// build's git refreshed (it hashed them and found their objects) and
	// the index carries, marked valid; RefreshSkipped those it refreshed
	// that were not taken (racily clean, smudged); RefreshReason says why
	// none were looked at when the cache was built.
	Refreshed      int    `json:",omitempty"`
	RefreshSkipped int    `json:",omitempty"`
	RefreshReason  string `json:",omitempty"`
}
