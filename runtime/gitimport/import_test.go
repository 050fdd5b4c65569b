package gitimport

import (
	"bytes"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// lab is a shared repository with main and the agent's branch feature, and
// the agent's store as the sandbox leaves it (docs/spec.md, "Git data and
// host git"): the repository's refs copied in at its first launch, the
// repository's objects as its alternate, and the agent's objects and refs
// written by real git with the store as its commondir.
type lab struct {
	root, repo, state, store string
	main, feature            string // ids at launch
}

const agent = "agent-1"

func newLab(t *testing.T) *lab {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed: apt-get install git")
	}
	root := t.TempDir()
	l := &lab{root: root, repo: filepath.Join(root, "repos/proj.git"), state: filepath.Join(root, "state"), store: filepath.Join(root, "state/pi-git", agent)}
	l.git(t, "", "init", "-q", "--bare", "-b", "main", l.repo)
	base := l.commitOn(t, l.repo, "", "README", "proj\n")
	l.git(t, l.repo, "update-ref", "refs/heads/main", base)
	l.git(t, l.repo, "update-ref", "refs/heads/feature", base)
	l.git(t, l.repo, "update-ref", "refs/heads/sibling/work", base)
	l.main, l.feature = base, base
	// The store as the start script seeds it.
	for _, d := range []string{"objects/info", "logs"} {
		if err := os.MkdirAll(filepath.Join(l.store, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", "-R", filepath.Join(l.repo, "refs"), filepath.Join(l.store, "refs")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	writeFile(t, filepath.Join(l.store, "objects/info/alternates"), filepath.Join(l.repo, "objects")+"\n")
	writeFile(t, filepath.Join(l.store, "HEAD"), "ref: refs/paseo/host-worktree\n")
	writeFile(t, filepath.Join(l.store, "config"), "[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
	return l
}

// git runs real git with a clean environment; dir is its --git-dir.
func (l *lab) git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := l.gitErr(dir, args...)
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return out
}

func (l *lab) gitErr(dir string, args ...string) (string, error) {
	full := []string{"-c", "user.name=a", "-c", "user.email=a@example.test"}
	if dir != "" {
		full = append(full, "--git-dir="+dir)
	}
	cmd := exec.Command("git", append(full, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C",
		"GIT_AUTHOR_DATE=1700000000 +0000", "GIT_COMMITTER_DATE=1700000000 +0000"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%v: %s", err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// commitOn writes, with git in dir, a commit of one file on parent.
func (l *lab) commitOn(t *testing.T, dir, parent, file, content string) string {
	t.Helper()
	blob := l.gitIn(t, dir, content, "hash-object", "-w", "--stdin")
	tree := l.gitIn(t, dir, fmt.Sprintf("100644 blob %s\t%s\n", blob, file), "mktree")
	args := []string{"commit-tree", tree, "-m", "by " + file}
	if parent != "" {
		args = append(args, "-p", parent)
	}
	return l.git(t, dir, args...)
}

func (l *lab) gitIn(t *testing.T, dir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"--git-dir=" + dir}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C"}
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// agentWork is a session in the store: a commit on feature, a branch of
// the agent's namespace, a stash, and main moved (outside the grant).
func (l *lab) agentWork(t *testing.T) (feature, topic, stash string) {
	t.Helper()
	feature = l.commitOn(t, l.store, l.feature, "work.txt", "agent work\n")
	topic = l.commitOn(t, l.store, feature, "topic.txt", "topic\n")
	stash = l.commitOn(t, l.store, feature, "README", "stashed\n")
	l.git(t, l.store, "update-ref", "refs/heads/feature", feature)
	l.git(t, l.store, "update-ref", "refs/heads/"+agent+"/topic", topic)
	l.git(t, l.store, "update-ref", "refs/stash", stash)
	l.git(t, l.store, "update-ref", "refs/heads/main", topic)
	return feature, topic, stash
}

func (l *lab) options() Options {
	return Options{Repo: l.repo, StateRoot: l.state, Store: l.store, Agent: agent, Branch: "refs/heads/feature", Base: l.feature, Home: "/nonexistent", WorkDir: l.root}
}

// snapshot is the shared repository's refs and object files: what an
// import that refuses must leave as it was.
func (l *lab) snapshot(t *testing.T) string {
	t.Helper()
	var files []string
	err := filepath.Walk(filepath.Join(l.repo, "objects"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			files = append(files, fmt.Sprintf("%s %d", p, fi.Size()))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return l.git(t, l.repo, "for-each-ref") + "\n" + strings.Join(files, "\n")
}

func (l *lab) fsckClean(t *testing.T) {
	t.Helper()
	if out, err := l.gitErr(l.repo, "fsck", "--strict", "--no-dangling"); err != nil || out != "" {
		t.Errorf("git fsck of the shared repository: %v %q", err, out)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func codes(err error) []diag.Code {
	var l diag.List
	if !errors.As(err, &l) {
		return nil
	}
	var out []diag.Code
	for _, d := range l {
		out = append(out, d.Code)
	}
	return out
}

func wantRefused(t *testing.T, err error, code diag.Code) {
	t.Helper()
	if !slices.Contains(codes(err), code) {
		t.Fatalf("want a refusal %s, got %v", code, err)
	}
}

// The agent's commits reach its branch, its namespace and its stash; main,
// which it moved in its store, does not move; a second import changes
// nothing; the repository passes fsck.
func TestImportAgentCommits(t *testing.T) {
	l := newLab(t)
	feature, topic, stash := l.agentWork(t)
	res, err := Import(context.Background(), l.options())
	if err != nil {
		t.Fatal(err)
	}
	want := []RefUpdate{
		{Ref: "refs/heads/" + agent + "/topic", New: topic},
		{Ref: "refs/heads/feature", Old: l.feature, New: feature},
		{Ref: "refs/paseo/" + agent + "/stash", New: stash},
	}
	if fmt.Sprint(res.Updated) != fmt.Sprint(want) {
		t.Errorf("updated %v, want %v", res.Updated, want)
	}
	if res.Branch != feature {
		t.Errorf("the branch's new value (the next base) %q, want %s", res.Branch, feature)
	}
	if got, err := RefValue(context.Background(), l.repo, "refs/heads/feature", "", nil); err != nil || got != feature {
		t.Errorf("RefValue: %q %v", got, err)
	}
	if got, err := RefValue(context.Background(), l.repo, "refs/heads/feat", "", nil); err != nil || got != "" {
		t.Errorf("RefValue of a prefix: %q %v", got, err)
	}
	if len(res.Ignored) != 1 || !strings.Contains(res.Ignored[0].Path, "refs/heads/main") || res.Ignored[0].Code != diag.GitImportRef {
		t.Errorf("ignored: %v, want main listed", res.Ignored)
	}
	for ref, id := range map[string]string{"refs/heads/feature": feature, "refs/heads/" + agent + "/topic": topic, "refs/paseo/" + agent + "/stash": stash, "refs/heads/main": l.main, "refs/heads/sibling/work": l.main} {
		if got := l.git(t, l.repo, "rev-parse", ref); got != id {
			t.Errorf("%s: %s, want %s", ref, got, id)
		}
	}
	if got := l.git(t, l.repo, "show", "refs/paseo/"+agent+"/stash:README"); got != "stashed" {
		t.Errorf("the stash's README: %q", got)
	}
	l.fsckClean(t)
	if res.Loose == 0 {
		t.Error("no loose objects were copied")
	}
	o := l.options()
	o.Base = feature
	res, err = Import(context.Background(), o)
	if err != nil || len(res.Updated) != 0 || res.Branch != feature {
		t.Errorf("second import: %v %q %v", res.Updated, res.Branch, err)
	}
}

// After the agent's own gc its objects are in a pack: the import indexes
// it itself. Its .idx, which the agent wrote, is replaced by a lying one
// (another pack's), and a multi-pack-index, commit-graph and bitmap are
// planted beside it; the import reads none of them.
func TestImportPackedStore(t *testing.T) {
	l := newLab(t)
	feature, _, _ := l.agentWork(t)
	l.git(t, l.store, "repack", "-a", "-d", "-l", "-q")
	l.git(t, l.store, "prune-packed")
	packs, _ := filepath.Glob(filepath.Join(l.store, "objects/pack/*.idx"))
	if len(packs) != 1 {
		t.Fatalf("packs: %v", packs)
	}
	// A pack of another repository, whose idx claims other objects.
	other := filepath.Join(l.root, "other.git")
	l.git(t, "", "init", "-q", "--bare", other)
	c := l.commitOn(t, other, "", "x", "other\n")
	l.git(t, other, "update-ref", "refs/heads/main", c)
	l.git(t, other, "repack", "-a", "-d", "-q")
	otherIdx, _ := filepath.Glob(filepath.Join(other, "objects/pack/*.idx"))
	data, err := os.ReadFile(otherIdx[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(packs[0], 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, packs[0], string(data))
	// A multi-pack-index, a commit-graph and a bitmap claiming what they
	// like: git would trust them; the import never reads them.
	for _, p := range []string{"objects/pack/multi-pack-index", "objects/info/commit-graph", strings.TrimSuffix(packs[0], ".idx") + ".bitmap"} {
		if !filepath.IsAbs(p) {
			p = filepath.Join(l.store, p)
		}
		writeFile(t, p, "lies\n")
	}
	res, err := Import(context.Background(), l.options())
	if err != nil {
		t.Fatal(err)
	}
	if res.Packs != 1 {
		t.Errorf("packs indexed: %d", res.Packs)
	}
	if got := l.git(t, l.repo, "rev-parse", "refs/heads/feature"); got != feature {
		t.Errorf("feature: %s, want %s", got, feature)
	}
	if got := l.git(t, l.repo, "show", "refs/heads/feature:work.txt"); got != "agent work" {
		t.Errorf("work.txt: %q", got)
	}
	l.fsckClean(t)
}

// Symlinks anywhere the import looks are refused, never followed, and the
// repository is left as it was.
func TestRefusesSymlinks(t *testing.T) {
	for name, plant := range map[string]func(t *testing.T, l *lab){
		"objects/pack to another repository's packs": func(t *testing.T, l *lab) {
			other := filepath.Join(l.root, "other.git")
			l.git(t, "", "init", "-q", "--bare", other)
			l.git(t, other, "update-ref", "refs/heads/main", l.commitOn(t, other, "", "x", "secret\n"))
			l.git(t, other, "repack", "-a", "-d", "-q")
			os.RemoveAll(filepath.Join(l.store, "objects/pack"))
			symlink(t, filepath.Join(other, "objects/pack"), filepath.Join(l.store, "objects/pack"))
		},
		"a fanout directory": func(t *testing.T, l *lab) {
			symlink(t, filepath.Join(l.repo, "objects"), filepath.Join(l.store, "objects/zz"))
		},
		"a loose object": func(t *testing.T, l *lab) {
			objs, _ := filepath.Glob(filepath.Join(l.store, "objects/??/*"))
			os.Remove(objs[0])
			symlink(t, "/etc/passwd", objs[0])
		},
		"objects/info": func(t *testing.T, l *lab) {
			os.RemoveAll(filepath.Join(l.store, "objects/info"))
			symlink(t, filepath.Join(l.repo, "objects/info"), filepath.Join(l.store, "objects/info"))
		},
		"the granted branch": func(t *testing.T, l *lab) {
			os.Remove(filepath.Join(l.store, "refs/heads/feature"))
			symlink(t, filepath.Join(l.repo, "refs/heads/main"), filepath.Join(l.store, "refs/heads/feature"))
		},
		"refs/heads": func(t *testing.T, l *lab) {
			os.RemoveAll(filepath.Join(l.store, "refs/heads"))
			symlink(t, filepath.Join(l.repo, "refs/heads"), filepath.Join(l.store, "refs/heads"))
		},
		"packed-refs": func(t *testing.T, l *lab) {
			symlink(t, filepath.Join(l.repo, "packed-refs"), filepath.Join(l.store, "packed-refs"))
		},
		"the store itself": func(t *testing.T, l *lab) {
			moved := l.store + ".real"
			if err := os.Rename(l.store, moved); err != nil {
				t.Fatal(err)
			}
			symlink(t, moved, l.store)
		},
	} {
		t.Run(name, func(t *testing.T) {
			l := newLab(t)
			l.agentWork(t)
			plant(t, l)
			before := l.snapshot(t)
			_, err := Import(context.Background(), l.options())
			wantRefused(t, err, diag.GitImportStore)
			if after := l.snapshot(t); after != before {
				t.Errorf("the repository changed:\n%s\n---\n%s", before, after)
			}
		})
	}
}

// An object overwritten in place keeps its id for git (the control shows
// git reading the agent's content under main's id); the import hashes it
// and refuses.
func TestRefusesOverwrittenObject(t *testing.T) {
	l := newLab(t)
	feature := l.commitOn(t, l.store, l.feature, "work.txt", "agent work\n")
	l.git(t, l.store, "update-ref", "refs/heads/feature", feature)
	blob := l.gitIn(t, l.store, "", "rev-parse", feature+":work.txt")
	evil := zlibObject(t, "blob", "rm -rf / # reviewed\n")
	p := filepath.Join(l.store, "objects", blob[:2], blob[2:])
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, string(evil))
	// Control: git reads the overwritten object under its old id.
	if got := l.git(t, l.store, "cat-file", "blob", blob); !strings.Contains(got, "reviewed") {
		t.Fatalf("control: git read %q under %s; the plant did not take", got, blob)
	}
	before := l.snapshot(t)
	_, err := Import(context.Background(), l.options())
	wantRefused(t, err, diag.GitImportObject)
	if after := l.snapshot(t); after != before {
		t.Errorf("the repository changed")
	}
	l.fsckClean(t)
}

// An object of the repository shadowed in the store by other content under
// its id: the import refuses it (the repository keeps its own, since a
// fetch never sends an object the receiver has).
func TestRefusesShadowedSharedObject(t *testing.T) {
	l := newLab(t)
	readme := l.gitIn(t, l.repo, "", "rev-parse", l.main+":README")
	writeFile(t, filepath.Join(l.store, "objects", readme[:2], readme[2:]), string(zlibObject(t, "blob", "evil\n")))
	feature := l.commitOn(t, l.store, l.feature, "work.txt", "agent work\n")
	l.git(t, l.store, "update-ref", "refs/heads/feature", feature)
	before := l.snapshot(t)
	_, err := Import(context.Background(), l.options())
	wantRefused(t, err, diag.GitImportObject)
	if after := l.snapshot(t); after != before {
		t.Errorf("the repository changed")
	}
	if got := l.git(t, l.repo, "cat-file", "blob", readme); got != "proj" {
		t.Errorf("README in the repository: %q", got)
	}
}

func zlibObject(t *testing.T, typ, content string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	fmt.Fprintf(w, "%s %d\x00%s", typ, len(content), content)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Refs outside the grant (main, another agent's branch, refs/replace,
// notes, tags) are never written, and each is listed; a granted ref with
// a name the import does not accept is refused.
func TestRefsOutsideGrant(t *testing.T) {
	l := newLab(t)
	feature, _, _ := l.agentWork(t)
	evil := l.commitOn(t, l.store, l.main, "README", "evil\n")
	for _, ref := range []string{"refs/heads/sibling/work", "refs/replace/" + l.main, "refs/notes/commits", "refs/tags/v1", "refs/heads/main"} {
		l.git(t, l.store, "update-ref", ref, evil)
	}
	res, err := Import(context.Background(), l.options())
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, d := range res.Ignored {
		listed = append(listed, d.Path)
	}
	for _, ref := range []string{"refs/heads/sibling/work", "refs/replace/", "refs/notes/commits", "refs/tags/v1", "refs/heads/main"} {
		if !slices.ContainsFunc(listed, func(p string) bool { return strings.Contains(p, ref) }) {
			t.Errorf("%s not listed as ignored: %v", ref, listed)
		}
	}
	refs := l.git(t, l.repo, "for-each-ref", "--format=%(refname)")
	for _, ref := range []string{"refs/replace", "refs/notes", "refs/tags"} {
		if strings.Contains(refs, ref) {
			t.Errorf("%s reached the repository:\n%s", ref, refs)
		}
	}
	for ref, id := range map[string]string{"refs/heads/main": l.main, "refs/heads/sibling/work": l.main, "refs/heads/feature": feature} {
		if got := l.git(t, l.repo, "rev-parse", ref); got != id {
			t.Errorf("%s: %s, want %s", ref, got, id)
		}
	}

	// A granted name the import does not accept: refused, nothing moves.
	l2 := newLab(t)
	l2.agentWork(t)
	writeFile(t, filepath.Join(l2.store, "refs/heads", agent, "$(touch pwned)"), l2.main+"\n")
	before := l2.snapshot(t)
	_, err = Import(context.Background(), l2.options())
	wantRefused(t, err, diag.GitImportRef)
	if after := l2.snapshot(t); after != before {
		t.Errorf("the repository changed")
	}
}

// The branch moved on the host since launch: refused, nothing written; a
// granted ref naming an object nobody has: refused, nothing written.
func TestRefusesMovedAndMissing(t *testing.T) {
	l := newLab(t)
	l.agentWork(t)
	host := l.commitOn(t, l.repo, l.feature, "host.txt", "host\n")
	l.git(t, l.repo, "update-ref", "refs/heads/feature", host)
	before := l.snapshot(t)
	_, err := Import(context.Background(), l.options())
	wantRefused(t, err, diag.GitImportMoved)
	if after := l.snapshot(t); after != before {
		t.Errorf("the repository changed")
	}

	l = newLab(t)
	writeFile(t, filepath.Join(l.store, "refs/heads", agent, "ghost"), strings.Repeat("ab", 20)+"\n")
	before = l.snapshot(t)
	_, err = Import(context.Background(), l.options())
	wantRefused(t, err, diag.GitImportObject)
	if after := l.snapshot(t); after != before {
		t.Errorf("the repository changed")
	}
}

// Malformed requests are refused before anything is read.
func TestRefusesBadOptions(t *testing.T) {
	l := newLab(t)
	for name, edit := range map[string]func(*Options){
		"relative repo":        func(o *Options) { o.Repo = "repos/proj.git" },
		"store outside root":   func(o *Options) { o.StateRoot = filepath.Join(l.root, "elsewhere") },
		"store in repo":        func(o *Options) { o.StateRoot, o.Store = l.root, filepath.Join(l.repo, "store") },
		"agent with slash":     func(o *Options) { o.Agent = "a/b" },
		"branch not a branch":  func(o *Options) { o.Branch = "refs/tags/v1" },
		"short base":           func(o *Options) { o.Base = "abc" },
		"not a repository":     func(o *Options) { o.Repo = l.state },
		"branch with dot-dots": func(o *Options) { o.Branch = "refs/heads/a..b" },
	} {
		t.Run(name, func(t *testing.T) {
			o := l.options()
			edit(&o)
			_, err := Import(context.Background(), o)
			cs := codes(err)
			if !slices.Contains(cs, diag.GitImportRepo) && !slices.Contains(cs, diag.GitImportStore) {
				t.Errorf("want PP-GIT-IMPORT-REPO or -STORE, got %v", err)
			}
		})
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// Run by root for a daemon (the supervisor's gitImport op): every git runs
// as the daemon's uid, so the repository gains no file of root's, and git's
// ownership check holds as for the daemon itself. Control: the same
// import with root's own git would leave root's files in the daemon's
// repository.
func TestImportAsDaemon(t *testing.T) {
	skip.UnlessRoot(t, "runs git as another uid")
	l := newLab(t)
	feature, _, _ := l.agentWork(t)
	// The daemon reaches the lab through the test's temporary dirs, which
	// testing makes 0700 for root (only those: never the system's /tmp).
	tmp := filepath.Clean(os.TempDir())
	for d := l.root; strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("chown", "-R", "1000:1000", l.repo).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	rootOwned := func() []string {
		var out []string
		_ = filepath.Walk(l.repo, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Sys().(*syscall.Stat_t).Uid == 0 {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	o := l.options()
	o.Cred = &Cred{UID: 1000, GID: 1000}
	if branch, value, err := Head(context.Background(), l.repo, l.repo, "", o.Cred); err != nil || branch != "refs/heads/main" || value != l.main {
		t.Fatalf("Head as the daemon: %q %q %v", branch, value, err)
	}
	res, err := Import(context.Background(), o)
	if err != nil || res.Branch != feature {
		t.Fatalf("import as the daemon: %+v %v", res, err)
	}
	if got := l.git(t, l.repo, "rev-parse", "refs/heads/feature"); got != feature {
		t.Errorf("feature %s, want %s", got, feature)
	}
	if f := rootOwned(); len(f) != 0 {
		t.Errorf("files of root's in the daemon's repository: %v", f)
	}
	// Control: root's own git leaves root's files there.
	l.git(t, l.repo, "update-ref", "refs/heads/control", feature)
	if f := rootOwned(); len(f) == 0 {
		t.Error("control: root's git wrote no file of root's; the check above proves nothing")
	}
}
