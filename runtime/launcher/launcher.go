// Package launcher runs a compiled bundle under the pinned runsc with fixed
// flags, injects secrets into a private copy of the bundle, owns the
// agent's stdio, enforces wall time and output limits, and tears everything
// down. It never runs the agent outside runsc: when something cannot be
// enforced it returns an *UnavailableError and nothing runs.
package launcher

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// DefaultStateRoot is where the launcher keeps run dirs and runsc state.
const DefaultStateRoot = "/run/paseo-sandbox"

// UnavailableError means the sandbox cannot run here. The agent was not
// started; running it locally instead is the caller's explicit choice.
// Err is the phase's error, kept whole: errors.Is and errors.As see the
// launcher's sentinels (ErrAuthFileInUse, ErrSecretUnknown, ...) through
// it; Reason is what the caller is told, Err's text with the step.
type UnavailableError struct {
	Reason string
	Err    error
}

func (e *UnavailableError) Error() string {
	return "sandbox-unavailable: " + e.Reason + " (the agent was not started; a local retry is the caller's explicit choice)"
}

func (e *UnavailableError) Unwrap() error { return e.Err }

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
	// ModelKey returns the provider key for the model route (api-key
	// mode), at every request: the supervisor's holder reads its secrets
	// dir, or serves the copy it was handed at start and at each wake.
	// Nil: the route reads the key from Secrets under its tokenRef at
	// every request, so a key rotated in the secrets dir is the one the
	// next request carries. Either way the key never enters the sandbox,
	// the bundle or the run dir.
	ModelKey func() ([]byte, error)
	// ModelRoots, when set, verify the model provider's certificate
	// instead of the system trust store. Only tests set it (the fake
	// model's test CA).
	ModelRoots *x509.CertPool
	Stdin      io.Reader
	Stdout     io.Writer
	Stderr     io.Writer
	// Log takes the launcher's own diagnostics, one line each: a teardown
	// step that failed (Result.Teardown has them as data). Never the
	// agent's output. Nil: the process's stderr.
	Log io.Writer
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

	// OutputBefore is what the sandbox wrote (stdout and stderr) before
	// this launch, for a wake (hibernate.go): outputBytes counts it all.
	OutputBefore int64

	// afterStaging, in tests, runs once the bind sources are staged.
	afterStaging func(runDir string)
	// undoFault, in tests, fails the teardown steps it returns an error
	// for (cleanupStack.fault).
	undoFault func(step string) error
}

// Result is how a launch ended.
type Result struct {
	ID       string `json:"id"`
	ExitCode int    `json:"exitCode"`
	// Reason is set when the launcher ended the sandbox (wall time,
	// output, memory).
	Reason string `json:"reason,omitempty"`
	// Limit is the limit the sandbox was ended at (LimitWall, LimitOutput,
	// LimitMemory), for callers to match instead of Reason; empty
	// otherwise.
	Limit string `json:"limit,omitempty"`
	// Packets counts, per rule tag, what the sandbox's packet filter saw
	// (sandbox mode): evidence of blocked attempts for the operator.
	Packets map[string]uint64 `json:"packets,omitempty"`
	// Routes counts, per private route, requests forwarded to the daemon
	// and requests refused by the proxy.
	Routes map[string]RouteStats `json:"routes,omitempty"`
	// FSMonitor is the workspace monitor's counters, when the plan grants
	// it (fsmonitor.go).
	FSMonitor *FSMonitorStats `json:"fsmonitor,omitempty"`
	// NativeSearch is the search server's counters, when the plan grants
	// the search (nativesearch.go).
	NativeSearch *nativesearch.Stats `json:"nativeSearch,omitempty"`
	// Teardown lists the teardown steps that failed, in the order they
	// ran; every other step still ran. What a failed step left is
	// garbage: the record, kept with these failures, lets ps show it and
	// gc remove it.
	Teardown []UndoFailure `json:"teardown,omitempty"`
}

