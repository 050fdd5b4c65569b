package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/gitimport"
)

type gitImportOptions struct {
	*globals
	o       gitimport.Options
	timeout time.Duration
}

func newGitImport(g *globals) *cobra.Command {
	o := &gitImportOptions{globals: g}
	cmd := &cobra.Command{
		Use:   "import --repo DIR --state-root DIR --store DIR --agent ID --branch REF [--base ID]",
		Short: "Bring an agent's Git work from its private store into the shared repository, verified, on the granted refs only",
		Long: `import is the one host step that reads an agent's Git store (docs/gitimport.md).
It reads the store by descriptor without following a link and runs nothing
of it; it copies the objects into a quarantine repository of its own
(loose objects checked against their ids, packs indexed afresh), then host
git in the shared repository fetches the granted tips from the quarantine
with fsck on, and the granted refs move in one compare-and-swap
transaction: the branch from --base (its value at launch or after the last
import), refs/heads/<agent>/* and the store's refs/stash as
refs/paseo/<agent>/stash. Anything else is never written. Refused (exit 1)
with PP-GIT-IMPORT-* diagnostics; a refusal leaves the repository's refs
as they were. Run it as the deployment user.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			for _, p := range []*string{&o.o.Repo, &o.o.StateRoot, &o.o.Store} {
				if *p == "" {
					return usageError{fmt.Errorf("--repo, --state-root and --store are required")}
				}
				abs, err := filepath.Abs(*p)
				if err != nil {
					return usageError{err}
				}
				*p = abs
			}
			return o.run()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.o.Repo, "repo", "", "the shared repository's Git dir (the facts' workspace.git.commondir, or gitdir for a main worktree)")
	f.StringVar(&o.o.StateRoot, "state-root", "", "the registered state root the store lies beneath")
	f.StringVar(&o.o.Store, "store", "", "the agent's Git store (the facts' state.gitStore)")
	f.StringVar(&o.o.Agent, "agent", "", "the agent id: refs/heads/<agent>/* and refs/paseo/<agent>/stash are its namespace")
	f.StringVar(&o.o.Branch, "branch", "", "the worktree's branch, refs/heads/...")
	f.StringVar(&o.o.Base, "base", "", "the branch's value at launch or after the last import (empty: it did not exist)")
	f.StringVar(&o.o.Home, "home", os.Getenv("HOME"), "HOME for git: the daemon user's")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long")
	return cmd
}

func (o *gitImportOptions) run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	res, err := gitimport.Import(ctx, o.o)
	var dl diag.List
	switch {
	case errors.As(err, &dl):
		return o.refuseWith(dl, "; no ref was written")
	case err != nil:
		return exitWith(ExitInternal, err)
	}
	if o.json() {
		return o.printJSON(map[string]any{"ok": true, "updated": res.Updated, "ignored": res.Ignored, "loose": res.Loose, "packs": res.Packs})
	}
	for _, d := range res.Ignored {
		fmt.Fprintln(o.stderr, d.String())
	}
	if len(res.Updated) == 0 {
		fmt.Fprintln(o.stdout, "nothing to import: the granted refs are where the store has them")
		return nil
	}
	for _, u := range res.Updated {
		old := u.Old
		if old == "" {
			old = "(new)"
		}
		fmt.Fprintf(o.stdout, "imported %s %s -> %s\n", u.Ref, old, u.New)
	}
	return nil
}
