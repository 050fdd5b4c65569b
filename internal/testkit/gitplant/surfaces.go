package gitplant

import (
	"path/filepath"
	"testing"
)

// Surface is one place a sandboxed agent can write that host git reads.
type Surface struct {
	Name   string
	Layout Spec
	// Agent is the worktree whose sandbox plants, Host the one whose host
	// git is meant to run the payload ("" is the main worktree).
	Agent, Host string
	// Prepare, when set, makes what the plant names outside every
	// sandbox (another workspace's object store, a directory elsewhere on
	// the host): it exists before the agent starts, so a plant made from a
	// sandbox, which cannot see it, can still name it.
	Prepare func(t testing.TB, p Plot)
	// Plant writes the payload with plain file operations only.
	Plant func(t testing.TB, p Plot)
	// Runs are the daemon commands that run the payload with git 2.39.5;
	// none means the surface executes nothing, for the reason in Why.
	Runs []string
	Why  string
	// Shows is an effect short of execution: a command whose output must
	// hold the text once planted.
	Shows map[string]string
}

var (
	configRuns = []string{"status", "diff", "log"} // fsmonitor on index read, gpg on log
	indexRuns  = []string{"status", "diff"}        // a child status in the nested repository
	linked     = Spec{Linked: []string{"wt1"}}
	siblings   = Spec{Linked: []string{"wt1", "wt2"}}
)