// The limits a Result's Limit names, by their names in the facts and the
// registry (limits.<name>).
const (
	LimitWall   = "wallSeconds"
	LimitOutput = "outputBytes"
	LimitMemory = "memoryBytes"
)

// RouteStats is what one route proxy did: the execution seam's neutral
// counters (execution.RouteStats), which the launcher fills.
type RouteStats = execution.RouteStats

// SearchStats is what the native search's server did, as the execution
// seam reports it (execution.SearchStats; Result.NativeSearch is the
// server's own counters).
type SearchStats = execution.SearchStats

// Launch runs the bundle to completion, in phases (prepare, network,
// start, wait, teardown). Each phase pushes the undo of what it makes onto
// the launch's cleanup stack, and teardown runs the stack whether a phase
// failed or the sandbox ended, so the teardown order is the stack's:
//
//   - the stdin pipe's write end and the wall-time timer;
//   - runsc delete --force, then what runsc leaves mounted under its root;
//   - the memory cgroup (cgroup v1), once runsc delete has ended every
//     process in it;
//   - each route proxy, last started first, its counters into Result.Routes;
//   - the sandbox network, its packet counters into Result.Packets first;
//   - the run dir, with its private root overlay;
//   - the record, last: it is how gc finds everything above it; when a
//     step above failed it is kept, naming the failures, so ps and gc
//     show the sandbox.
//
// Every step runs even when one before it failed; the failures go into
// Result.Teardown and a line each to Options.Log. Nothing a launch makes
// outlives it, so nothing is released. An error from any phase means
// runsc never started, and Launch turns it into an *UnavailableError here
// and nowhere else; once runsc has started, how the sandbox ended is the
// Result.
func Launch(ctx context.Context, opts Options) (res Result, err error) {
	l := newLaunch(opts)
	defer func() {
		l.teardown()
		res = l.res
	}()
	if err := l.phases(ctx); err != nil {
		err = coded(err)
		return res, &UnavailableError{Reason: err.Error(), Err: err}
	}
	return res, nil
}

// launch is one run of a bundle: what each phase made, for the phases
// after it and for the undos on cleanup.
type launch struct {
	opts    Options
	res     Result
	cleanup cleanupStack

	plan  *launchplan.Plan // the bundle read once and verified
	files bundle.Files     // plan.Files
	m     *bundle.Manifest // plan.Manifest
	// limits are the plan's, with a wake's wall time already run taken off.
	limits launchplan.Limits
	rs     *runsc.Runner
	run    *runDir
	// spec is the run copy of config.json, patched in memory and written
	// once at start (runstate.go); state holds what the phases learn for it.
	spec  *rspec.Spec
	state runtimeState
	memcg *memoryCgroup
	// polledOOM counts OOM kills where runsc owns the memory cgroup.
	polledOOM atomic.Uint64
	// wake, when set, restores a checkpoint instead of starting the agent
	// (hibernate.go).
	wake *wake
	// authLock is held for the sandbox's life in oauth-file mode
	// (authlock.go).
	authLock *authLock
}

// running is a started runsc and what the wait phase watches.
type running struct {
	proc *runsc.Proc
	wall context.Context // ends at the wall-time limit or with the caller's
	stop <-chan string   // the output limit was passed (the reason)
	done <-chan error    // runsc's wait
}

func newLaunch(opts Options) *launch {
	if opts.StateRoot == "" {
		opts.StateRoot = DefaultStateRoot
	}
	if opts.ID == "" {
		opts.ID = newID()
	}
	if opts.Grace == 0 {
		opts.Grace = 2 * time.Second
	}
	if opts.Log == nil {
		opts.Log = os.Stderr
	}
	return &launch{opts: opts, res: Result{ID: opts.ID}, cleanup: cleanupStack{fault: opts.undoFault}}
}

