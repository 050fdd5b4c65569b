// Package launcher runs a compiled bundle under the pinned runsc with fixed
// flags, injects secrets into a private copy of the bundle, owns the
// agent's stdio, enforces wall time and output limits, and tears everything
// down. It never runs the agent outside runsc: when something cannot be
// enforced it returns an *UnavailableError and nothing runs.
package launcher

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/grant"
	"paseo.dev/paseo-policy/internal/childproc"
	"paseo.dev/paseo-policy/launcher/preflight"
	"paseo.dev/paseo-policy/launcher/routeproxy"
	"paseo.dev/paseo-policy/launcher/sandboxnet"
)

// DefaultStateRoot is where the launcher keeps run dirs and runsc state.
const DefaultStateRoot = "/run/paseo-sandbox"

// UnavailableError means the sandbox cannot run here. The agent was not
// started; running it locally instead is the caller's explicit choice.
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string {
	return "sandbox-unavailable: " + e.Reason + " (the agent was not started; a local retry is the caller's explicit choice)"
}

// Options configure one launch.
type Options struct {
	BundleDir string
	// ID is the runsc container id; empty means a fresh random one. runsc
	// deletes the first container's state when create reuses an id, so ids
	// are never reused while a container exists.
	ID        string
	StateRoot string
	RunscPath string
	// Secrets resolves a secretRef to its value.
	Secrets SecretSource
	// MCPToken holds the daemon's current MCP bearer for the route proxy,
	// which adds it to every request it forwards; the caller may Set a new
	// one at any time (the supervisor's holder does when the daemon
	// reattaches after a restart). Nil: the launcher reads it once from
	// Secrets under the route's tokenRef (paseo-policy launch, no daemon).
	// Either way it never enters the sandbox or the run dir.
	MCPToken *routeproxy.Token
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
	// Grace is how long a container gets between SIGTERM and SIGKILL.
	Grace time.Duration
	// Uplink is the network namespace sandbox veth peers live in (network
	// mode sandbox); empty means the launcher's own. Pool is the address
	// range for sandbox links (zero: sandboxnet.DefaultPool). Resolve
	// resolves egress host names on the trusted side (nil: the system's).
	Uplink  string
	Pool    netip.Prefix
	Resolve sandboxnet.Resolver
	// NetCaps bounds the sandbox's connections (zero: sandboxnet.DefaultCaps).
	NetCaps sandboxnet.Caps
	// OnNetwork, when set, is called once the sandbox network exists and
	// before runsc starts (tests read counters and addresses from it).
	OnNetwork func(*sandboxnet.Network)
	// OnStart, when set, is called once runsc has started: from then on
	// Launch only returns when the sandbox has ended.
	OnStart func()

	// afterStaging, in tests, runs once the bind sources are staged.
	afterStaging func(runDir string)
}

// Result is how a launch ended.
type Result struct {
	ID       string `json:"id"`
	ExitCode int    `json:"exitCode"`
	// Reason is set when the launcher ended the sandbox (wall time,
	// output, memory).
	Reason string `json:"reason,omitempty"`
	// Packets counts, per rule tag, what the sandbox's packet filter saw
	// (sandbox mode): evidence of blocked attempts for the operator.
	Packets map[string]uint64 `json:"packets,omitempty"`
	// Routes counts, per private route, requests forwarded to the daemon
	// and requests refused by the proxy.
	Routes map[string]RouteStats `json:"routes,omitempty"`
}

// RouteStats is what one route proxy did.
type RouteStats struct {
	Forwarded int64 `json:"forwarded"`
	Refused   int64 `json:"refused"`
	// OutOfScope are the refused requests whose JSON-RPC body was
	// malformed or outside the MCP scope; Filtered the tools dropped from
	// tools/list answers.
	OutOfScope int64 `json:"outOfScope,omitempty"`
	Filtered   int64 `json:"filtered,omitempty"`
	// RefusedConns are connections past the proxy's cap, closed at accept;
	// Cut requests ended before the guard (headers too large or too slow).
	RefusedConns int64 `json:"refusedConns,omitempty"`
	Cut          int64 `json:"cut,omitempty"`
}

