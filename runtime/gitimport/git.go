package gitimport

import (
	"context"
	"io"

	"paseo.dev/paseo-policy/internal/hostgit"
)

// maxOutput bounds what the import reads of one git command: the shared
// repository's ref listing is the largest.
const maxOutput = 64 << 20

// gitRunner runs host git, hardened as internal/hostgit says, in the
// quarantine and in the shared repository alike: the objects come from
// the agent, and refs/replace/ in the shared repository could have been
// written by one under issue 19's layout.
type gitRunner struct{ git hostgit.Runner }

// Cred is the user every git of an import runs as, when the caller is
// root (the supervisor): the deployment's daemon, who owns the
// repository (hostgit.Runner.As).
type Cred struct{ UID, GID uint32 }

func newGitRunner(home string, cred *Cred) gitRunner {
	r := hostgit.New(home)
	if cred != nil {
		r = r.As(cred.UID, cred.GID)
	}
	return gitRunner{git: r}
}

// run runs git in gitDir (--git-dir) with stdin, returning stdout.
func (r gitRunner) run(ctx context.Context, gitDir string, stdin io.Reader, args ...string) (string, error) {
	return r.git.GitDir(gitDir).Output(ctx, stdin, maxOutput, args...)
}
