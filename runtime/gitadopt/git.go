package gitadopt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"

	"paseo.dev/paseo-policy/internal/hostgit"
)

// maxRecord bounds one NUL-terminated record of a listing: a mode, an id
// and a path; git's own paths stay far below it.
const maxRecord = 64 << 10

// maxOutput bounds a command whose whole output is read at once.
const maxOutput = 64 << 10

// gitRunner runs host git in one worktree, hardened as internal/hostgit
// says: the agent wrote its refs and objects, and the worktree.
type gitRunner struct{ git hostgit.Runner }

func newGitRunner(worktree, home string) gitRunner {
	return gitRunner{git: hostgit.New(home).Worktree(worktree)}
}

// exitCode is git's exit status in err, or -1 when err is not git exiting.
func exitCode(err error) int { return hostgit.ExitCode(err) }

// output runs git and returns its stdout, refusing more than maxOutput.
func (r gitRunner) output(ctx context.Context, args ...string) (string, error) {
	return r.git.Output(ctx, nil, maxOutput, args...)
}

// stream runs git and hands each NUL-terminated record of its stdout to
// each, without the NUL. An error from each stops git and is returned.
func (r gitRunner) stream(ctx context.Context, each func([]byte) error, args ...string) error {
	return r.git.Stream(ctx, func(out io.Reader) error {
		return readRecords(bufio.NewReaderSize(out, maxRecord), each)
	}, args...)
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
