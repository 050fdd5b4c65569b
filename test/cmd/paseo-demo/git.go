package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"paseo.dev/paseo-policy/runtime/gitimport"
)

// The agent's commit, brought home. The repository is a real one (one
// empty commit on main and on the worktree's branch feature); the agent
// commits DEMO.md in the sandbox, into its own Git store (the repository
// is read-only there), and after the turn the import (runtime/gitimport,
// every git as the daemon user, as the supervisor's gitImport runs it)
// puts the commit on feature, from the value feature had before the
// sandbox started.

const (
	daemonUID   = 1000
	demoBranch  = "refs/heads/feature"
	demoAgent   = "agent-7f3c"
	demoCommit  = "DEMO.md, committed inside gVisor"
	gitIdentity = "-c user.name=Pi -c user.email=pi@sandbox.invalid"
)

func (s *scene) repo() string   { return filepath.Join(s.host, "srv/paseo/repos/proj/.git") }
func (s *scene) gitdir() string { return filepath.Join(s.repo(), "worktrees/proj-feature") }
func (s *scene) store() string  { return filepath.Join(s.host, "srv/paseo/state/pi-git", demoAgent) }

// daemonReaches reports whether the daemon user can reach p: every
// directory above it searchable by uid/gid 1000. A checkout in a 0700
// directory (a home, a `mktemp -d`) is not; the demo's Git steps then run
// as root and give the daemon its repository back (asRoot, said in the
// report).
func daemonReaches(p string) bool {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		var st syscall.Stat_t
		if syscall.Stat(d, &st) != nil {
			return false
		}
		switch {
		case st.Uid == daemonUID && st.Mode&0o100 != 0, st.Gid == daemonUID && st.Mode&0o010 != 0, st.Mode&0o001 != 0:
		default:
			return false
		}
		if d == "/" {
			return true
		}
	}
}

// cred is the daemon user, or nil when the demo's Git steps run as root.
func (s *scene) cred() *gitimport.Cred {
	if s.gitAsRoot {
		return nil
	}
	return &gitimport.Cred{UID: daemonUID, GID: daemonUID}
}

// hostGit is the daemon user's git (root's when asRoot) with nothing
// inherited: no system or global config, replace objects off.
func hostGit(ctx context.Context, asRoot bool, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_NO_REPLACE_OBJECTS=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(stdin)
	if !asRoot {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: daemonUID, Gid: daemonUID, Groups: []uint32{}}}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// seedRepo gives the tree's repository one empty commit on main and
// feature, as the daemon user (who owns it once the scene is chowned).
func (s *scene) seedRepo() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.gitAsRoot = !daemonReaches(s.repo())
	gd := "--git-dir=" + s.repo()
	tree, err := hostGit(ctx, s.gitAsRoot, "", gd, "mktree")
	if err != nil {
		return err
	}
	env := append(strings.Fields(gitIdentity), gd, "commit-tree", tree, "-m", "the repository before the agent")
	id, err := hostGit(ctx, s.gitAsRoot, "", env...)
	if err != nil {
		return err
	}
	if _, err = hostGit(ctx, s.gitAsRoot, "update refs/heads/main "+id+"\nupdate "+demoBranch+" "+id+"\n", gd, "update-ref", "--stdin"); err != nil {
		return err
	}
	return s.giveBack()
}

// giveBack makes what root's git wrote the daemon's again.
func (s *scene) giveBack() error {
	if !s.gitAsRoot {
		return nil
	}
	return chownTree(s.repo(), daemonUID, daemonUID)
}

// gitReport is the import after the turn (out/demo.json "gitImport").
type gitReport struct {
	Base    string                `json:"base"`
	Updated []gitimport.RefUpdate `json:"updated"`
	Refused []string              `json:"refused,omitempty"`
	// Log is the host's `git log --oneline` of the branch after it.
	Log []string `json:"log"`
	// AsRoot: the daemon user cannot reach the checkout (a directory
	// above it is not searchable), so its git ran as root.
	AsRoot bool `json:"asRoot,omitempty"`
}

// importGit imports the agent's store onto feature as the daemon user and
// reads the branch's log on the host.
func importGit(ctx context.Context, s *scene, base string) (*gitReport, error) {
	rep := &gitReport{Base: base, AsRoot: s.gitAsRoot}
	res, err := gitimport.Import(ctx, gitimport.Options{Repo: s.repo(), StateRoot: filepath.Join(s.host, "srv/paseo/state"), Store: s.store(),
		Agent: demoAgent, Branch: demoBranch, Base: base, Cred: s.cred()})
	if gerr := s.giveBack(); gerr != nil {
		return rep, gerr
	}
	if err != nil {
		rep.Refused = append(rep.Refused, err.Error())
		return rep, nil
	}
	rep.Updated = res.Updated
	log, err := hostGit(ctx, s.gitAsRoot, "", "--git-dir="+s.repo(), "log", "--format=%h %s", demoBranch)
	if err != nil {
		return rep, err
	}
	rep.Log = strings.Split(log, "\n")
	return rep, nil
}

// gitOK: the agent's commit is on feature, on top of the base, and
// nothing was refused.
func (g *gitReport) ok() bool {
	return g != nil && len(g.Refused) == 0 && len(g.Updated) == 1 && g.Updated[0].Ref == demoBranch && g.Updated[0].Old == g.Base &&
		len(g.Log) == 2 && strings.HasSuffix(g.Log[0], " "+demoCommit)
}
