package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// The agent keeps its Git work while host git reads nothing else it wrote
// (docs/spec.md, "Git control data and host git", "Git data and host
// git"). Through Pi's bash tool the agent commits, branches, commits on
// the branch, switches back, stashes, rebases and gcs; the repository's
// bytes are unchanged by all of it (the work is in the agent's store);
// then paseo-policy git import, as the deployment user, brings the commit
// onto the worktree's branch and the stash to refs/paseo/<agent>/stash,
// and nothing else (the branch topic is outside the grant); the
// repository passes fsck. The worktree's HEAD and index, which only host
// git may write, are the bytes (and files) they were. Then the agent plants what host git would follow or run: a hook
// and a config command in the repository it shares (refused), a rewritten
// commondir, a rewritten worktree .git file and a sibling worktree's
// gitdir (each refused, or private to the sandbox: the host's bytes are
// unchanged).
func TestPiGitControl(t *testing.T) {
	e := newEnv(t)
	repo := filepath.Join(e.host, "srv/paseo/repos/proj")
	ws := filepath.Join(e.host, "srv/paseo/workspace/proj-feature")
	common := filepath.Join(repo, ".git")
	gitdir := filepath.Join(common, "worktrees/proj-feature")
	// A real repository with a linked worktree at the workspace, as Paseo
	// makes one per agent; the scene's tree then adds what it lacks.
	initRepo(t, repo)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "feature", ws)
	sc := e.scene(t, "pi-session", "")
	chownTree(t, repo, 1000, 1000)
	chownTree(t, ws, 1000, 1000)
	control := snapshot(t, gitdir, "HEAD", "index")
	pins := snapshot(t, "", filepath.Join(gitdir, "commondir"), filepath.Join(ws, ".git"))
	config := readFile(t, filepath.Join(common, "config"))
	base := hostRev(t, common, "refs/heads/feature")
	before := repoBytes(t, common)

	work := e.bashTurn(t, sc, gitWork(ws, "feature"))
	if after := repoBytes(t, common); after != before {
		t.Errorf("the agent's Git work wrote the repository (issue 30: it goes to the agent's store):\n%s\n---\n%s", before, after)
	}
	importStore(t, sc, common, "refs/heads/feature", base)
	checkGitWork(t, work, repo, "feature")
	control.unchanged(t, "the linked worktree's gitdir")

	// A second sandbox, as the next start of the agent, plants.
	other := filepath.Join(common, "worktrees/other")
	plants := e.bashTurn(t, sc, strings.Join([]string{
		`cd ` + ws,
		`echo 'touch ` + ws + `/HOOK-RAN' > ` + common + `/hooks/post-commit && echo hook-written || echo hook-refused`,
		`git config core.fsmonitor 'touch ` + ws + `/FSMONITOR-RAN' && echo config-written || echo config-refused`,
		// Last: each of these leaves the sandbox's own Git broken.
		`echo /tmp > ` + gitdir + `/commondir && echo commondir-written || echo commondir-refused`,
		`echo 'gitdir: /tmp' > ` + ws + `/.git && echo dotgit-written || echo dotgit-refused`,
		`mkdir ` + other + ` && echo ../.. > ` + other + `/commondir && echo other-written || echo other-refused`,
	}, "; "))
	for _, want := range []string{"hook-refused", "config-refused"} {
		if !strings.Contains(plants, want) {
			t.Errorf("want %s in %q", want, plants)
		}
	}
	if _, err := os.Stat(filepath.Join(common, "hooks/post-commit")); !os.IsNotExist(err) {
		t.Errorf("the hook reached the host (%v)", err)
	}
	if got := readFile(t, filepath.Join(common, "config")); got != config {
		t.Errorf("the repository's config changed: %q", got)
	}
	pins.unchanged(t, "what host git follows from the worktree")
	if _, err := os.Lstat(other); !os.IsNotExist(err) {
		t.Errorf("the sandbox made %s on the host (%v; plants: %q): host git lists and follows a worktree the agent made; the common dir must be read-only in the sandbox (issue 19; docs/spec.md, Git control data and host git)", other, err, plants)
	}
}

