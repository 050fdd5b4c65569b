package pilaunch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/gitimport"
)

// The agent's Git work reaches the worktree's branch at each turn end.
//
// Git in the sandbox writes into the agent's store only (the repository is
// read-only there). When the launch has a Git plan, the command reads the
// worktree's branch and its value before the sandbox starts, with the
// import's hardened host git, as itself: the daemon user, who owns the
// repository, which no sandbox can write, so the value is the host's. That
// value is the import's base unless the agent's base record (bridge dir,
// GitBase) already holds one for the same branch: the store outlives the
// sandbox, so the agent's next sandbox continues from what it last agreed
// with the host on. After each agent_end frame it forwards, before the
// frame goes to Paseo, and once more when the sandbox has ended, the
// command runs the import in its own process (runtime/gitimport, never a
// program of the sandbox's) and keeps the branch's new value as the next
// base. Results and refusals go to stderr, one line each; stdout carries
// Pi's frames only. A refusal writes no ref (the import is all or none)
// and the session goes on.
//
// The import reads the store as data at one point in time: each ref, then
// each object file, once, by descriptor. Pi's next turn may write the
// store meanwhile (Paseo sends the next prompt when it likes); a ref moved
// after the import read it is imported at the next turn end, and objects
// deleted by a gc under the import make the fetch's connectivity check
// refuse this import (PP-GIT-IMPORT-OBJECT), not a later one. An agent_end
// line is untrusted (any process in the sandbox can write Pi's stdout): it
// can only make an import happen, which is idempotent, bounded
// (gitimport.DefaultLimits, gitTimeout) and costs the agent's own session
// the time it takes.

// gitTimeout bounds one import at a turn end.
const gitTimeout = 2 * time.Minute

type gitTurns struct {
	o      gitimport.Options
	agent  string
	store  *Store // nil: the base lives in this process only
	stderr io.Writer
	// known: the agent's base record held this branch when the spawn
	// began; otherwise start records the value read at launch.
	known bool
}

// prepareGit reads the branch and its base before the sandbox starts; nil
// when the launch has no Git plan or the branch cannot be read (said on
// stderr: the session runs, nothing is imported).
func (b *Bridge) prepareGit(ln *Launch) *gitTurns {
	p := ln.Git
	if p == nil {
		return nil
	}
	say := func(format string, a ...any) {
		fmt.Fprintf(b.Stderr, "%s workspace.git: %s; this spawn imports nothing\n", CodeGitImport, oneLine(fmt.Sprintf(format, a...)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), gitTimeout)
	defer cancel()
	branch, value, err := gitimport.Head(ctx, p.GitDir, p.Repo, "", nil)
	switch {
	case err != nil:
		say("cannot read the worktree's branch: %v", err)
		return nil
	case branch == "":
		say("the worktree's HEAD is detached: no branch to import onto")
		return nil
	}
	g := &gitTurns{agent: ln.AgentID, store: b.Store, stderr: b.Stderr, o: gitimport.Options{
		Repo: p.Repo, StateRoot: p.StateRoot, Store: p.Store, Agent: ln.AgentID, Branch: branch, Base: value}}
	if b.Store != nil {
		rec, err := b.Store.LoadGitBase(ln.AgentID)
		if err != nil {
			say("%v", err)
			return nil
		}
		if rec != nil && rec.Branch == branch {
			g.o.Base, g.known = rec.Base, true
		}
	}
	return g
}

// start runs once the sandbox is attached (a refused launch records
// nothing): it records the base read at launch for an agent first seen,
// or brings what an earlier spawn killed before its last import left in
// the store (a respawn, the agent's next session).
func (g *gitTurns) start() {
	switch {
	case g == nil:
	case g.known:
		g.run("spawn")
	case g.store != nil:
		if err := g.store.SaveGitBase(g.agent, GitBase{Branch: g.o.Branch, Base: g.o.Base}); err != nil {
			fmt.Fprintf(g.stderr, "%s state.gitStore: %s\n", CodeGitImport, oneLine(err.Error()))
		}
	}
}

// run imports once; why says when (turn-end, sandbox-end, spawn).
func (g *gitTurns) run(why string) {
	if g == nil {
		return
	}
	// The record is the truth between spawns: a newer spawn of the same
	// agent may have imported meanwhile.
	if g.store != nil {
		if rec, err := g.store.LoadGitBase(g.agent); err == nil && rec != nil && rec.Branch == g.o.Branch {
			g.o.Base = rec.Base
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), gitTimeout)
	defer cancel()
	res, err := gitimport.Import(ctx, g.o)
	var dl diag.List
	switch {
	case errors.As(err, &dl):
		for _, d := range dl {
			fmt.Fprintf(g.stderr, "%s (git import at %s: no ref was written)\n", oneLine(d.String()), why)
		}
		return
	case err != nil:
		fmt.Fprintf(g.stderr, "%s state.gitStore: git import at %s: %s (no ref was written)\n", CodeGitImport, why, oneLine(err.Error()))
		return
	}
	for _, d := range res.Ignored {
		fmt.Fprintf(g.stderr, "%s (git import at %s)\n", oneLine(d.String()), why)
	}
	for _, u := range res.Updated {
		old := u.Old
		if old == "" {
			old = "(new)"
		}
		fmt.Fprintf(g.stderr, "paseo-policy pi: git import at %s: imported %s %s -> %s\n", why, u.Ref, old, u.New)
	}
	if res.Branch != "" && res.Branch != g.o.Base {
		g.o.Base = res.Branch
		if g.store != nil {
			if err := g.store.SaveGitBase(g.agent, GitBase{Branch: g.o.Branch, Base: res.Branch}); err != nil {
				fmt.Fprintf(g.stderr, "%s state.gitStore: git import at %s: %s\n", CodeGitImport, why, oneLine(err.Error()))
			}
		}
	}
}

// oneLine keeps a message on its line.
func oneLine(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "\r", " "), "\n", " ") }