// startRoute runs the proxy of one private route on the sandbox's gateway.
func startRoute(n *sandboxnet.Network, r bundle.Route, tok *routeproxy.Token) (*routeproxy.Proxy, error) {
	proxy, err := routeproxy.New(r, routeproxy.Limits{}, tok)
	if err != nil {
		return nil, err
	}
	l, err := n.ListenGateway(r.Port)
	if err != nil {
		return nil, fmt.Errorf("route %s: listening on the gateway: %w", r.Purpose, err)
	}
	proxy.Serve(l)
	return proxy, nil
}

// routeToken is where the route's proxy finds the daemon's bearer: the
// caller's holder, or (none given) a holder filled once from the secrets
// under the route's tokenRef. The value stays in this process. Without
// the generated MCP config nothing in the sandbox is set up to use the
// route, so a token that cannot be found leaves the holder empty (the
// route answers 503); with it, the launch is refused, as a missing
// credential is, rather than start an agent whose Paseo tools all fail.
func routeToken(opts Options, files bundle.Files, deployment string, r bundle.Route) (*routeproxy.Token, error) {
	if opts.MCPToken != nil {
		return opts.MCPToken, nil
	}
	_, configured := files[bundle.MCPConfigFile]
	if r.TokenRef == "" || opts.Secrets == nil {
		if !configured {
			return &routeproxy.Token{}, nil
		}
		return nil, fmt.Errorf("route %s: no daemon token was handed over and no secret source holds its tokenRef", r.Purpose)
	}
	v, err := opts.Secrets(deployment, r.TokenRef)
	if err != nil {
		if !configured {
			return &routeproxy.Token{}, nil
		}
		return nil, fmt.Errorf("route %s: %w", r.Purpose, err)
	}
	defer clear(v)
	tok := &routeproxy.Token{}
	if err := tok.Set(v); err != nil {
		return nil, fmt.Errorf("route %s: secret %s: %w", r.Purpose, r.TokenRef, err)
	}
	return tok, nil
}

