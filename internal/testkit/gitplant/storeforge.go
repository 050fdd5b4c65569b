package gitplant

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// Forged object indexes in the agent's own store, against the import.
// The agent commits two commits on its branch (a pack of its own, as its
// gc leaves them) and plants beside them a pack of one blob ("evil") with
// a multi-pack-index claiming its first commit's work.txt for it, and a
// commit-graph giving that commit an empty root tree. Git reading the
// store as a repository (the control: what a naive import, a fetch from
// the store, would run) answers with the forgeries; git import, which
// indexes every pack afresh and reads no index file of the agent's, must
// bring the commits' true content.

// StoreForgeScript plants the agent's work and the forged indexes into
// its store (/run/paseo/git-store) from inside the sandbox, printing
// label=ok or the error.
const StoreForgeScript = `b=/bin/busybox
W=$PASEO_AGENT_CWD
. $W/storeforge/plant.env
F=$W/storeforge
S=${STORE:-/run/paseo/git-store}
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
try work $b sh -c "$b mkdir -p $S/objects/pack $S/refs/heads && $b cp $F/$WORKPACK.pack $F/$WORKPACK.idx $S/objects/pack/ && echo $TIP > $S/refs/heads/feature"
try multi-pack-index $b sh -c "$b cp $F/$EVILPACK.pack $F/$EVILPACK.idx $F/multi-pack-index $S/objects/pack/"
try commit-graph $b sh -c "$b mkdir -p $S/objects/info && $b cp $F/commit-graph $S/objects/info/commit-graph"
`

// StoreForgeSurfaces are the forgeries StoreForgeScript plants, each with
// what git reading the store shows once it is there.
var StoreForgeSurfaces = []struct{ Name, Effect string }{
	{"multi-pack-index", "the agent's first commit's work.txt reads \"evil\" under its id"},
	{"commit-graph", "a walk of the agent's branch gives its first commit an empty root tree"},
}

// StoreForge is what the agent commits: First (work.txt is Work, "agent
// work") and Tip, First's child.
type StoreForge struct {
	First, Tip, Work string
}

// PrepareStoreForge writes the agent's pack and the forgeries into the
// workspace (storeforge/), for StoreForgeScript to plant.
func (l *WriteLab) PrepareStoreForge(t testing.TB) StoreForge {
	t.Helper()
	ws := filepath.Join(l.Host, "srv/paseo/workspace/proj-feature")
	dir := filepath.Join(ws, "storeforge")
	mkdirAll(t, dir)
	// The agent's commits, in a repository that borrows the shared one's
	// objects as the store does.
	scratch := filepath.Join(dir, "agent.git")
	l.git(t, "", "init", "-q", "--bare", scratch)
	writeFile(t, filepath.Join(scratch, "objects/info/alternates"), filepath.Join(l.Common, "objects")+"\n")
	var f StoreForge
	f.Work = l.blob(t, scratch, "agent work\n")
	work2 := l.blob(t, scratch, "agent work, second\n")
	tree := func(work string) string {
		return l.gitIn(t, scratch, fmt.Sprintf("100644 blob %s\tLICENSE\n100644 blob %s\tREADME\n100644 blob %s\twork.txt\n", l.License, l.Readme, work), "mktree")
	}
	f.First = l.git(t, scratch, "commit-tree", "-p", l.Main, "-m", "agent 1", tree(f.Work))
	f.Tip = l.git(t, scratch, "commit-tree", "-p", f.First, "-m", "agent 2", tree(work2))
	l.git(t, scratch, "update-ref", "refs/heads/feature", f.Tip)
	workPack := "pack-" + l.gitIn(t, scratch, f.Tip+"\n^"+l.Main+"\n", "pack-objects", "-q", "--revs", filepath.Join(scratch, "objects/pack/pack"))
	copyFiles(t, filepath.Join(scratch, "objects/pack"), dir, workPack+".pack", workPack+".idx")
	// The commit-graph of the agent's branch, First given the empty tree.
	l.git(t, scratch, "commit-graph", "write", "--reachable")
	copyFiles(t, filepath.Join(scratch, "objects/info"), dir, "commit-graph")
	ForgeCommitGraph(t, filepath.Join(dir, "commit-graph"), f.First, emptyTree)
	// A pack of one blob, "evil", and a multi-pack-index claiming Work for it.
	evil := filepath.Join(dir, "evil.git")
	l.git(t, "", "init", "-q", "--bare", evil)
	evilPack := "pack-" + l.gitIn(t, evil, l.blob(t, evil, "evil\n")+"\n", "pack-objects", "-q", filepath.Join(evil, "objects/pack/pack"))
	l.git(t, evil, "multi-pack-index", "write")
	copyFiles(t, filepath.Join(evil, "objects/pack"), dir, evilPack+".pack", evilPack+".idx", "multi-pack-index")
	ForgeMIDX(t, filepath.Join(dir, "multi-pack-index"), f.Work)
	for _, p := range []string{scratch, evil} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "plant.env"), fmt.Sprintf("WORKPACK=%s\nEVILPACK=%s\nTIP=%s\n", workPack, evilPack, f.Tip))
	chownAll(t, dir, l.uid)
	return f
}

