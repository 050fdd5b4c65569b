package gitadopt

import (
	"bufio"
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

// safeArgs come before every subcommand. Nothing in them may be left to
// the repository: the agent wrote its refs and objects, and the worktree.
var safeArgs = []string{
	"--no-pager",
	// refs/replace/ is under refs/, the agent's to write: with replace
	// objects on, an object id would not pin what git reads, and a
	// replacement made between the check and read-tree would swap the tree.
	"--no-replace-objects",
	// The one program the index read can run (status-like refreshes, and
	// any command that loads the index with it set).
	"-c", "core.fsmonitor=false",
	// read-tree writes the index, which runs post-index-change.
	"-c", "core.hooksPath=/dev/null",
	// A commit-graph maps a commit to its root tree on its own; read the
	// tree from the commit object whose id was checked.
	"-c", "core.commitGraph=false",
	"-c", "submodule.recurse=false",
}

// gitRunner runs host git in one worktree with nothing inherited but PATH.
type gitRunner struct {
	dir string
	env []string
}

func newGitRunner(worktree, home string) gitRunner {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		// git 2.44 and later: a missing object is an error, never a fetch
		// from a promisor remote (older git: partial clones are refused).
		"GIT_NO_LAZY_FETCH=1",
		"LC_ALL=C", "LANG=C",
	}
	if home != "" {
		env = append(env, "HOME="+home)
	}
	return gitRunner{dir: worktree, env: env}
}

// maxStderr bounds what is kept of git's stderr for an error message.
const maxStderr = 4 << 10

// maxRecord bounds one NUL-terminated record of a listing: a mode, an id
// and a path; git's own paths stay far below it.
const maxRecord = 64 << 10

// maxOutput bounds a command whose whole output is read at once.
const maxOutput = 64 << 10

// gitError is git exiting non-zero (or not starting).
type gitError struct {
	args   []string
	exit   int // -1: did not run to an exit
	stderr string
	err    error
}

func (e *gitError) Error() string {
	msg := fmt.Sprintf("git %s: %v", strings.Join(e.args, " "), e.err)
	if s := strings.TrimSpace(e.stderr); s != "" {
		// Quoted: git's messages can hold paths the agent chose.
		msg += ": " + fmt.Sprintf("%q", s)
	}
	return msg
}

func (e *gitError) Unwrap() error { return e.err }

// exitCode is git's exit status in err, or -1 when err is not git exiting.
func exitCode(err error) int {
	var ge *gitError
	if errors.As(err, &ge) {
		return ge.exit
	}
	return -1
}

func (r gitRunner) command(ctx context.Context, args []string) (*exec.Cmd, *capped) {
	full := append(append([]string{"-C", r.dir}, safeArgs...), args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	// No cmd.Dir: -C makes a missing or unusable worktree git's own
	// complaint (a refusal), not a failure to start.
	cmd.Env = r.env
	cmd.Stdin = nil // /dev/null: git never prompts
	stderr := &capped{max: maxStderr}
	cmd.Stderr = stderr
	// SIGTERM first: git removes its index.lock on it, so a command
	// stopped mid-write leaves the index as it was and no lock behind.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	return cmd, stderr
}

func (r gitRunner) fail(args []string, stderr *capped, err error) error {
	ge := &gitError{args: args, exit: -1, stderr: stderr.String(), err: err}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ge.exit = ee.ExitCode()
	}
	return ge
}

// output runs git and returns its stdout, refusing more than maxOutput.
func (r gitRunner) output(ctx context.Context, args ...string) (string, error) {
	cmd, stderr := r.command(ctx, args)
	stdout := &capped{max: maxOutput}
	cmd.Stdout = stdout
	if err := cmd.Run(); err != nil {
		return "", r.fail(args, stderr, err)
	}
	if stdout.over {
		return "", fmt.Errorf("git %s: more than %d bytes of output", strings.Join(args, " "), maxOutput)
	}
	return stdout.String(), nil
}

// stream runs git and hands each NUL-terminated record of its stdout to
// each, without the NUL. An error from each stops git and is returned.
func (r gitRunner) stream(ctx context.Context, each func([]byte) error, args ...string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd, stderr := r.command(ctx, args)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return r.fail(args, stderr, err)
	}
	perr := readRecords(bufio.NewReaderSize(out, maxRecord), each)
	if perr != nil {
		cancel() // stop git; what it would still say is not wanted
		_ = cmd.Wait()
		return perr
	}
	if err := cmd.Wait(); err != nil {
		return r.fail(args, stderr, err)
	}
	return nil
}

// errFormat is git output this package does not read.
var errFormat = errors.New("unexpected git output")

func readRecords(br *bufio.Reader, each func([]byte) error) error {
	for {
		rec, err := br.ReadSlice(0)
		switch {
		case err == nil:
			if err := each(rec[:len(rec)-1]); err != nil {
				return err
			}
		case errors.Is(err, io.EOF):
			if len(rec) > 0 {
				return fmt.Errorf("%w: output does not end in NUL", errFormat)
			}
			return nil
		case errors.Is(err, bufio.ErrBufferFull):
			return fmt.Errorf("%w: a record longer than %d bytes", errFormat, maxRecord)
		default:
			return err
		}
	}
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

func (c *capped) String() string { return c.buf.String() }