// Surfaces is the catalogue, executing surfaces first.
var Surfaces = []Surface{
	{Name: "gitdir commondir rewritten to a fake common dir", Layout: linked, Agent: "wt1", Host: "wt1", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.GitDir, "commondir"), p.FakeCommon(t, p.GitDir)+"\n")
		}},
	{Name: "gitdir commondir names a symlink to a fake common dir", Layout: linked, Agent: "wt1", Host: "wt1", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			link := filepath.Join(p.WT, ".plant", "common-link")
			symlink(t, p.FakeCommon(t, p.GitDir), link)
			writeFile(t, filepath.Join(p.GitDir, "commondir"), link+"\n")
		}},
	{Name: "worktree .git file rewritten to a fake gitdir", Layout: linked, Agent: "wt1", Host: "wt1", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			fake := filepath.Join(p.WT, ".plant", "gitdir")
			p.FakeRepo(t, fake, "refs/heads/main")
			writeFile(t, filepath.Join(p.WT, ".git"), "gitdir: "+fake+"\n")
		}},
	{Name: "worktree .git replaced by a symlink to a fake gitdir", Layout: linked, Agent: "wt1", Host: "wt1", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			fake := filepath.Join(p.WT, ".plant", "gitdir")
			p.FakeRepo(t, fake, "refs/heads/main")
			remove(t, filepath.Join(p.WT, ".git"))
			symlink(t, fake, filepath.Join(p.WT, ".git"))
		}},
	{Name: "commondir created in a main worktree's .git", Layout: Spec{}, Agent: "", Host: "", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.GitDir, "commondir"), p.FakeCommon(t, p.GitDir)+"\n")
		}},
	{Name: "commondir created in the common dir from a linked worktree, reaching the main one", Layout: linked, Agent: "wt1", Host: "", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.Common, "commondir"), p.FakeCommon(t, p.Common)+"\n")
		}},
	{Name: "config.worktree with extensions.worktreeConfig", Layout: Spec{WorktreeConfig: true, Linked: []string{"wt1"}}, Agent: "wt1", Host: "wt1", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.GitDir, "config.worktree"), p.Config(t))
			p.SignHead(t, p.GitDir)
		}},
	{Name: "main worktree .git/config.worktree with extensions.worktreeConfig", Layout: Spec{WorktreeConfig: true}, Agent: "", Host: "", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.GitDir, "config.worktree"), p.Config(t))
			p.SignHead(t, p.GitDir)
		}},
	{Name: "sibling's worktrees/<other>/commondir", Layout: siblings, Agent: "wt1", Host: "wt2", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			other := p.Repo.GitDir("wt2")
			writeFile(t, filepath.Join(other, "commondir"), p.FakeCommon(t, other)+"\n")
		}},
	{Name: "sibling's worktrees/<other>/config.worktree with extensions.worktreeConfig", Layout: Spec{WorktreeConfig: true, Linked: []string{"wt1", "wt2"}}, Agent: "wt1", Host: "wt2", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			other := p.Repo.GitDir("wt2")
			writeFile(t, filepath.Join(other, "config.worktree"), p.Config(t))
			p.SignHead(t, other)
		}},
	{Name: "sibling's worktrees/<other> renamed away and remade", Layout: siblings, Agent: "wt1", Host: "wt2", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			other := p.Repo.GitDir("wt2")
			rename(t, other, other+".old")
			copyFiles(t, other+".old", other, "HEAD", "gitdir", "index")
			writeFile(t, filepath.Join(other, "commondir"), p.FakeCommon(t, other)+"\n")
		}},
	{Name: "worktrees/ renamed away and the agent's gitdir remade", Layout: linked, Agent: "wt1", Host: "wt1", Runs: configRuns,
		Plant: func(t testing.TB, p Plot) {
			dir := filepath.Join(p.Common, "worktrees")
			rename(t, dir, dir+".old")
			copyFiles(t, filepath.Join(dir+".old", "wt1"), p.GitDir, "HEAD", "gitdir", "index")
			writeFile(t, filepath.Join(p.GitDir, "commondir"), p.FakeCommon(t, p.GitDir)+"\n")
		}},
	{Name: "hooks/ created where the template made none", Layout: Spec{EmptyTemplate: true}, Agent: "", Host: "", Runs: []string{"status", "diff"},
		Plant: func(t testing.TB, p Plot) {
			p.AllHooks(t, filepath.Join(p.Common, "hooks"))
			backdate(t, filepath.Join(p.WT, "README")) // the refresh then writes the index: post-index-change
		}},
	{Name: "submodule's own gitdir config (modules/<name>/config)", Layout: Spec{Submodule: "sub"}, Agent: "", Host: "", Runs: indexRuns,
		Plant: func(t testing.TB, p Plot) {
			appendFile(t, filepath.Join(p.Common, "modules", "sub", "config"), p.Config(t))
		}},
	{Name: "submodule's own hooks (modules/<name>/hooks)", Layout: Spec{Submodule: "sub"}, Agent: "", Host: "", Runs: indexRuns,
		Plant: func(t testing.TB, p Plot) {
			p.AllHooks(t, filepath.Join(p.Common, "modules", "sub", "hooks"))
			backdate(t, filepath.Join(p.WT, "sub", "lib.txt")) // the child status then writes the submodule's index
		}},
	{Name: "submodule's .git file rewritten to a fake gitdir", Layout: Spec{Submodule: "sub"}, Agent: "", Host: "", Runs: indexRuns,
		Plant: func(t testing.TB, p Plot) {
			fake := filepath.Join(p.WT, ".plant", "subgit")
			p.FakeRepo(t, fake, "refs/heads/main")
			writeFile(t, filepath.Join(p.WT, "sub", ".git"), "gitdir: "+fake+"\n")
		}},
	{Name: "gitlink written into the index, nested .git dir, no .gitmodules", Layout: Spec{}, Agent: "", Host: "", Runs: indexRuns,
		Plant: func(t testing.TB, p Plot) {
			p.FakeRepo(t, filepath.Join(p.WT, "vendor", "x", ".git"), "refs/heads/main")
			rewriteIndex(t, filepath.Join(p.GitDir, "index"), []indexEntry{gitlink(t, "vendor/x", emptyTree)}, nil)
		}},
	{Name: "core.worktree in a fake gitdir's config", Layout: linked, Agent: "wt1", Host: "wt1",
		Why:     "no payload: the fake config only sets core.worktree (honoured in a gitdir without commondir, ignored in a linked one's common config), and nothing runs; the daemon's toplevel, where status and diff look, becomes the agent's choice",
		Shows:   map[string]string{"rev-parse": "/elsewhere"},
		Prepare: func(t testing.TB, p Plot) { mkdirAll(t, elsewhere(p)) },
		Plant: func(t testing.TB, p Plot) {
			fake := filepath.Join(p.WT, ".plant", "gitdir")
			mkdirAll(t, filepath.Join(fake, "objects"))
			mkdirAll(t, filepath.Join(fake, "refs"))
			writeFile(t, filepath.Join(fake, "HEAD"), "ref: refs/heads/main\n")
			writeFile(t, filepath.Join(fake, "config"), "[core]\n\trepositoryformatversion = 0\n\tworktree = "+elsewhere(p)+"\n")
			writeFile(t, filepath.Join(p.WT, ".git"), "gitdir: "+fake+"\n")
		}},
	{Name: "config.worktree without extensions.worktreeConfig", Layout: linked, Agent: "wt1", Host: "wt1",
		Why: "Git reads config.worktree only when the repository's config (read-only in the sandbox) sets extensions.worktreeConfig",
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.GitDir, "config.worktree"), p.Config(t))
			p.SignHead(t, p.GitDir)
		}},
	{Name: "info/ files (attributes naming drivers, exclude, sparse-checkout)", Layout: Spec{}, Agent: "", Host: "",
		Why: "attributes only name drivers; a driver's command comes from config (filter.<d>.clean, diff.<d>.command or textconv), read-only here or the daemon's own, and built-in diff drivers run nothing. A driver the daemon's global config defines (git-lfs's filter.lfs) would run on files the agent chooses, but it is the daemon's command",
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.Common, "info", "attributes"), "* diff=plant filter=plant merge=plant\n*.txt diff=cpp\n")
			writeFile(t, filepath.Join(p.Common, "info", "exclude"), p.Payload(t, "exclude")+"\n")
			writeFile(t, filepath.Join(p.Common, "info", "sparse-checkout"), "!"+p.Payload(t, "sparse")+"\n")
			backdate(t, filepath.Join(p.WT, "README"))
		}},
	{Name: ".gitattributes naming drivers", Layout: Spec{}, Agent: "", Host: "",
		Why: "as info/attributes: a driver needs a command defined in config, which the agent cannot write here",
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.WT, ".gitattributes"), "* diff=plant filter=plant merge=plant ident\n")
			appendFile(t, filepath.Join(p.WT, "README"), "changed\n")
		}},
	{Name: ".gitmodules edited (update=!command, url, ignore)", Layout: Spec{Submodule: "sub"}, Agent: "", Host: "",
		Why: "Git takes only data from .gitmodules (path, url, branch, ignore, fetchRecurseSubmodules); update=!command is refused there, and only `git submodule update` would run one",
		Plant: func(t testing.TB, p Plot) {
			payload := p.Payload(t, "gitmodules")
			writeFile(t, filepath.Join(p.WT, ".gitmodules"), "[submodule \"sub\"]\n\tpath = sub\n\turl = file://"+payload+
				"\n\tupdate = !"+payload+"\n\tignore = none\n\tfetchRecurseSubmodules = true\n")
		}},
	{Name: "objects/info/alternates created", Layout: Spec{}, Agent: "", Host: "",
		Why:     "data: Git reads objects from the listed store and runs nothing; but host git then shows (and a fetch serves) objects from a store the agent named, outside its sandbox",
		Shows:   map[string]string{"log": "from another store"},
		Prepare: func(t testing.TB, p Plot) { writeObject(t, otherObjects(p), "commit", otherCommit) },
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.Common, "objects", "info", "alternates"), otherObjects(p)+"\n")
			// Names the commit by its id, 40 hex digits: no object needed in the sandbox.
			moveHead(t, p.GitDir, p.Common, objectID("commit", otherCommit))
		}},
	{Name: "packed-refs and loose refs", Layout: Spec{}, Agent: "", Host: "",
		Why: "refs are names and object ids; Git parses them and runs nothing",
		Plant: func(t testing.TB, p Plot) {
			payload := p.Payload(t, "refs")
			writeFile(t, filepath.Join(p.Common, "packed-refs"), "# pack-refs with: peeled fully-peeled sorted \n"+emptyTree+" refs/heads/$("+payload+")\n")
			writeFile(t, filepath.Join(p.Common, "refs", "heads", "plant"), "ref: "+payload+"\n")
			writeFile(t, filepath.Join(p.Common, "refs", "remotes", "origin", "HEAD"), "ref: refs/heads/`"+payload+"`\n")
		}},
	{Name: "index extensions: fsmonitor token, unknown optional extension", Layout: Spec{}, Agent: "", Host: "",
		Why: "the index is data: the FSMN token goes only to a core.fsmonitor hook the config names, and optional extensions Git does not know are skipped",
		Plant: func(t testing.TB, p Plot) {
			payload := p.Payload(t, "token")
			rewriteIndex(t, filepath.Join(p.GitDir, "index"), nil, append(fsmonitorExt("$("+payload+")"), extension("ZPLT", []byte(payload))...))
		}},
	{Name: "index fsmonitor token with a reviewed core.fsmonitor hook", Layout: Spec{Fsmonitor: true}, Agent: "", Host: "",
		Why:   "Git hands the token to the hook as one argument, not through a shell: nothing in it runs",
		Shows: map[string]string{"status": "daemon-fsmonitor token: $("},
		Plant: func(t testing.TB, p Plot) {
			payload := p.Payload(t, "token")
			rewriteIndex(t, filepath.Join(p.GitDir, "index"), nil, fsmonitorExt("$("+payload+");`"+payload+"`"))
		}},
	{Name: "rebase state with exec lines", Layout: Spec{}, Agent: "", Host: "",
		Why: "status reports an operation in progress and prints its todo list; it never runs it",
		Plant: func(t testing.TB, p Plot) {
			payload := p.Payload(t, "rebase")
			head := readFile(t, filepath.Join(p.Common, "refs", "heads", "main"))
			dir := filepath.Join(p.GitDir, "rebase-merge")
			for name, text := range map[string]string{"head-name": "refs/heads/main\n", "onto": head, "orig-head": head,
				"interactive": "", "msgnum": "1\n", "end": "2\n", "done": "exec " + payload + "\n", "git-rebase-todo": "exec " + payload + "\n"} {
				writeFile(t, filepath.Join(dir, name), text)
			}
		}},
	{Name: "gitdir backpointer (worktrees/<name>/gitdir) rewritten", Layout: linked, Agent: "wt1", Host: "wt1",
		Why: "worktree list prints the path it names; nothing is run (only `git worktree prune` or `repair` would act on it)",
		Plant: func(t testing.TB, p Plot) {
			writeFile(t, filepath.Join(p.GitDir, "gitdir"), p.Payload(t, "backpointer")+"\n")
		}},
}