// Launch runs the bundle to completion.
func Launch(ctx context.Context, opts Options) (res Result, err error) {
	if opts.StateRoot == "" {
		opts.StateRoot = DefaultStateRoot
	}
	if opts.ID == "" {
		opts.ID = newID()
	}
	if opts.Grace == 0 {
		opts.Grace = 2 * time.Second
	}
	res = Result{ID: opts.ID}
	// Read once: preflight verifies these bytes, and only these run.
	files, err := bundle.Read(opts.BundleDir)
	if err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	pre := preflightOptions(opts)
	pre.Bundle = files
	report := preflight.Run(pre)
	if !report.OK() {
		return res, &UnavailableError{Reason: report.Err().Error()}
	}
	m, err := files.Manifest()
	if err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	eg, err := files.Egress()
	if err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	if eg.Mode != "none" && eg.Mode != "sandbox" {
		return res, &UnavailableError{Reason: fmt.Sprintf("network mode %q is not one this launcher enforces", eg.Mode)}
	}
	limits := launcherLimits(m.Grants)

	rs := &runsc{path: opts.RunscPath, root: filepath.Join(opts.StateRoot, "runsc"), network: eg.Mode}
	if err := os.MkdirAll(rs.root, 0o700); err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	run, err := newRunDir(opts.StateRoot, opts.ID)
	if err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	// runsc's create with an id it already knows deletes the first
	// container's state and orphans it, so an id runsc knows is refused
	// even when this launcher has no record of it.
	if known, err := rs.knows(opts.ID); err != nil || known {
		run.remove()
		if err == nil {
			err = fmt.Errorf("container id %s already exists in the runsc root", opts.ID)
		}
		return res, &UnavailableError{Reason: err.Error()}
	}
	rec := Record{ID: opts.ID, Bundle: opts.BundleDir, Profile: m.Profile, Agent: m.Agent, Deployment: m.Deployment,
		Network: eg.Mode, Uplink: opts.Uplink, Started: time.Now().UTC(),
		LauncherPID: os.Getpid(), LauncherStart: processStart(os.Getpid())}
	if err := writeRecord(opts.StateRoot, rec); err != nil {
		run.remove()
		return res, &UnavailableError{Reason: err.Error()}
	}
	defer removeRecord(opts.StateRoot, opts.ID)
	defer run.remove()
	if err := run.materialize(files, opts.Secrets); err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	spec := runtimeState{cgroupsPath: CgroupsPath(opts.ID), privateRoot: true}
	if spec.binds, err = run.stageBinds(files); err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	if opts.afterStaging != nil {
		opts.afterStaging(run.dir)
	}
	if eg.Mode == "sandbox" {
		net, err := sandboxnet.Setup(ctx, sandboxnet.Config{ID: opts.ID, Egress: *eg, StateDir: filepath.Join(opts.StateRoot, "net"),
			Uplink: opts.Uplink, Pool: opts.Pool, Resolve: opts.Resolve, Caps: opts.NetCaps})
		if err != nil {
			return res, &UnavailableError{Reason: "sandbox network: " + err.Error()}
		}
		defer func() {
			res.Packets, _ = net.Counters()
			_ = net.Teardown()
		}()
		hosts, err := net.Hosts(files[bundle.HostsFile])
		if err != nil {
			return res, &UnavailableError{Reason: "pinning egress hosts: " + err.Error()}
		}
		if err := run.writeFile(bundle.HostsFile, hosts, 0o644); err != nil {
			return res, &UnavailableError{Reason: err.Error()}
		}
		spec.netnsPath = net.NetnsPath
		for _, r := range eg.Routes {
			tok, err := routeToken(opts, files, m.Deployment, r)
			if err != nil {
				return res, &UnavailableError{Reason: err.Error()}
			}
			proxy, err := startRoute(net, r, tok)
			if err != nil {
				return res, &UnavailableError{Reason: err.Error()}
			}
			defer func() {
				_ = proxy.Close()
				if res.Routes == nil {
					res.Routes = map[string]RouteStats{}
				}
				res.Routes[r.Purpose] = RouteStats{Forwarded: proxy.Stats.Forwarded.Load(), Refused: proxy.Stats.Refused.Load(),
					OutOfScope: proxy.Stats.OutOfScope.Load(), Filtered: proxy.Stats.Filtered.Load(),
					RefusedConns: proxy.Stats.RefusedConns.Load(), Cut: proxy.Stats.Cut.Load()}
			}()
		}
		if opts.OnNetwork != nil {
			opts.OnNetwork(net)
		}
	}
	memLimit, err := run.patchSpec(spec)
	if err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	memcg, err := prepareMemoryCgroup(opts.ID, memLimit)
	if err != nil {
		return res, &UnavailableError{Reason: err.Error()}
	}
	if memcg != nil {
		defer memcg.remove() // after runsc delete (deferred below) has ended every process
	}

	defer rs.cleanup(opts.ID)

	wall := ctx
	if limits.wall > 0 {
		var cancel context.CancelFunc
		wall, cancel = context.WithTimeout(ctx, limits.wall)
		defer cancel()
	}
	out := &limitWriter{w: orDiscard(opts.Stdout), limit: limits.output}
	errw := &limitWriter{w: orDiscard(opts.Stderr), limit: limits.output, shared: out}
	stop := make(chan string, 2)
	out.onLimit = func() { stop <- "output limit exceeded" }
	errw.onLimit = out.onLimit

	cmd := rs.command(opts.ID, run.dir)
	// stdin goes through a pipe the launcher owns, not exec's copier: Wait
	// would otherwise wait for the caller's reader to end, so an agent that
	// exits (or is stopped) while its client keeps stdin open would hang
	// the launch. The copier may outlive Launch until the caller closes its
	// reader; writes after the agent is gone fail harmlessly.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return res, &UnavailableError{Reason: "stdin pipe: " + err.Error()}
	}
	defer stdinW.Close()
	cmd.Stdin = stdinR
	cmd.Stdout = out
	cmd.Stderr = errw
	waited, err := childproc.Start(cmd)
	if err != nil {
		stdinR.Close()
		return res, &UnavailableError{Reason: "starting runsc: " + err.Error()}
	}
	stdinR.Close() // runsc holds its own copy
	if opts.OnStart != nil {
		opts.OnStart()
	}
	go func() {
		if opts.Stdin != nil {
			_, _ = io.Copy(stdinW, opts.Stdin)
		}
		stdinW.Close() // EOF for the agent
	}()
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		err := <-waited
		close(exited)
		done <- err
	}()
	var polledOOM atomic.Uint64
	if memcg == nil {
		go pollOOM(opts.ID, exited, &polledOOM)
	}

	var waitErr error
	select {
	case waitErr = <-done:
	case <-wall.Done():
		res.Reason = "wall time exceeded"
		if ctx.Err() != nil {
			res.Reason = "cancelled"
		}
		waitErr = rs.stop(opts.ID, cmd, done, opts.Grace)
	case why := <-stop:
		res.Reason = why
		waitErr = rs.stop(opts.ID, cmd, done, opts.Grace)
	}
	res.ExitCode = exitCode(waitErr)
	if res.Reason == "" && ((memcg != nil && memcg.oomKills() > 0) || polledOOM.Load() > 0) {
		res.Reason = "memory limit exceeded: the kernel killed the sandbox"
	}
	return res, nil
}