// The same with the workspace a main worktree: its .git is the repository
// (workspace.git.gitdir <cwd>/.git, no commondir). A commondir or a
// config.worktree the agent makes there would lead host git elsewhere or
// name commands it runs, so neither may reach the host.
func TestPiGitControlMainWorktree(t *testing.T) {
	e := newEnv(t)
	// Beside the scene's linked worktree (proj-feature, whose .git the
	// scene's tree writes as a file).
	ws := filepath.Join(e.host, "srv/paseo/workspace/proj-main")
	dotgit := filepath.Join(ws, ".git")
	initRepo(t, ws)
	sc := e.scene(t, "pi-session", fmt.Sprintf(`{"workspace":{"cwd":%q,"git":{"gitdir":%q,"commondir":null,"write":true}}}`, ws, dotgit))
	chownTree(t, ws, 1000, 1000)
	control := snapshot(t, dotgit, "HEAD", "index")
	config := readFile(t, filepath.Join(dotgit, "config"))
	base := hostRev(t, dotgit, "refs/heads/main")

	work := e.bashTurn(t, sc, gitWork(ws, "main"))
	importStore(t, sc, dotgit, "refs/heads/main", base)
	checkGitWork(t, work, ws, "main")
	control.unchanged(t, "the main worktree's .git")

	plants := e.bashTurn(t, sc, strings.Join([]string{
		`cd ` + ws,
		`echo 'touch ` + ws + `/HOOK-RAN' > ` + dotgit + `/hooks/post-commit && echo hook-written || echo hook-refused`,
		`git config core.fsmonitor 'touch ` + ws + `/FSMONITOR-RAN' && echo config-written || echo config-refused`,
		`printf '[core]\n\tfsmonitor = touch ` + ws + `/WORKTREE-CONFIG-RAN\n' > ` + dotgit + `/config.worktree && echo config-worktree-written || echo config-worktree-refused`,
		// Last: it leaves the sandbox's own Git broken.
		`echo /tmp > ` + dotgit + `/commondir && echo commondir-written || echo commondir-refused`,
	}, "; "))
	if !strings.Contains(plants, "config-refused") {
		t.Errorf("want config-refused in %q", plants)
	}
	if got := readFile(t, filepath.Join(dotgit, "config")); got != config {
		t.Errorf("the repository's config changed: %q", got)
	}
	// In the sandbox these paths may be its own (a private gitdir); on the
	// host none may exist.
	for _, name := range []string{"hooks/post-commit", "config.worktree", "commondir"} {
		if _, err := os.Lstat(filepath.Join(dotgit, name)); !os.IsNotExist(err) {
			t.Errorf("the sandbox made .git/%s on the host (%v; plants: %q): host git reads it there; the main worktree's .git must be private in the sandbox (issue 19; docs/spec.md, Git control data and host git)", name, err, plants)
		}
	}
}

// bashTurn runs Pi in a new sandbox for sc for one turn in which the
// model calls the bash tool with command, and returns the tool's result.
func (e *env) bashTurn(t *testing.T, sc *testbundle.Scene, command string) string {
	t.Helper()
	e.setScript(t, fakemodel.Bash(command), fakemodel.Text("done"))
	p := e.launch(t, sc)
	p.turn(t, ctx(t), "run it")
	out := e.lastToolResult(t)
	if res := p.stop(t); res.ExitCode != 0 {
		t.Errorf("Pi exit %d, reason %q; stderr: %s", res.ExitCode, res.Reason, p.stderr.String())
	}
	return out
}

// gitWork is the agent's Git session in ws, home being the worktree's
// branch: a commit, a branch with a commit of its own, back home, and a
// stash of a change to the tracked README. Each step echoes NAME-ok or
// NAME-failed.
func gitWork(ws, home string) string {
	return strings.Join([]string{
		`cd ` + ws,
		`export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@example.test GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@example.test`,
		`git commit -q --allow-empty -m by-agent && echo commit-ok || echo commit-failed`,
		`git switch -q -c topic && echo branch-ok || echo branch-failed`,
		`echo topic > topic.txt && git add topic.txt && git commit -q -m on-topic && echo topic-commit-ok || echo topic-commit-failed`,
		`git switch -q ` + home + ` && echo switch-back-ok || echo switch-back-failed`,
		`echo stashed >> README && git stash -q && echo stash-ok || echo stash-failed`,
		`git stash list | grep -q 'stash@{0}' && echo stash-list-ok || echo stash-list-failed`,
		`echo more > more.txt && git add more.txt && git commit -q -m more-on-home && git switch -q topic && git rebase -q ` + home + ` && git switch -q ` + home + ` && echo rebase-ok || echo rebase-failed`,
		`git gc -q && echo gc-ok || echo gc-failed`,
		`git log --format=%s ` + home + ` | grep -q by-agent && echo log-after-gc-ok || echo log-after-gc-failed`,
	}, "; ")
}

// checkGitWork checks gitWork's steps in the tool result out, then, with
// host git in dir, what they left in the repository.
func checkGitWork(t *testing.T, out, dir, home string) {
	t.Helper()
	for _, step := range []string{"commit", "branch", "topic-commit", "switch-back", "stash", "stash-list", "rebase", "gc", "log-after-gc"} {
		if !strings.Contains(out, step+"-ok") {
			t.Errorf("the agent's step %s did not succeed in the sandbox: %q", step, out)
		}
	}
	for _, c := range []struct {
		args       []string
		want, what string
	}{
		{[]string{"log", "--format=%s", home}, "by-agent", "the agent's commit on " + home},
		{[]string{"show", "refs/paseo/agent-7f3c/stash:README"}, "stashed", "the agent's stash, as refs/paseo/agent-7f3c/stash"},
	} {
		if got, err := deployGit(t, dir, c.args...); err != nil || !strings.Contains(got, c.want) {
			t.Errorf("%s is not in the host repository: git %s: %v %q", c.what, strings.Join(c.args, " "), err, got)
		}
	}
	// Outside the grant: never written.
	for _, ref := range []string{"refs/heads/topic", "refs/stash"} {
		if got, err := deployGit(t, dir, "rev-parse", "--verify", "-q", ref); err == nil {
			t.Errorf("%s reached the repository (%q): only the worktree's branch and the agent's namespace are imported", ref, got)
		}
	}
	if got, err := deployGit(t, dir, "fsck", "--strict", "--no-dangling"); err != nil || strings.TrimSpace(got) != "" {
		t.Errorf("git fsck of the repository after the import: %v %q", err, got)
	}
}

