// Package localexec is test support: a second implementation of the
// execution seam that runs a plain host process, so execution's contract
// test checks the seam itself and not only the OCI adapter's behaviour.
// The product never selects a local backend (no silent fallback, and no
// local retry yet); when it does, this moves back next to OCI.
package localexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"paseo.dev/paseo-policy/internal/childproc"
	"paseo.dev/paseo-policy/runtime/execution"
)

// Local runs a plain host process with the caller's authority. It
// enforces nothing; that is why only tests use it.
type Local struct {
	// Grace is how long Stop waits between SIGTERM and SIGKILL (default 2s).
	Grace time.Duration
}

func (Local) Name() string { return "local" }

// Start runs the command in a process group of its own, killed with its
// owner (parent-death signal), so nothing outlives the backend's caller.
func (l Local) Start(ctx context.Context, spec execution.Spec) (execution.Process, error) {
	if spec.Bundle != "" || spec.Command == nil || len(spec.Command.Argv) == 0 {
		return nil, errors.New("the local backend runs a command only, never a bundle")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := spec.ID
	if id == "" {
		id = execution.NewID("local-")
	}
	c := spec.Command
	if (c.UID == nil) != (c.GID == nil) {
		return nil, errors.New("a local command's credentials need both uid and gid")
	}
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env, cmd.Dir = c.Env, c.Dir
	p := &localProcess{id: id, cmd: cmd, grace: l.Grace, done: make(chan struct{})}
	if p.grace == 0 {
		p.grace = 2 * time.Second
	}
	// Kernel pipes, not io.Pipes: exec would copy through goroutines that
	// keep Wait waiting on a reader. The process's ends close in this
	// process once it has them; ours see EOF when it and its group are gone.
	var theirs [3]*os.File
	var err error
	if theirs[0], p.stdin, err = os.Pipe(); err == nil {
		if p.stdout, theirs[1], err = os.Pipe(); err == nil {
			p.stderr, theirs[2], err = os.Pipe()
		}
	}
	defer func() {
		for _, f := range theirs {
			if f != nil {
				f.Close()
			}
		}
	}()
	if err != nil {
		p.closeOurs()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = theirs[0], theirs[1], theirs[2]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c.UID != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: *c.UID, Gid: *c.GID}
	}
	waited, err := childproc.Start(cmd)
	if err != nil {
		p.closeOurs()
		return nil, fmt.Errorf("starting %s: %w", c.Argv[0], err)
	}
	go func() {
		defer close(p.done)
		err := <-waited
		// The group goes with its leader: no descendant outlives the run.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		p.stdin.Close()
		p.mu.Lock()
		p.exit.Reason = p.reason
		p.mu.Unlock()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.exit.Code = 128 + int(ws.Signal())
			} else {
				p.exit.Code = ee.ExitCode()
			}
		default:
			p.exit.Code, p.exit.Err = -1, err
		}
	}()
	return p, nil
}

// Cleanup has nothing to do: a local process's leader dies with its owner
// (parent-death signal) and its group with the leader's end in Wait. A
// descendant of a leader killed that way can outlive it; the local backend
// is the unenforced one, chosen explicitly.
func (Local) Cleanup(context.Context) ([]string, error) { return nil, nil }

type localProcess struct {
	id             string
	stdin          *os.File
	stdout, stderr *os.File
	cmd            *exec.Cmd
	grace          time.Duration
	done           chan struct{}
	exit           execution.Exit

	mu     sync.Mutex
	reason string
}

func (p *localProcess) ID() string            { return p.id }
func (p *localProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *localProcess) Stdout() io.Reader     { return p.stdout }
func (p *localProcess) Stderr() io.Reader     { return p.stderr }

func (p *localProcess) closeOurs() {
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// Signal signals the whole process group, as runsc kill reaches the
// container's processes.
func (p *localProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return errors.New("the process has ended")
	default:
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

func (p *localProcess) Stop() {
	p.mu.Lock()
	if p.reason == "" {
		p.reason = "cancelled" // the launcher's word for the same end
	}
	p.mu.Unlock()
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(p.grace):
	}
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *localProcess) Wait() execution.Exit {
	<-p.done
	return p.exit
}