func (l *launch) phases(ctx context.Context) error {
	if err := l.prepare(); err != nil {
		return err
	}
	if l.plan.Network == "sandbox" {
		if err := l.network(ctx); err != nil {
			return err
		}
	}
	r, err := l.start(ctx)
	if err != nil {
		return err
	}
	l.wait(ctx, r)
	return nil
}

// prepare reads the bundle once into a verified launch plan, claims the
// id, writes the record and fills the run dir: the secrets materialized
// and the bind sources staged. Every later step works from the plan; none
// opens the bundle again.
func (l *launch) prepare() error {
	plan, err := launchplan.Load(l.opts.BundleDir)
	if err != nil {
		return refused(diag.LaunchBundle, "bundle", err)
	}
	pre := preflightOptions(l.opts)
	pre.Plan = plan
	if report := preflight.Run(pre); !report.OK() {
		return report.Err()
	}
	// The report is OK only if the validator had no finding, so every
	// decoded field is set.
	l.plan, l.files, l.m = plan, plan.Files, plan.Manifest
	if plan.Network != "none" && plan.Network != "sandbox" {
		return refused(diag.LaunchBundle, "bundle", fmt.Errorf("network mode %q is not one this launcher enforces", plan.Network))
	}
	if plan.FSMonitor != nil && plan.Network != "sandbox" {
		return refused(diag.LaunchBundle, "bundle", fmt.Errorf("%w (this bundle's is %q)", ErrFSMonitorNoGateway, plan.Network))
	}
	if plan.Search != nil && plan.Network != "sandbox" {
		return refused(diag.LaunchBundle, "bundle", fmt.Errorf("%w (this bundle's is %q)", ErrNativeSearchNoGateway, plan.Network))
	}
	l.limits = plan.Limits
	l.rs = &runsc.Runner{Path: l.opts.RunscPath, Root: statedir.RunscRoot(l.opts.StateRoot), Network: plan.Network}
	if err := os.MkdirAll(l.rs.Root, 0o700); err != nil {
		return err
	}
	// Before anything is made: its undo goes under the record's, so the
	// lock is released last (authlock.go).
	if err := l.lockAuthFile(); err != nil {
		return err
	}
	if err := l.claim(); err != nil {
		return err
	}
	if l.spec, err = l.run.materialize(plan); err != nil {
		return err
	}
	l.state = runtimeState{cgroupsPath: statedir.CgroupsPath(l.opts.ID), privateRoot: true}
	if l.state.binds, err = l.run.stageBinds(plan); err != nil {
		return err
	}
	if err := l.checkAuthFileStaged(); err != nil {
		return err
	}
	if plan.FSMonitor != nil {
		if err := l.startFSMonitor(); err != nil {
			return err
		}
	}
	if plan.Search != nil {
		if err := l.startNativeSearch(); err != nil {
			return err
		}
	}
	if l.opts.afterStaging != nil {
		l.opts.afterStaging(l.run.dir)
	}
	return nil
}

// claim makes the run dir, whose exclusive mkdir claims the id, refuses
// an id runsc knows, and writes the record. The run dir is made first but
// its undo goes on the launch's stack after the record's, so the record
// is removed last.
func (l *launch) claim() error {
	run, err := newRunDir(l.opts.StateRoot, l.opts.ID)
	if err != nil {
		return idRefused(err)
	}
	undoRun := func(err error) error {
		if rerr := run.remove(); rerr != nil {
			return fmt.Errorf("%w (undoing the run dir: %v)", err, rerr)
		}
		return err
	}
	// runsc's create with an id it already knows deletes the first
	// container's state and orphans it, so an id runsc knows is refused
	// even when this launcher has no record of it.
	if known, err := l.rs.Knows(l.opts.ID); err != nil || known {
		if err == nil {
			err = refused(diag.LaunchID, "id", fmt.Errorf("container id %s already exists in the runsc root", l.opts.ID))
		}
		return undoRun(err)
	}
	rec := statedir.Record{ID: l.opts.ID, Bundle: l.opts.BundleDir, Profile: l.m.Profile, Agent: l.m.Agent, Deployment: l.m.Deployment,
		Network: l.plan.Network, Uplink: l.opts.Uplink, Started: time.Now().UTC(), RanBefore: l.ranBefore(),
		LauncherPID: os.Getpid(), LauncherStart: statedir.ProcessStart(os.Getpid())}
	if err := statedir.WriteRecord(l.opts.StateRoot, rec); err != nil {
		return undoRun(idRefused(err))
	}
	stateRoot := l.opts.StateRoot
	l.cleanup.push("record", func() error {
		if failed := l.cleanup.failures(); len(failed) > 0 {
			return statedir.KeepFailedRecord(stateRoot, rec, failed)
		}
		return statedir.RemoveRecord(stateRoot, rec.ID)
	})
	l.cleanup.push("run dir", run.remove)
	l.run = run
	return nil
}

