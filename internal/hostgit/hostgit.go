// Package hostgit runs the host's git for the host-side Git steps
// (runtime/gitadopt, runtime/gitimport), hardened the one way both need:
// the repository and the objects it reads were written by an agent, so
// nothing in them, in the caller's environment or in the system's git
// config may decide what runs.
//
// Every command gets a clean environment (PATH, and HOME as given so the
// daemon user's ~/.gitconfig is read, e.g. its safe.directory; no GIT_*
// of the caller's, no system config, no prompt, no lazy fetch, C locale)
// and safeArgs before its subcommand: no pager, no replace objects, no
// fsmonitor, no hooks, no commit-graph, no submodule recursion, no
// automatic gc or maintenance, and no transport but a local path's. The
// commands the steps run never check a file out or hash a worktree file,
// so no clean or smudge filter runs. A command stops on its context with
// SIGTERM first (git removes its lock files on it), then SIGKILL after
// WaitDelay.
package hostgit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// safeArgs come before every subcommand.
var safeArgs = []string{
	"--no-pager",
	// refs/replace/ is under refs/, an agent's to write: with replace
	// objects on, an object id would not pin what git reads.
	"--no-replace-objects",
	// The one program the index read can run.
	"-c", "core.fsmonitor=false",
	// read-tree writes the index (post-index-change), update-ref runs
	// reference-transaction: no hook of any repository runs.
	"-c", "core.hooksPath=/dev/null",
	// A commit-graph maps a commit to its root tree on its own; read the
	// tree from the commit object whose id was checked.
	"-c", "core.commitGraph=false",
	"-c", "submodule.recurse=false",
	"-c", "gc.auto=0",
	"-c", "maintenance.auto=false",
	// A local path (the import's quarantine) is the only transport.
	"-c", "protocol.allow=never",
	"-c", "protocol.file.allow=always",
}

// WaitDelay is how long a command stopped by its context has after
// SIGTERM before it is killed.
const WaitDelay = 5 * time.Second

// maxStderr bounds what is kept of git's stderr for an error message.
const maxStderr = 4 << 10

// Runner runs host git in one place (a git dir or a worktree).
type Runner struct {
	env   []string
	where []string // --git-dir=... or -C ...
	dir   string   // the command's working directory; "" for -C
	cred  *syscall.Credential
}

// New is a runner with the clean environment and no place yet: name one
// with GitDir or Worktree. home is HOME for git ("" reads no ~/.gitconfig).
func New(home string) Runner {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		// git 2.44 and later: a missing object is an error, never a fetch
		// from a promisor remote.
		"GIT_NO_LAZY_FETCH=1",
		"LC_ALL=C", "LANG=C",
	}
	if home == "" {
		home = "/nonexistent"
	}
	return Runner{env: append(env, "HOME="+home)}
}

// GitDir is r running in the bare repository or git dir dir (--git-dir),
// from /.
func (r Runner) GitDir(dir string) Runner {
	r.where, r.dir = []string{"--git-dir=" + dir}, "/"
	return r
}

// Worktree is r running in the worktree dir (-C): a missing or unusable
// worktree is git's own complaint (an Error with an exit code), not a
// failure to start.
func (r Runner) Worktree(dir string) Runner {
	r.where, r.dir = []string{"-C", dir}, ""
	return r
}

// As is r running git as uid:gid with no supplementary groups: a root
// caller (the supervisor) runs an import as the daemon who owns the
// repository, so nothing there is written as root and git's ownership
// check (safe.directory) holds as for the daemon itself.
func (r Runner) As(uid, gid uint32) Runner {
	r.cred = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
	return r
}

// Error is git exiting non-zero (or not starting).
type Error struct {
	Args   []string
	Exit   int // -1: did not run to an exit
	Stderr string
	Err    error
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("git %s: %v", strings.Join(e.Args, " "), e.Err)
	if s := strings.TrimSpace(e.Stderr); s != "" {
		// Quoted: git's messages can hold names the agent chose.
		msg += ": " + fmt.Sprintf("%q", s)
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// ExitCode is git's exit status in err, or -1 when err is not git exiting.
func ExitCode(err error) int {
	var ge *Error
	if errors.As(err, &ge) {
		return ge.Exit
	}
	return -1
}

func (r Runner) command(ctx context.Context, stdin io.Reader, args []string) (*exec.Cmd, *capped) {
	full := append(append(append([]string{}, r.where...), safeArgs...), args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Env = r.env
	cmd.Dir = r.dir
	cmd.Stdin = stdin // nil: /dev/null, git never prompts
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	}
	stderr := &capped{max: maxStderr}
	cmd.Stderr = stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = WaitDelay
	return cmd, stderr
}

func fail(args []string, stderr *capped, err error) error {
	ge := &Error{Args: args, Exit: -1, Stderr: stderr.buf.String(), Err: err}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ge.Exit = ee.ExitCode()
	}
	return ge
}

// Output runs git with stdin and returns its stdout, refusing more than
// maxOutput bytes of it.
func (r Runner) Output(ctx context.Context, stdin io.Reader, maxOutput int, args ...string) (string, error) {
	cmd, stderr := r.command(ctx, stdin, args)
	stdout := &capped{max: maxOutput}
	cmd.Stdout = stdout
	if err := cmd.Run(); err != nil {
		return "", fail(args, stderr, err)
	}
	if stdout.over {
		return "", fmt.Errorf("git %s: more than %d bytes of output", strings.Join(args, " "), maxOutput)
	}
	return stdout.buf.String(), nil
}

// Stream runs git and hands its stdout to read. An error from read stops
// git and is returned as it is.
func (r Runner) Stream(ctx context.Context, read func(io.Reader) error, args ...string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd, stderr := r.command(ctx, nil, args)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fail(args, stderr, err)
	}
	if err := read(out); err != nil {
		cancel() // stop git; what it would still say is not wanted
		_ = cmd.Wait()
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fail(args, stderr, err)
	}
	return nil
}

// capped keeps the first max bytes written to it and notes the rest.
type capped struct {
	max  int
	buf  bytes.Buffer
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.over = true
		c.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	c.buf.Write(p)
	return len(p), nil
}
