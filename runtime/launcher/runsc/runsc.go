// Package runsc is the one place the pinned runsc is executed, always with
// the launcher's fixed flags (launchplan.RunscFlags: --root, --network,
// --directfs=false, ...): run and restore for a launch, and the one-shot
// commands (state, list, checkpoint, kill, delete) the launcher and the
// inventory ask of it.
package runsc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/childproc"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/mounts"
)

// env is runsc's whole environment.
var env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}

// Runner drives the pinned binary at Path with fixed flags only: its
// state in Root, the sandbox's network mode Network.
type Runner struct {
	Path    string
	Root    string
	Network string
}

// Flags are the fixed flags every command gets.
func (r *Runner) Flags() []string {
	return launchplan.RunscFlags(r.Root, r.Network)
}

// Exec runs one runsc command (kill, delete, checkpoint, ...) to its end;
// its error carries runsc's stderr.
func (r *Runner) Exec(args ...string) error {
	cmd := exec.Command(r.Path, append(r.Flags(), args...)...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Command is `runsc run --bundle bundleDir id`, not started: in its own
// process group, killed if the thread that starts it ends.
func (r *Runner) Command(id, bundleDir string) *exec.Cmd {
	return r.command("run", "--bundle", bundleDir, id)
}

func (r *Runner) command(args ...string) *exec.Cmd {
	cmd := exec.Command(r.Path, append(r.Flags(), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = env
	return cmd
}

// Stdio is what a started sandbox reads and writes.
type Stdio struct {
	In       *os.File
	Out, Err io.Writer
}

// Proc is a started `runsc run` or `runsc restore`.
type Proc struct {
	cmd *exec.Cmd
}

// Start starts `runsc run` of bundleDir as container id or, with an
// imageDir, `runsc restore` of that checkpoint image. It starts runsc
// from a thread that lives until runsc is reaped (internal/childproc);
// waited gets runsc's wait.
func (r *Runner) Start(id, bundleDir, imageDir string, stdio Stdio) (p *Proc, waited <-chan error, err error) {
	cmd := r.Command(id, bundleDir)
	if imageDir != "" {
		cmd = r.command("restore", "--image-path", imageDir, "--bundle", bundleDir, id)
	}
	if stdio.In != nil { // a nil *os.File would not be a nil io.Reader
		cmd.Stdin = stdio.In
	}
	cmd.Stdout, cmd.Stderr = stdio.Out, stdio.Err
	if waited, err = childproc.Start(cmd); err != nil {
		return nil, nil, err
	}
	return &Proc{cmd: cmd}, waited, nil
}

// Knows reports whether the runsc root has a container with this id. It
// looks for runsc's own state file, "<id>_sandbox:<sandbox id>.state",
// instead of running `runsc list` (6 ms, most of what a launch adds to a
// bare runsc run). The layout is the pinned runsc's;
// TestGCHalfCreatedAndDuplicateID fails if a new runsc changes it.
func (r *Runner) Knows(id string) (bool, error) {
	ents, err := os.ReadDir(r.Root)
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

// Status is runsc's status of container id.
func (r *Runner) Status(id string) (string, error) {
	cmd := exec.Command(r.Path, append(r.Flags(), "state", id)...)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// List lists runsc's containers in the root, id to status; none when the
// root does not exist yet. It passes --root only.
func (r *Runner) List() (map[string]string, error) {
	out := map[string]string{}
	if _, err := os.Stat(r.Root); errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	cmd := exec.Command(r.Path, "--root", r.Root, "list", "-format", "json")
	cmd.Env = env
	data, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	var cs []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(data, &cs); err != nil {
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	for _, c := range cs {
		out[c.ID] = c.Status
	}
	return out, nil
}

// Stop asks the container to end, then kills runsc's process group, which
// takes the sandbox and gofer with it; done is p's wait.
func (r *Runner) Stop(id string, p *Proc, done <-chan error, grace time.Duration) error {
	_ = r.Exec("kill", id, "SIGTERM")
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
	}
	_ = r.Exec("kill", "--all", id, "SIGKILL")
	_ = unix.Kill(-p.cmd.Process.Pid, unix.SIGKILL)
	return <-done
}

// Delete deletes the container state and unmounts what runsc leaves
// behind under its root (it leaves an nsfs mount at <root>/null-netns).
func (r *Runner) Delete(id string) error {
	return errors.Join(r.Exec("delete", "--force", id), mounts.UnmountBeneath(r.Root))
}

// ExitCode is the exit code a wait's error stands for: 128+n for a
// signal, -1 when runsc did not exit at all.
func ExitCode(err error) int {
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
