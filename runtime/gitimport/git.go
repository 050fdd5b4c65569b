package gitimport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// safeArgs come before every subcommand, in the quarantine and in the
// shared repository alike. The objects come from the agent: nothing in
// them, and nothing in a repository's config, may decide what runs.
var safeArgs = []string{
	"--no-pager",
	// refs/replace/ in the shared repository could have been written by
	// an agent under issue 19's layout; an import reads ids, never their
	// replacements.
	"--no-replace-objects",
	"-c", "core.fsmonitor=false",
	// update-ref runs reference-transaction, fetch runs nothing else, but
	// no hook of any repository runs in an import.
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.commitGraph=false",
	"-c", "submodule.recurse=false",
	"-c", "gc.auto=0",
	"-c", "maintenance.auto=false",
}

// gitRunner runs host git with nothing inherited but PATH: no GIT_* from
// the caller's environment (GIT_DIR, GIT_OBJECT_DIRECTORY,
// GIT_ALTERNATE_OBJECT_DIRECTORIES would redirect it), no system config.
type gitRunner struct {
	env []string
}

func newGitRunner(home string) gitRunner {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_NO_LAZY_FETCH=1",
		"LC_ALL=C", "LANG=C",
	}
	if home != "" {
		env = append(env, "HOME="+home)
	} else {
		env = append(env, "HOME=/nonexistent")
	}
	return gitRunner{env: env}
}

// gitError is git exiting non-zero (or not starting).
type gitError struct {
	args   []string
	stderr string
	err    error
}

func (e *gitError) Error() string {
	msg := fmt.Sprintf("git %s: %v", strings.Join(e.args, " "), e.err)
	if s := strings.TrimSpace(e.stderr); s != "" {
		msg += ": " + fmt.Sprintf("%q", s) // git's messages can hold names the agent chose
	}
	return msg
}

func (e *gitError) Unwrap() error { return e.err }

const (
	maxStderr = 4 << 10
	// maxOutput bounds what the import reads of one git command: the
	// shared repository's ref listing is the largest.
	maxOutput = 64 << 20
)

// run runs git with gitDir (--git-dir) and stdin, returning stdout.
func (r gitRunner) run(ctx context.Context, gitDir string, stdin io.Reader, args ...string) (string, error) {
	full := append(append([]string{"--git-dir=" + gitDir}, safeArgs...), args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Env = r.env
	cmd.Dir = "/"
	cmd.Stdin = stdin
	var stdout, stderr limited
	stdout.max, stderr.max = maxOutput, maxStderr
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// SIGTERM first: git removes its lock files on it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return "", &gitError{args: args, stderr: stderr.buf.String(), err: err}
	}
	if stdout.over {
		return "", fmt.Errorf("git %s: more than %d bytes of output", strings.Join(args, " "), maxOutput)
	}
	return stdout.buf.String(), nil
}

// limited keeps the first max bytes written to it and notes the rest.
type limited struct {
	max  int
	buf  bytes.Buffer
	over bool
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room < len(p) {
		l.over = true
		l.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	l.buf.Write(p)
	return len(p), nil
}
