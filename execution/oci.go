package execution

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"paseo.dev/paseo-policy/launcher"
	"paseo.dev/paseo-policy/launcher/routeproxy"
	"paseo.dev/paseo-policy/launcher/sandboxnet"
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
	Uplink   string
	Resolve  sandboxnet.Resolver
}

func (OCI) Name() string { return "oci-runsc" }

func (o OCI) inventory() launcher.Inventory {
	return launcher.Inventory{StateRoot: o.StateRoot, RunscPath: o.RunscPath}
}

// Start launches the bundle and returns once runsc runs it. The launch
// outlives ctx; ctx bounds only the wait for the start.
func (o OCI) Start(ctx context.Context, spec Spec) (Process, error) {
	if spec.Command != nil || spec.Bundle == "" {
		return nil, errors.New("the OCI backend runs compiled bundles only")
	}
	id := spec.ID
	if id == "" {
		id = NewID("pp-")
	}
	p := &ociProcess{id: id, pipes: newPipes(), inv: o.inventory(), done: make(chan struct{})}
	lctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	started := make(chan struct{})
	go func() {
		defer close(p.done)
		res, err := launcher.Launch(lctx, launcher.Options{
			BundleDir: spec.Bundle, ID: id, StateRoot: o.StateRoot, RunscPath: o.RunscPath, Secrets: o.Secrets, MCPToken: o.MCPToken,
			Stdin: p.inR, Stdout: p.outW, Stderr: p.errW, Uplink: o.Uplink, Resolve: o.Resolve,
			OnStart: func() { close(started) },
		})
		p.closeBackend()
		p.exit = Exit{Code: res.ExitCode, Reason: res.Reason, Err: err, Packets: res.Packets, Routes: res.Routes}
	}()
	select {
	case <-started:
		return p, nil
	case <-p.done:
		cancel()
		return nil, p.exit.Err
	case <-ctx.Done():
		cancel()
		<-p.done
		return nil, fmt.Errorf("starting %s: %w", id, ctx.Err())
	}
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
	inv    launcher.Inventory
	cancel context.CancelFunc
	done   chan struct{}
	exit   Exit
}

func (p *ociProcess) ID() string                      { return p.id }
func (p *ociProcess) Stdin() io.WriteCloser           { return p.inW }
func (p *ociProcess) Stdout() io.Reader               { return p.outR }
func (p *ociProcess) Stderr() io.Reader               { return p.errR }
func (p *ociProcess) Signal(sig syscall.Signal) error { return p.inv.Kill(p.id, sig) }

// Stop has the launcher end the container (SIGTERM, its grace, SIGKILL)
// and tear down its network, cgroups and run dir.
func (p *ociProcess) Stop() {
	p.cancel()
	<-p.done
}

func (p *ociProcess) Wait() Exit {
	<-p.done
	return p.exit
}
