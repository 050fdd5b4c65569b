// Package ociexec is the execution seam's OCI adapter: a compiled bundle
// run under the pinned runsc through the launcher, which enforces
// everything the bundle grants, with hibernation (checkpoint and wake)
// and one stdin relayed across the launches of one process. It lives
// beside the launcher, whose types it speaks, so that runtime/execution
// imports no backend.
package ociexec

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// The holder finds hibernation by asserting execution.Hibernator on the
// process, so a signature that drifted from the seam's would silently
// disable it: these fail the build instead.
var (
	_ execution.Backend    = OCI{}
	_ execution.Hibernator = (*ociProcess)(nil)
)

// OCI runs compiled bundles under the pinned runsc through the launcher,
// which enforces everything the bundle grants (network, limits, mounts).
type OCI struct {
	StateRoot string
	RunscPath string
	Secrets   launcher.SecretSource
	// MCPToken is the route proxy's holder of the daemon's bearer (see
	// launcher.Options.MCPToken).
	MCPToken *routeproxy.Token
	// ModelKey and ModelRoots: see launcher.Options.
	ModelKey   func() ([]byte, error)
	ModelRoots *x509.CertPool
	Uplink     string
	Resolve    sandboxnet.Resolver
	// Log takes the launcher's diagnostics (launcher.Options.Log; nil:
	// stderr).
	Log io.Writer
}

func (OCI) Name() string { return "oci-runsc" }

func (o OCI) inventory() inventory.Inventory {
	return inventory.Inventory{StateRoot: o.StateRoot, RunscPath: o.RunscPath}
}

// Start launches the bundle and returns once runsc runs it. The launch
// outlives ctx; ctx bounds only the wait for the start.
func (o OCI) Start(ctx context.Context, spec execution.Spec) (execution.Process, error) {
	if spec.Command != nil || spec.Bundle == "" {
		return nil, errors.New("the OCI backend runs compiled bundles only")
	}
	id := spec.ID
	if id == "" {
		id = execution.NewID("pp-")
	}
	p := &ociProcess{id: id, pipes: newPipes(), inv: o.inventory(), done: make(chan struct{}), oci: o, bundle: spec.Bundle}
	p.input = newInputRelay()
	if err := p.begin(ctx, launcher.Launch, o.Secrets); err != nil {
		p.closeBackend()
		return nil, err
	}
	return p, nil
}

// begin runs one launch (a start, or a wake) of the process and waits for
// runsc to run it.
func (p *ociProcess) begin(ctx context.Context, launch func(context.Context, launcher.Options) (launcher.Result, error), secrets launcher.SecretSource) error {
	lctx, cancel := context.WithCancel(context.Background())
	r := &ociRun{cancel: cancel, done: make(chan struct{})}
	o := p.oci
	started := make(chan struct{})
	in := p.input.open()
	p.mu.Lock()
	p.cur = r
	p.mu.Unlock()
	go func() {
		defer close(r.done)
		r.res, r.err = launch(lctx, launcher.Options{
			BundleDir: p.bundle, ID: p.id, StateRoot: o.StateRoot, RunscPath: o.RunscPath, Secrets: secrets, MCPToken: o.MCPToken, ModelKey: o.ModelKey, ModelRoots: o.ModelRoots,
			Stdin: in, Stdout: countingWriter{p.outW, &p.written}, Stderr: countingWriter{p.errW, &p.written},
			OutputBefore: p.written.Load(), Uplink: o.Uplink, Resolve: o.Resolve, Log: o.Log,
			OnStart: func() {
				p.mu.Lock()
				p.hibernating = false // a wake restored it
				p.mu.Unlock()
				close(started)
			},
		})
		p.ended(r)
	}()
	select {
	case <-started:
		return nil
	case <-r.done:
		cancel()
		p.input.cut() // nothing more for a launch that never ran
		return r.err
	case <-ctx.Done():
		cancel()
		<-r.done
		return fmt.Errorf("starting %s: %w", p.id, ctx.Err())
	}
}

