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
	"paseo.dev/paseo-policy/runtime/gitadopt"
)

func newGit(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "git",
		Short: "Host-side Git steps for an agent's worktree (run as the daemon user)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return usageError{fmt.Errorf("git needs a subcommand: adopt or import")}
		},
	}
	cmd.AddCommand(newGitAdopt(g), newGitImport(g))
	return cmd
}

type gitAdoptOptions struct {
	*globals
	o       gitadopt.Options
	timeout time.Duration
}

func newGitAdopt(g *globals) *cobra.Command {
	o := &gitAdoptOptions{globals: g}
	cmd := &cobra.Command{
		Use:   "adopt WORKTREE",
		Short: "Set a worktree's host index to its HEAD commit's tree when the gitlinks stay the same",
		Long: `adopt is the reviewed step after an agent's turn (docs/gitadopt.md): the
agent's commits move the branch, but the host index, which tells host git
where to recurse, is never written from the sandbox. adopt resolves HEAD
once, and sets the index to that commit's tree only when the tree holds
exactly the gitlinks (mode 160000: path and commit) the index has and the
index has no unmerged entries. Anything else is refused (exit 1) with
PP-GIT-ADOPT-* diagnostics and the index is not changed. Git runs with a
clean environment and nothing that can run a program: no hooks, no
fsmonitor, no filters, no replace objects, no lazy fetch.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			wt, err := filepath.Abs(args[0])
			if err != nil {
				return usageError{err}
			}
			o.o.Worktree = wt
			return o.run()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.o.GitDir, "gitdir", "", "the gitdir the worktree's .git must lead to (the facts' workspace.git.gitdir)")
	f.StringVar(&o.o.Home, "home", os.Getenv("HOME"), "HOME for git: the daemon user's (its ~/.gitconfig is read)")
	f.IntVar(&o.o.MaxEntries, "max-entries", gitadopt.DefaultMaxEntries, "refuse a HEAD tree (and fail on an index) with more entries")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up (changing nothing) after this long")
	return cmd
}

func (o *gitAdoptOptions) run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	res, err := gitadopt.Adopt(ctx, o.o)
	var dl diag.List
	switch {
	case errors.As(err, &dl):
		return o.refuseWith(dl, "; the index was not changed")
	case err != nil:
		return exitWith(ExitInternal, err)
	}
	if o.json() {
		return o.printJSON(map[string]any{"ok": true, "worktree": o.o.Worktree, "commit": res.Commit, "entries": res.Entries, "gitlinks": res.Gitlinks, "changed": res.Changed})
	}
	if !res.Changed {
		fmt.Fprintf(o.stdout, "the index of %s already holds commit %s's tree (%d entries, %d gitlinks); nothing changed\n", o.o.Worktree, res.Commit, res.Entries, res.Gitlinks)
		return nil
	}
	fmt.Fprintf(o.stdout, "adopted commit %s into the index of %s: %d entries, %d gitlinks unchanged\n", res.Commit, o.o.Worktree, res.Entries, res.Gitlinks)
	return nil
}