// network (mode sandbox) builds the sandbox's network, pins the egress
// hosts into the run dir's hosts file and starts a proxy per private route.
func (l *launch) network(ctx context.Context) error {
	var gatewayPorts []int
	if l.state.fsmonitor != nil {
		gatewayPorts = []int{l.state.fsmonitor.port}
	}
	if l.state.search != nil {
		gatewayPorts = append(gatewayPorts, l.state.search.port)
	}
	net, err := sandboxnet.Setup(ctx, sandboxnet.Config{ID: l.opts.ID, Egress: *l.plan.Egress, StateDir: statedir.NetDir(l.opts.StateRoot),
		Uplink: l.opts.Uplink, Pool: l.opts.Pool, Link: l.wakeLink(), Resolve: l.opts.Resolve, Caps: l.opts.NetCaps, GatewayPorts: gatewayPorts})
	if err != nil {
		return fmt.Errorf("sandbox network: %w", err)
	}
	l.cleanup.push("sandbox network", func() error {
		// The counters are evidence for the result, read while they
		// exist; not reading them undoes nothing.
		l.res.Packets, _ = net.Counters()
		l.keepLinkIfHibernated(net)
		return net.Teardown()
	})
	hosts, err := net.Hosts(l.files[bundle.HostsFile], l.plan.Egress.Gateway)
	if err != nil {
		return fmt.Errorf("pinning egress hosts: %w", err)
	}
	if err := l.run.writeFile(bundle.HostsFile, hosts, 0o644); err != nil {
		return err
	}
	l.state.netnsPath = net.NetnsPath
	for _, r := range l.plan.Routes {
		var proxy *routeproxy.Proxy
		if r.Purpose == grant.RouteModel {
			proxy, err = l.startModelRoute(net, r)
		} else {
			var tok *routeproxy.Token
			if tok, err = routeToken(l.opts, l.files, l.m.Deployment, r); err == nil {
				proxy, err = startRoute(net, r, tok)
			}
		}
		if err != nil {
			return err
		}
		l.cleanup.push("route "+string(r.Purpose), func() error {
			err := proxy.Close()
			l.recordRoute(r.Purpose, proxy)
			return err
		})
	}
	if l.state.fsmonitor != nil {
		if err := l.serveFSMonitor(net); err != nil {
			return err
		}
	}
	if l.state.search != nil {
		if err := l.serveNativeSearch(net); err != nil {
			return err
		}
	}
	if l.opts.OnNetwork != nil {
		l.opts.OnNetwork(net)
	}
	return nil
}

// teardown undoes everything the phases made, last made first, and
// reports every step that failed: in the result, and a line each in the
// launcher's log.
func (l *launch) teardown() {
	l.res.Teardown = l.cleanup.run()
	logFailures(l.opts.Log, l.opts.ID, l.res.Teardown)
}