// preflightOptions are the checks a launch runs: everything doctor checks
// but the nftables probe (network none uses no filter; in sandbox mode
// programming the real rules proves nftables and fails closed), with the
// runsc and EROFS digests cached in the state root.
func preflightOptions(opts Options) preflight.Options {
	return preflight.Options{RunscPath: opts.RunscPath, BundleDir: opts.BundleDir,
		DigestCache: filepath.Join(opts.StateRoot, "runsc-digest.json"), ImageDigestCache: filepath.Join(opts.StateRoot, "image-digests"),
		SkipNftablesProbe: true}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "pp-" + hex.EncodeToString(b[:])
}

type limits struct {
	wall   time.Duration
	output int64
}

// launcherLimits reads the limits the launcher enforces from the grants.
func launcherLimits(gs []grant.Grant) limits {
	var l limits
	for _, g := range gs {
		if g.Kind != grant.Limit {
			continue
		}
		n, _ := strconv.ParseInt(g.Value, 10, 64)
		switch g.Subject {
		case "wallSeconds":
			l.wall = time.Duration(n) * time.Second
		case "outputBytes":
			l.output = n
		}
	}
	return l
}

// limitWriter passes output through and calls onLimit once when the total
// across it and shared passes limit; output past the limit is dropped.
// stdout and stderr have one limitWriter each, written by exec's two
// copiers at once, so the shared total is counted under the total's lock.
type limitWriter struct {
	w       io.Writer
	limit   int64
	shared  *limitWriter
	onLimit func()

	mu    sync.Mutex // of the total: guards n and fired
	n     int64
	fired bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	total := l
	if l.shared != nil {
		total = l.shared
	}
	total.mu.Lock()
	if total.limit > 0 && total.n+int64(len(p)) > total.limit {
		fire := !total.fired
		total.fired = true
		total.mu.Unlock()
		if fire && l.onLimit != nil {
			l.onLimit()
		}
		return len(p), nil
	}
	total.n += int64(len(p))
	total.mu.Unlock()
	_, err := l.w.Write(p)
	return len(p), err
}

// runDir is the private, root-only copy of a bundle a launch runs from.
type runDir struct {
	dir  string
	root string // the private overlay root, while mounted
}

func newRunDir(stateRoot, id string) (*runDir, error) {
	if strings.ContainsAny(id, "/\x00") || id == "" || id == "." || id == ".." {
		return nil, fmt.Errorf("invalid container id")
	}
	base := filepath.Join(stateRoot, "run")
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(stateRoot, 0o700); err != nil {
		return nil, err
	}
	dir := filepath.Join(base, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run dir for %s: %w (is the id in use?)", id, err)
	}
	return &runDir{dir: dir}, nil
}