// ended is called when a launch returns: the process has ended unless
// the launch ended because it was checkpointed, or it was a wake that
// failed (the checkpoint is still there).
func (p *ociProcess) ended(r *ociRun) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hibernating {
		return // checkpointed, or a wake refused: the checkpoint remains
	}
	e := execution.Exit{Code: r.res.ExitCode, Reason: r.res.Reason, Limit: r.res.Limit, Err: r.err, Packets: r.res.Packets, Routes: r.res.Routes}
	if s := r.res.NativeSearch; s != nil {
		e.Search = &execution.SearchStats{Answered: s.Answered, Fallback: s.Fallback, Refused: s.Refused}
	}
	p.finish(e)
}

// finish ends the process for good. p.mu is held.
func (p *ociProcess) finish(e execution.Exit) {
	select {
	case <-p.done:
		return
	default:
	}
	p.closeBackend()
	p.exit = e
	close(p.done)
}

// Cleanup is the launcher's gc: containers, networks, cgroups and run dirs
// no live launcher owns.
func (o OCI) Cleanup(context.Context) ([]string, error) {
	rep, err := o.inventory().GC()
	if err != nil {
		return nil, err
	}
	if len(rep.Errors) > 0 {
		return rep.Removed, fmt.Errorf("gc: %v", rep.Errors)
	}
	return rep.Removed, nil
}

type ociProcess struct {
	id string
	*pipes
	inv    inventory.Inventory
	oci    OCI
	bundle string
	input  *inputRelay
	// written counts the output of every launch, for a wake's outputBytes.
	written atomic.Int64

	// hibernation serializes Hibernate, Wake and Stop.
	hibernation sync.Mutex
	mu          sync.Mutex
	cur         *ociRun // the current (or last) launch
	hibernating bool    // cur was checkpointed; no launch runs
	done        chan struct{}
	exit        execution.Exit
}

// ociRun is one launch of the process: its start or a wake.
type ociRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	res    launcher.Result
	err    error
}

func (p *ociProcess) ID() string                      { return p.id }
func (p *ociProcess) Stdin() io.WriteCloser           { return p.input }
func (p *ociProcess) Stdout() io.Reader               { return p.outR }
func (p *ociProcess) Stderr() io.Reader               { return p.errR }
func (p *ociProcess) Signal(sig syscall.Signal) error { return p.inv.Kill(p.id, sig) }

// Stop has the launcher end the container (SIGTERM, its grace, SIGKILL)
// and tear down its network, cgroups and run dir.
func (p *ociProcess) Stop() {
	p.hibernation.Lock()
	defer p.hibernation.Unlock()
	p.mu.Lock()
	if p.hibernating {
		// Nothing runs: the checkpoint is all there is to remove.
		e := execution.Exit{Code: -1, Reason: "deleted while hibernated"}
		if err := launcher.RemoveHibernation(p.oci.StateRoot, p.id); err != nil {
			e.Err = fmt.Errorf("deleted while hibernated; removing the checkpoint: %w", err)
		}
		p.finish(e)
	}
	r := p.cur
	p.mu.Unlock()
	r.cancel()
	<-p.done
}

func (p *ociProcess) Wait() execution.Exit {
	<-p.done
	return p.exit
}

// pipes are a process's stdio as its backend hands them out: the backend
// writes outputs into the *W ends (stdin is the process's inputRelay).
type pipes struct {
	outR, errR *io.PipeReader
	outW, errW *io.PipeWriter
}

func newPipes() *pipes {
	p := &pipes{}
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	return p
}

// closeBackend closes the backend's ends once the process has ended: the
// readers see EOF and a writer to stdin gets an error.
func (p *ociProcess) closeBackend() {
	p.outW.Close()
	p.errW.Close()
	p.input.closeBackend()
}