// start fills the launch-time fields into the run copy of config.json and
// writes it, makes the memory cgroup and starts runsc with the launcher's
// stdio.
func (l *launch) start(ctx context.Context) (*running, error) {
	if err := l.finishUntracked(); err != nil {
		return nil, err
	}
	if err := l.run.writeSpec(l.spec, l.state); err != nil {
		return nil, err
	}
	var err error
	if l.memcg, err = prepareMemoryCgroup(l.opts.ID, l.limits.Memory); err != nil {
		return nil, err
	}
	if memcg := l.memcg; memcg != nil {
		l.cleanup.push("memory cgroup", memcg.remove) // runs after runsc delete, pushed next
	}
	id := l.opts.ID
	l.cleanup.push("runsc delete", func() error { return l.rs.Delete(id) })

	r := &running{wall: ctx}
	if l.limits.Wall > 0 {
		var cancel context.CancelFunc
		r.wall, cancel = context.WithTimeout(ctx, l.limits.Wall)
		l.cleanup.push("wall timer", func() error { cancel(); return nil })
	}
	out := &limitWriter{w: orDiscard(l.opts.Stdout), limit: l.limits.Output, n: l.opts.OutputBefore}
	errw := &limitWriter{w: orDiscard(l.opts.Stderr), limit: l.limits.Output, shared: out}
	stop := make(chan string, 2)
	out.onLimit = func() { stop <- "output limit exceeded" }
	errw.onLimit = out.onLimit
	r.stop = stop

	// stdin goes through a pipe the launcher owns, not exec's copier: Wait
	// would otherwise wait for the caller's reader to end, so an agent that
	// exits (or is stopped) while its client keeps stdin open would hang
	// the launch. The copier may outlive Launch until the caller closes its
	// reader; writes after the agent is gone fail harmlessly.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	// The copier below closes it too; whichever close comes second fails
	// harmlessly, so this undo reports nothing.
	l.cleanup.push("stdin", func() error { stdinW.Close(); return nil })
	proc, waited, err := l.rs.Start(id, l.run.dir, l.imageDir(), runsc.Stdio{In: stdinR, Out: out, Err: errw})
	stdinR.Close() // runsc, if it started, holds its own copy
	if err != nil {
		return nil, fmt.Errorf("starting runsc: %w", err)
	}
	r.proc = proc
	if l.opts.OnStart != nil {
		l.opts.OnStart()
	}
	go func() {
		if l.opts.Stdin != nil {
			_, _ = io.Copy(stdinW, l.opts.Stdin)
		}
		stdinW.Close() // EOF for the agent
	}()
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		err := <-waited
		close(exited)
		done <- err
	}()
	r.done = done
	if l.memcg == nil {
		go pollOOM(id, exited, &l.polledOOM)
	}
	return r, nil
}

// wait returns once the sandbox has ended: by itself, or stopped by the
// launcher at the wall-time or output limit or when ctx ends. The exit
// code and the launcher's reason go into the result.
func (l *launch) wait(ctx context.Context, r *running) {
	var waitErr error
	select {
	case waitErr = <-r.done:
	case <-r.wall.Done():
		l.res.Reason, l.res.Limit = "wall time exceeded", LimitWall
		if ctx.Err() != nil {
			l.res.Reason, l.res.Limit = "cancelled", ""
		}
		waitErr = l.rs.Stop(l.opts.ID, r.proc, r.done, l.opts.Grace)
	case why := <-r.stop:
		l.res.Reason, l.res.Limit = why, LimitOutput
		waitErr = l.rs.Stop(l.opts.ID, r.proc, r.done, l.opts.Grace)
	}
	l.res.ExitCode = runsc.ExitCode(waitErr)
	if l.res.Reason == "" && ((l.memcg != nil && l.memcg.oomKills() > 0) || l.polledOOM.Load() > 0) {
		l.res.Reason, l.res.Limit = "memory limit exceeded: the kernel killed the sandbox", LimitMemory
	}
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

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "pp-" + hex.EncodeToString(b[:])
}