// otherObjects is another workspace's object store, outside the agent's
// sandbox; otherCommit is the commit stored there.
func otherObjects(p Plot) string { return filepath.Join(p.Lab.Dir, "other-objects") }

const otherCommit = "tree " + emptyTree + "\nauthor O <o@example.invalid> 1 +0000\ncommitter O <o@example.invalid> 1 +0000\n\nfrom another store\n"

// elsewhere is a host directory beside the workspace, outside the sandbox.
func elsewhere(p Plot) string { return filepath.Join(p.Repo.Root, "elsewhere") }

// Prepared builds the surface's layout and what its plant names outside
// the sandbox, and returns the plot to plant on.
func (l *Lab) Prepared(t testing.TB, s Surface) (*Repo, Plot) {
	t.Helper()
	r := l.Build(t, s.Layout)
	p := Plot{Lab: l, Repo: r, WT: r.Worktree(s.Agent), GitDir: r.GitDir(s.Agent), Common: r.Common}
	if s.Prepare != nil {
		s.Prepare(t, p)
		l.Own(t)
	}
	return r, p
}

// Planted builds the surface's layout and plants it.
func (l *Lab) Planted(t testing.TB, s Surface) (*Repo, Plot) {
	t.Helper()
	r, p := l.Prepared(t, s)
	s.Plant(t, p)
	return r, p
}

// Trigger runs each daemon command on a fresh plant of s in the Host
// worktree: one command can use up what would trigger the next (status
// writes the refreshed index, so diff then finds nothing stale).
func (l *Lab) Trigger(t testing.TB, s Surface) map[string]Result {
	t.Helper()
	out := map[string]Result{}
	for _, c := range Commands {
		r, _ := l.Planted(t, s)
		out[c.Name] = l.Run(t, c, r.Worktree(s.Host))
	}
	return out
}