// PlantStoreOnHost runs StoreForgeScript on the host as the deployment
// user, into the store (what the sandbox does, for tests without one).
func (l *WriteLab) PlantStoreOnHost(t testing.TB) string {
	t.Helper()
	cmd := exec.Command("/bin/busybox", "sh", "-c", StoreForgeScript)
	cmd.Env = append(writeLabEnv(), "PASEO_AGENT_CWD="+filepath.Join(l.Host, "srv/paseo/workspace/proj-feature"), "STORE="+l.Store)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("store plant: %v %s", err, out)
	}
	return string(out)
}

// StoreAsRepository is the control: a copy of the store, given the HEAD
// and config the sandbox sees there, read by git as a repository, as the
// deployment user. A surface wins when git shows its forgery.
func (l *WriteLab) StoreAsRepository(t testing.TB, f StoreForge) map[string]bool {
	t.Helper()
	cp := filepath.Join(filepath.Dir(l.Store), "store-as-repository")
	if out, err := exec.Command("cp", "-R", l.Store, cp).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	writeFile(t, filepath.Join(cp, "HEAD"), "ref: refs/heads/feature\n")
	writeFile(t, filepath.Join(cp, "config"), "[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
	chownAll(t, cp, l.uid)
	return l.forgeEffects(cp, f)
}

// Imported reads the shared repository after the import: the branch's
// tip, and whether either forgery shows there.
func (l *WriteLab) Imported(t testing.TB, f StoreForge) (tip string, won map[string]bool) {
	t.Helper()
	tip, _ = l.deployGit("--git-dir="+l.Common, "rev-parse", "refs/heads/feature")
	return strings.TrimSpace(tip), l.forgeEffects(l.Common, f)
}

func (l *WriteLab) forgeEffects(gitDir string, f StoreForge) map[string]bool {
	got, _ := l.deployGit("--git-dir="+gitDir, "cat-file", "blob", f.Work)
	log, _ := l.deployGit("--git-dir="+gitDir, "log", "--format=%T", "refs/heads/feature")
	return map[string]bool{
		"multi-pack-index": got == "evil\n",
		"commit-graph":     slices.Contains(strings.Fields(log), emptyTree),
	}
}

// Fsck is git fsck of the shared repository, as the deployment user.
func (l *WriteLab) Fsck() error {
	out, err := l.deployGit("--git-dir="+l.Common, "fsck", "--strict", "--no-dangling")
	if err != nil {
		return fmt.Errorf("fsck: %v: %s", err, out)
	}
	return nil
}

func (l *WriteLab) blob(t testing.TB, gitDir, content string) string {
	t.Helper()
	return l.gitIn(t, gitDir, content, "hash-object", "-w", "--stdin")
}

// gitIn is git (as root, in the lab's clean environment) with stdin.
func (l *WriteLab) gitIn(t testing.TB, gitDir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"--git-dir=" + gitDir}, args...)...)
	cmd.Env, cmd.Stdin = writeLabEnv(), strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}
