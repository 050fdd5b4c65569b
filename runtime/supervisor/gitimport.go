package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/runtime/gitimport"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// The gitImport op: a daemon on the supervisor's protocol (the TypeScript
// client) brings the agent's Git work from its store onto the worktree's
// branch, after a turn (docs/supervisor.md, "gitImport").
//
// At createSandbox the supervisor records, root's, what the import needs:
// the host paths of the store (and the state root it lies beneath), the
// worktree's Git dir and the repository, from the compile's own pins
// (what it verified and binds, never a path the request names), and the
// branch with its value before the sandbox starts, read with the import's
// hardened host git run as the connecting daemon's uid (SO_PEERCRED): the
// daemon owns the repository, so git's ownership check holds as for the
// daemon itself, nothing is written as root, and the value is read the way
// the import's compare-and-swap reads it (for-each-ref), instead of root
// re-implementing ref storage on files the daemon writes. The record lives
// in the state root (git/<id>.json, 0600), so it survives a supervisor
// restart with the rest of the sandbox's state, and goes with delete.
//
// gitImport runs the import (runtime/gitimport) with every git as the
// connecting daemon's uid and the recorded base, one at a time per
// sandbox, and keeps the branch's new value as the next base. A refusal is
// a result, not an error: its diagnostics, no ref written.

// GitImportResult answers gitImport. Diagnostics non-empty: refused,
// nothing written.
type GitImportResult struct {
	// Branch is the worktree's branch; Base the value the import moves it
	// from next time (after this import).
	Branch      string                `json:"branch"`
	Base        string                `json:"base"`
	Updated     []gitimport.RefUpdate `json:"updated"`
	Ignored     diag.List             `json:"ignored,omitempty"`
	Diagnostics diag.List             `json:"diagnostics,omitempty"`
}

// gitRecord is the supervisor's record of a sandbox's import.
type gitRecord struct {
	Repo      string `json:"repo"`
	GitDir    string `json:"gitDir"`
	StateRoot string `json:"stateRoot"`
	Store     string `json:"store"`
	Agent     string `json:"agent"`
	Branch    string `json:"branch,omitempty"`
	Base      string `json:"base,omitempty"`
	// Unusable says why no import can run (a detached HEAD, a root peer,
	// the branch unreadable at create).
	Unusable string `json:"unusable,omitempty"`
}

const gitImportTimeout = 5 * time.Minute

func (s *Server) gitRecordPath(id string) string {
	return filepath.Join(s.cfg.StateRoot, "git", id+".json")
}

// gitPlanOf finds the import's host paths among the compile's pins; false
// when the launch has no Git store.
func gitPlanOf(res *compiler.Result, facts []byte) (gitRecord, bool) {
	if res.Plan == nil {
		return gitRecord{}, false
	}
	var head struct {
		Workspace struct {
			Git *struct {
				Gitdir    string `json:"gitdir"`
				Commondir string `json:"commondir"`
			} `json:"git"`
		} `json:"workspace"`
	}
	_ = json.Unmarshal(facts, &head) // the compiler accepted them
	var r gitRecord
	repoDest := compiler.GitRepoView
	if g := head.Workspace.Git; g != nil {
		repoDest = g.Commondir
		if repoDest == "" {
			repoDest = compiler.GitRepoView
		}
	}
	for _, p := range res.Plan.Pins {
		switch p.Destination {
		case compiler.GitStoreView:
			r.Store, r.StateRoot = p.Source, p.Root
		case compiler.GitSeedView:
			r.GitDir = p.Source
		case repoDest:
			r.Repo = p.Source
		}
	}
	if r.Store == "" || r.GitDir == "" || r.Repo == "" || r.StateRoot == "" {
		return gitRecord{}, false
	}
	r.Agent = res.Manifest.Agent
	return r, true
}

// recordGit writes the sandbox's import record at create (nothing when the
// launch has no Git store).
func (s *Server) recordGit(ctx context.Context, id string, p lineserve.Peer, res *compiler.Result, facts []byte) error {
	r, ok := gitPlanOf(res, facts)
	if !ok {
		return nil
	}
	if p.UID == 0 {
		r.Unusable = "the sandbox was created by a root peer: the import runs as the connecting daemon's uid, and root is no daemon"
	} else {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		branch, value, err := gitimport.Head(ctx, r.GitDir, r.Repo, "", &gitimport.Cred{UID: uint32(p.UID), GID: uint32(p.GID)})
		switch {
		case err != nil:
			r.Unusable = fmt.Sprintf("the worktree's branch could not be read at create: %v", err)
		case branch == "":
			r.Unusable = "the worktree's HEAD was detached at create: no branch to import onto"
		default:
			r.Branch, r.Base = branch, value
		}
	}
	return s.saveGitRecord(id, r)
}

func (s *Server) saveGitRecord(id string, r gitRecord) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.cfg.StateRoot, "git")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := s.gitRecordPath(id) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.gitRecordPath(id))
}

func (s *Server) loadGitRecord(id string) (*gitRecord, error) {
	data, err := os.ReadFile(s.gitRecordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r gitRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// gitImportOp runs the import for the sandbox as the connecting daemon.
func (s *Server) gitImportOp(ctx context.Context, c call) (any, *Error) {
	c.box.gmu.Lock()
	defer c.box.gmu.Unlock()
	rec, err := s.loadGitRecord(c.box.id)
	switch {
	case err != nil:
		return nil, fail(rpcerr.Internal, "the sandbox's Git record: %v", err)
	case rec == nil:
		return nil, fail(rpcerr.State, "sandbox %s has no Git store to import from (its facts name no state.gitStore)", c.box.id)
	case rec.Unusable != "":
		return nil, fail(rpcerr.State, "sandbox %s: %s", c.box.id, rec.Unusable)
	}
	return s.gitImport(ctx, c.box.id, c.conn.Peer(), rec)
}

func (s *Server) gitImport(ctx context.Context, id string, p lineserve.Peer, rec *gitRecord) (GitImportResult, *Error) {
	if p.UID == 0 {
		return GitImportResult{}, fail(rpcerr.Forbidden, "the import runs as the connecting daemon's uid, and root is no daemon")
	}
	ctx, cancel := context.WithTimeout(ctx, gitImportTimeout)
	defer cancel()
	res, err := gitimport.Import(ctx, gitimport.Options{Repo: rec.Repo, StateRoot: rec.StateRoot, Store: rec.Store, Agent: rec.Agent,
		Branch: rec.Branch, Base: rec.Base, Cred: &gitimport.Cred{UID: uint32(p.UID), GID: uint32(p.GID)}})
	out := GitImportResult{Branch: rec.Branch, Base: rec.Base, Updated: []gitimport.RefUpdate{}}
	var dl diag.List
	switch {
	case errors.As(err, &dl):
		out.Diagnostics = dl
		return out, nil
	case err != nil:
		return GitImportResult{}, fail(rpcerr.Internal, "git import: %v (no ref was written)", err)
	}
	if res.Updated != nil {
		out.Updated = res.Updated
	}
	out.Ignored = res.Ignored
	if res.Branch != "" && res.Branch != rec.Base {
		rec.Base = res.Branch
		if err := s.saveGitRecord(id, *rec); err != nil {
			return GitImportResult{}, fail(rpcerr.Internal, "the refs moved, but the new base was not recorded: %v", err)
		}
		out.Base = res.Branch
	}
	return out, nil
}