// importStore runs paseo-policy git import as the deployment user, as the
// daemon would after the turn: the agent's store into the repository
// (Git dir repo), the branch from base.
func importStore(t *testing.T, sc *testbundle.Scene, repo, branch, base string) {
	t.Helper()
	bin := testbundle.BuildStatic(t, "./cmd/paseo-policy")
	searchable(t, bin)
	store := filepath.Join(sc.Host, "srv/paseo/state/pi-git/agent-7f3c")
	searchable(t, store)
	cmd := exec.Command(bin, "-o", "json", "git", "import", "--home", "/nonexistent", "--repo", repo,
		"--state-root", filepath.Join(sc.Host, "srv/paseo/state"), "--store", store, "--agent", "agent-7f3c", "--branch", branch, "--base", base)
	cmd.Env = gitEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git import: %v\n%s", err, out)
	}
	t.Logf("git import: %s", out)
}

// hostRev is ref's id in the Git dir repo, read as root at setup.
func hostRev(t *testing.T, repo, ref string) string {
	t.Helper()
	out, err := exec.Command("git", "--git-dir="+repo, "rev-parse", ref).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// repoBytes lists the repository's objects, refs, packed-refs and logs
// with their sizes: what the sandbox's Git must never write.
func repoBytes(t *testing.T, common string) string {
	t.Helper()
	var out []string
	for _, d := range []string{"objects", "refs", "logs", "packed-refs"} {
		_ = filepath.Walk(filepath.Join(common, d), func(p string, fi os.FileInfo, err error) error {
			if err == nil {
				out = append(out, fmt.Sprintf("%s %v %d", p, fi.Mode(), fi.Size()))
			}
			return nil
		})
	}
	return strings.Join(out, "\n")
}

// initRepo makes a repository at dir whose main branch has one commit
// with a tracked README.
func initRepo(t *testing.T, dir string) {
	t.Helper()
	hostSetupGit(t, "init", "-q", "-b", "main", dir)
	write(t, filepath.Join(dir, "README"), "proj\n")
	hostSetupGit(t, "-C", dir, "add", "README")
	hostSetupGit(t, "-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.test", "commit", "-q", "-m", "init")
}

// hostSetupGit runs git as root to build the layout; any failure fails the test.
func hostSetupGit(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = gitEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// deployGit runs git in dir as the deployment user (uid 1000, who owns
// the repository, so no safe.directory), as the daemon does.
func deployGit(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	searchable(t, dir)
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, gitEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// gitEnv is nothing inherited but PATH: no system or global config, never
// a prompt.
func gitEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0", "LANG=C", "LC_ALL=C"}
}

// searchable lets uid 1000 reach dir through the test's temporary
// directories, which testing makes 0700 for root.
func searchable(t *testing.T, dir string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for d := filepath.Dir(dir); strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// files holds host files' bytes and identities, to show that nothing
// wrote them: Git writes HEAD and the index by renaming a new file over
// the old, so even a write of the same bytes (HEAD after switching back)
// leaves a new file.
type files struct {
	dir   string
	names []string
	data  map[string][]byte
	stat  map[string]os.FileInfo
}

func snapshot(t *testing.T, dir string, names ...string) files {
	t.Helper()
	f := files{dir: dir, names: names, data: map[string][]byte{}, stat: map[string]os.FileInfo{}}
	for _, n := range names {
		p := filepath.Join(dir, n)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		f.data[n], f.stat[n] = data, st
	}
	return f
}

func (f files) unchanged(t *testing.T, what string) {
	t.Helper()
	for _, n := range f.names {
		p := filepath.Join(f.dir, n)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %s: %v", what, p, err)
			continue
		}
		st, err := os.Lstat(p)
		switch {
		case err != nil:
			t.Errorf("%s: %s: %v", what, p, err)
		case !bytes.Equal(data, f.data[n]):
			t.Errorf("%s: the sandbox wrote %s on the host (%d bytes, were %d; now %.120q): host git reads it, so in the sandbox it must be private or read-only (issue 19; docs/spec.md, Git control data and host git)", what, p, len(data), len(f.data[n]), data)
		case !sameInode(st, f.stat[n]):
			t.Errorf("%s: the sandbox replaced %s on the host (same bytes, a new file): host git reads it, so in the sandbox it must be private or read-only (issue 19; docs/spec.md, Git control data and host git)", what, p)
		}
	}
}

// sameInode is os.SameFile and the same inode change time: a new file may
// get the number of the one it replaced, never its ctime.
func sameInode(a, b os.FileInfo) bool {
	sa, sb := a.Sys().(*syscall.Stat_t), b.Sys().(*syscall.Stat_t)
	return os.SameFile(a, b) && sa.Ctim == sb.Ctim
}