// materialize writes the bundle into the run dir with its secret slots
// filled (secretslots.go); the reviewed bundle itself is never modified.
func (r *runDir) materialize(files bundle.Files, secrets SecretSource) error {
	filled, err := fillSecrets(files, secrets)
	if err != nil {
		return err
	}
	for _, name := range bundle.SecretFiles {
		out, ok := filled[name]
		if !ok {
			continue
		}
		// config.json is read by runsc as root; the MCP config by the agent
		// through the gofer, so it is readable inside the sandbox. The run
		// dir itself (0700) keeps both from everyone else on the host.
		mode := os.FileMode(0o600)
		if name != bundle.ConfigFile {
			mode = 0o444
		}
		if err := r.writeFile(name, out, mode); err != nil {
			return err
		}
	}
	for _, name := range []string{bundle.HostsFile, bundle.ResolvFile} {
		// Readable by the sandbox user through the gofer.
		if err := r.writeFile(name, files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (r *runDir) writeFile(name string, data []byte, mode os.FileMode) error {
	p := filepath.Join(r.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.WriteFile(p, data, mode)
}

func (r *runDir) remove() {
	r.unmountRoot()
	_ = removeRunDir(r.dir) // what it cannot remove, gc reports
}

// runsc drives the pinned binary with fixed flags only.
type runsc struct {
	path    string
	root    string
	network string
}

func (r *runsc) flags() []string {
	// Fixed, reviewed flags: private state root, the bundle's network mode,
	// default platform, no directfs.
	return []string{"--root", r.root, "--network=" + r.network, "--directfs=false"}
}

func (r *runsc) command(id, bundleDir string) *exec.Cmd {
	args := append(r.flags(), "run", "--bundle", bundleDir, id)
	cmd := exec.Command(r.path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

func (r *runsc) run(args ...string) error {
	cmd := exec.Command(r.path, append(r.flags(), args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// knows reports whether the runsc root has a container with this id. It
// looks for runsc's own state file, "<id>_sandbox:<sandbox id>.state",
// instead of running `runsc list` (6 ms, most of what a launch adds to a
// bare runsc run). The layout is the pinned runsc's;
// TestGCHalfCreatedAndDuplicateID fails if a new runsc changes it.
func (r *runsc) knows(id string) (bool, error) {
	ents, err := os.ReadDir(r.root)
	if err != nil {
		return false, fmt.Errorf("runsc root: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), id+"_sandbox:") {
			return true, nil
		}
	}
	return false, nil
}

// pollOOM records the container's OOM kill count while it runs, for hosts
// where runsc owns (and on exit removes) the memory cgroup.
func pollOOM(id string, exited <-chan struct{}, n *atomic.Uint64) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if k := oomKills(id); k > n.Load() {
			n.Store(k)
		}
		select {
		case <-t.C:
		case <-exited:
			return
		}
	}
}

// stop asks the container to end, then kills runsc's process group, which
// takes the sandbox and gofer with it.
func (r *runsc) stop(id string, cmd *exec.Cmd, done <-chan error, grace time.Duration) error {
	_ = r.run("kill", id, "SIGTERM")
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
	}
	_ = r.run("kill", "--all", id, "SIGKILL")
	_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	return <-done
}

// cleanup deletes the container state and unmounts what runsc leaves
// behind under its root (it leaves an nsfs mount at <root>/null-netns).
func (r *runsc) cleanup(id string) {
	_ = r.run("delete", "--force", id)
	unmountBeneath(r.root)
}

func unmountBeneath(root string) {
	points, _ := mountPoints()
	var targets []string
	for _, p := range points {
		if p == root || strings.HasPrefix(p, root+"/") {
			targets = append(targets, p)
		}
	}
	for i := len(targets) - 1; i >= 0; i-- {
		_ = unix.Unmount(targets[i], unix.MNT_DETACH)
	}
}
