package gitadopt

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
)

var layouts = []struct {
	name   string
	linked bool
}{{"main worktree", false}, {"linked worktree", true}}

// An agent's commit moves the branch but not the host index, so host git
// status shows the commit staged in reverse; adopting it leaves status
// clean, keeps unstaged changes unstaged, and a second run changes nothing.
func TestAdoptAfterAgentCommit(t *testing.T) {
	for _, lay := range layouts {
		t.Run(lay.name, func(t *testing.T) {
			l := newLab(t)
			r := l.build(lay.linked)
			l.write(filepath.Join(r.wt, "a"), "a from the agent\n")
			l.write(filepath.Join(r.wt, "c"), "new from the agent\n")
			commit := l.agentCommit(r, "agent's turn", func(git func(...string) string) { git("add", "a", "c") })
			l.write(filepath.Join(r.wt, "b"), "b, edited after the commit\n")

			before, _ := l.status(r.wt)
			if before == " M b\n" {
				t.Fatalf("the agent's commit did not leave the host index behind; the test shows nothing:\n%s", before)
			}
			res, err := l.adopt(r)
			if err != nil {
				t.Fatal(err)
			}
			want := Result{Commit: commit, Entries: 4, Gitlinks: 1, Changed: true}
			if diff := cmp.Diff(want, res); diff != "" {
				t.Errorf("Adopt (-want +got):\n%s", diff)
			}
			if st, markers := l.status(r.wt); st != " M b\n" || markers != nil {
				t.Errorf("status after adopt = %q (markers %v), want only the unstaged b", st, markers)
			}
			index := l.read(filepath.Join(r.gitDir, "index"))
			res, err = l.adopt(r)
			if err != nil || res.Changed || res.Commit != commit || res.Entries != 4 {
				t.Errorf("second Adopt = %+v, %v; want unchanged at %s", res, err, commit)
			}
			if !bytes.Equal(index, l.read(filepath.Join(r.gitDir, "index"))) {
				t.Error("a second Adopt rewrote the index")
			}
			l.write(filepath.Join(r.wt, "b"), "b\n")
			if st, _ := l.status(r.wt); st != "" {
				t.Errorf("status with b restored = %q, want clean", st)
			}
		})
	}
}

// A commit whose tree adds, drops or moves a gitlink is refused with every
// differing path named, and the index keeps its bytes.
func TestRefusesGitlinkChanges(t *testing.T) {
	cases := []struct {
		name  string
		stage func(r layout, git func(...string) string)
		paths []string
	}{
		{"adds", func(r layout, git func(...string) string) {
			git("update-index", "--add", "--cacheinfo", "160000,"+r.lib1+",vendor/x")
		}, []string{"vendor/x"}},
		{"drops", func(r layout, git func(...string) string) { git("update-index", "--force-remove", "sub") }, []string{"sub"}},
		{"moves", func(r layout, git func(...string) string) {
			git("update-index", "--cacheinfo", "160000,"+r.lib2+",sub")
		}, []string{"sub"}},
		{"turns into a file", func(r layout, git func(...string) string) {
			git("update-index", "--force-remove", "sub")
			git("update-index", "--add", "--cacheinfo", "100644,"+git("hash-object", "-w", "a")+",sub")
		}, []string{"sub"}},
		{"adds one and drops another", func(r layout, git func(...string) string) {
			git("update-index", "--force-remove", "sub")
			git("update-index", "--add", "--cacheinfo", "160000,"+r.lib1+",sub2")
		}, []string{"sub", "sub2"}},
	}
	for _, lay := range layouts {
		for _, c := range cases {
			t.Run(lay.name+"/"+c.name, func(t *testing.T) {
				l := newLab(t)
				r := l.build(lay.linked)
				l.agentCommit(r, c.name, func(git func(...string) string) { c.stage(r, git) })
				index := l.read(filepath.Join(r.gitDir, "index"))
				_, err := l.adopt(r)
				if diff := cmp.Diff([]diag.Code{diag.GitAdoptGitlinks}, codes(t, err)); diff != "" {
					t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
				}
				var dl diag.List
				errors.As(err, &dl)
				if len(dl) != len(c.paths) {
					t.Errorf("%d diagnostics, want one per differing path %v:\n%v", len(dl), c.paths, err)
				}
				for _, p := range c.paths {
					if !strings.Contains(err.Error(), strconv.Quote(p)) {
						t.Errorf("refusal does not name %q:\n%v", p, err)
					}
				}
				if !bytes.Equal(index, l.read(filepath.Join(r.gitDir, "index"))) {
					t.Error("a refused Adopt changed the index")
				}
			})
		}
	}
}

// The attack adoption exists to stop, against host git itself: the agent
// commits a gitlink and makes <path>/.git a repository whose config names
// a program. Read into the host index as it is (the control), the
// daemon's git status runs it; through Adopt the commit is refused, the
// index is untouched and status runs nothing.
func TestGitlinkPlant(t *testing.T) {
	l := newLab(t)
	r := l.build(true)
	nested := filepath.Join(r.wt, "vendor", "x", ".git")
	for _, d := range []string{"objects", "refs/heads"} {
		if err := os.MkdirAll(filepath.Join(nested, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l.write(filepath.Join(nested, "HEAD"), "ref: refs/heads/main\n")
	l.write(filepath.Join(nested, "config"), "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "+l.payload("fsmonitor")+"\n")
	commit := l.agentCommit(r, "vendor x", func(git func(...string) string) {
		git("update-index", "--add", "--cacheinfo", "160000,"+r.lib1+",vendor/x")
	})
	indexPath := filepath.Join(r.gitDir, "index")
	index := l.read(indexPath)

	l.git(r.wt, "read-tree", commit)
	if _, markers := l.status(r.wt); !slices.Contains(markers, "fsmonitor") {
		t.Fatalf("control: with the agent's gitlink in the host index, status ran %v; want the nested config's fsmonitor", markers)
	}
	l.write(indexPath, string(index))

	_, err := l.adopt(r)
	if diff := cmp.Diff([]diag.Code{diag.GitAdoptGitlinks}, codes(t, err)); diff != "" {
		t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
	}
	if !bytes.Equal(index, l.read(indexPath)) {
		t.Error("a refused Adopt changed the index")
	}
	if _, markers := l.status(r.wt); markers != nil {
		t.Errorf("after the refusal, status ran %v", markers)
	}
}

// An index with unmerged entries is a person's to resolve.
func TestRefusesUnmergedIndex(t *testing.T) {
	l := newLab(t)
	r := l.build(true)
	l.write(filepath.Join(r.wt, "c"), "c\n")
	l.agentCommit(r, "c", func(git func(...string) string) { git("add", "c") })
	ours, theirs := l.git(r.wt, "hash-object", "-w", "--stdin", "--path", "a"), l.git(r.wt, "rev-parse", "HEAD:a")
	cmd := exec.Command("git", "update-index", "--index-info")
	cmd.Dir, cmd.Env = r.wt, l.env()
	cmd.Stdin = strings.NewReader(fmt.Sprintf("0 %s\ta\n100644 %s 1\ta\n100644 %s 2\ta\n100644 %s 3\ta\n", strings.Repeat("0", 40), theirs, ours, theirs))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("update-index --index-info: %v\n%s", err, out)
	}
	index := l.read(filepath.Join(r.gitDir, "index"))
	_, err := l.adopt(r)
	if diff := cmp.Diff([]diag.Code{diag.GitAdoptUnmerged}, codes(t, err)); diff != "" {
		t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
	}
	if !bytes.Equal(index, l.read(filepath.Join(r.gitDir, "index"))) {
		t.Error("a refused Adopt changed the index")
	}
}

// HEAD's branch is a file the agent can write: whatever it makes it name
// other than a commit is refused, a tag of a commit included.
func TestRefusesHeadNotCommit(t *testing.T) {
	cases := []struct {
		name string
		ref  func(l *lab, r layout) string // the branch file's new content
	}{
		{"a tree", func(l *lab, r layout) string { return l.git(r.wt, "rev-parse", "HEAD^{tree}") }},
		{"a blob", func(l *lab, r layout) string { return l.git(r.wt, "rev-parse", "HEAD:a") }},
		{"an annotated tag of the commit", func(l *lab, r layout) string {
			l.git(r.wt, "tag", "-a", "-m", "t", "t1", "HEAD")
			return l.git(r.wt, "rev-parse", "t1")
		}},
		{"a missing object", func(*lab, layout) string { return strings.Repeat("ab", 20) }},
		{"an unborn branch", func(*lab, layout) string { return "ref: refs/heads/nowhere" }},
		{"garbage", func(*lab, layout) string { return "not an id" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t)
			r := l.build(true)
			l.write(l.headRef(r), c.ref(l, r)+"\n")
			index := l.read(filepath.Join(r.gitDir, "index"))
			_, err := l.adopt(r)
			if diff := cmp.Diff([]diag.Code{diag.GitAdoptHead}, codes(t, err)); diff != "" {
				t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
			}
			if !bytes.Equal(index, l.read(filepath.Join(r.gitDir, "index"))) {
				t.Error("a refused Adopt changed the index")
			}
		})
	}
}

// rawTree writes a tree object of the given entries as they are, unsorted
// or repeated if so given, as an agent can (git itself never writes one).
func (l *lab) rawTree(r layout, entries ...[3]string) string {
	l.t.Helper()
	var b bytes.Buffer
	for _, e := range entries {
		id, err := hex.DecodeString(e[2])
		if err != nil {
			l.t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s\x00", e[0], e[1])
		b.Write(id)
	}
	raw := filepath.Join(l.dir, "raw-tree")
	l.write(raw, b.String())
	return l.git(r.wt, "hash-object", "-t", "tree", "--literally", "-w", raw)
}

// A tree git would not write (a path twice, paths out of order) is
// refused before read-tree, whose result would be its own reading of it;
// one whose paths git's own checks refuse (.git) is refused by read-tree.
func TestRefusesMalformedTree(t *testing.T) {
	cases := []struct {
		name  string
		order []int // entries of the well-formed tree, by index
	}{
		{"a path twice", []int{0, 0, 1, 2}},
		{"out of order", []int{1, 0, 2}},
		{"a .git entry", []int{3, 0, 1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t)
			r := l.build(true)
			good := [][3]string{
				{"100644", "a", l.git(r.wt, "rev-parse", "HEAD:a")},
				{"100644", "b", l.git(r.wt, "rev-parse", "HEAD:b")},
				{"160000", "sub", r.lib1},
				{"100644", ".git", l.git(r.wt, "rev-parse", "HEAD:a")},
			}
			var entries [][3]string
			for _, i := range c.order {
				entries = append(entries, good[i])
			}
			tree := l.rawTree(r, entries...)
			commit := l.git(r.wt, "commit-tree", "-p", "HEAD", "-m", c.name, tree)
			l.write(l.headRef(r), commit+"\n")
			index := l.read(filepath.Join(r.gitDir, "index"))
			_, err := l.adopt(r)
			if diff := cmp.Diff([]diag.Code{diag.GitAdoptTree}, codes(t, err)); diff != "" {
				t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
			}
			if !bytes.Equal(index, l.read(filepath.Join(r.gitDir, "index"))) {
				t.Error("a refused Adopt changed the index")
			}
		})
	}
}

// A tree listing larger than the bound is refused (the agent writes trees,
// and shared subtrees list exponentially many paths).
func TestRefusesTreeOverBound(t *testing.T) {
	l := newLab(t)
	r := l.build(true)
	l.write(filepath.Join(r.wt, "c"), "c\n")
	l.agentCommit(r, "c", func(git func(...string) string) { git("add", "c") })
	_, err := l.adopt(r, func(o *Options) { o.MaxEntries = 3 }) // the index has 3 entries, the tree 4
	if diff := cmp.Diff([]diag.Code{diag.GitAdoptTree}, codes(t, err)); diff != "" {
		t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
	}
}

// refs/replace/ is the agent's to write. Adopt reads the objects as they
// are: a replacement tree with a gitlink neither refuses the commit nor
// reaches the index, so one made between the check and read-tree cannot
// swap the tree either.
func TestReplaceRefsIgnored(t *testing.T) {
	l := newLab(t)
	r := l.build(true)
	l.write(filepath.Join(r.wt, "c"), "c\n")
	commit := l.agentCommit(r, "c", func(git func(...string) string) { git("add", "c") })
	tree := l.git(r.wt, "rev-parse", commit+"^{tree}")
	swapped := l.rawTree(r,
		[3]string{"100644", "a", l.git(r.wt, "rev-parse", "HEAD:a")},
		[3]string{"160000", "evil", r.lib1},
		[3]string{"160000", "sub", r.lib1},
	)
	l.write(filepath.Join(r.common, "refs", "replace", tree), swapped+"\n")
	if got := l.git(r.wt, "ls-tree", "--name-only", commit); !strings.Contains(got, "evil") {
		t.Fatalf("control: with replace objects on, git reads the commit's tree as %q; want the replacement", got)
	}
	res, err := l.adopt(r)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 4 || res.Gitlinks != 1 {
		t.Errorf("Adopt = %+v; want the commit's own tree (4 entries, 1 gitlink)", res)
	}
	if got := l.git(r.wt, "ls-files", "-s"); strings.Contains(got, "evil") {
		t.Errorf("the replacement's gitlink reached the index:\n%s", got)
	}
}

// Nothing Adopt runs may run a program, whatever the configs name: plants
// of core.fsmonitor, hooks (post-index-change runs when the index is
// written), a clean filter on every path (read-tree -m or --reset would
// run it on a racily clean entry), and submodule recursion. The control
// runs the daemon's plain status over the same plants.
func TestNothingRuns(t *testing.T) {
	for _, lay := range layouts {
		t.Run(lay.name, func(t *testing.T) {
			l := newLab(t)
			r := l.build(lay.linked)
			l.write(filepath.Join(r.wt, "a"), "a from the agent\n")
			l.agentCommit(r, "a", func(git func(...string) string) { git("add", "a") })
			// Racily clean entries, for sure: stat data that matches the
			// files, in an index older than them. Git writing such an index
			// reads those files through their clean filter.
			l.git(r.wt, "update-index", "-q", "--refresh")
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(filepath.Join(r.gitDir, "index"), old, old); err != nil {
				t.Fatal(err)
			}
			hooks := filepath.Join(l.dir, "hooks")
			for _, h := range []string{"post-index-change", "post-checkout", "pre-commit", "reference-transaction"} {
				p := l.payload(h)
				if err := os.MkdirAll(hooks, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(p, filepath.Join(hooks, h)); err != nil {
					t.Fatal(err)
				}
			}
			l.git(r.wt, "config", "core.fsmonitor", l.payload("fsmonitor"))
			l.git(r.wt, "config", "core.hooksPath", hooks)
			l.git(r.wt, "config", "filter.plant.clean", l.payload("clean-filter"))
			l.git(r.wt, "config", "submodule.recurse", "true")
			l.write(filepath.Join(r.wt, ".gitattributes"), "* filter=plant\n")

			res, err := l.adopt(r)
			if err != nil || !res.Changed {
				t.Fatalf("Adopt = %+v, %v", res, err)
			}
			if m := l.takeMarkers(); m != nil {
				t.Errorf("Adopt ran %v", m)
			}
			if _, m := l.status(r.wt); !slices.Contains(m, "fsmonitor") {
				t.Errorf("control: the daemon's status ran %v; want the planted fsmonitor", m)
			}
		})
	}
}

// Adopt works only in the worktree it is given, as its top level, with
// the gitdir expected, and never where git would fetch missing objects.
func TestRepoRefusals(t *testing.T) {
	cases := []struct {
		name string
		mod  func(l *lab, r layout, o *Options)
	}{
		{"relative path", func(_ *lab, _ layout, o *Options) { o.Worktree = "wt" }},
		{"unclean path", func(_ *lab, r layout, o *Options) { o.Worktree = r.wt + "/." }},
		{"a subdirectory", func(_ *lab, r layout, o *Options) { o.Worktree = filepath.Join(r.wt, "sub") }},
		{"another gitdir", func(_ *lab, r layout, o *Options) { o.GitDir = r.common }},
		{"not a repository", func(l *lab, _ layout, o *Options) { o.Worktree = l.home }},
		{"a partial clone", func(l *lab, r layout, _ *Options) { l.git(r.wt, "config", "remote.origin.promisor", "true") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t)
			r := l.build(true)
			l.write(filepath.Join(r.wt, "c"), "c\n")
			l.agentCommit(r, "c", func(git func(...string) string) { git("add", "c") })
			index := l.read(filepath.Join(r.gitDir, "index"))
			_, err := l.adopt(r, func(o *Options) { c.mod(l, r, o) })
			if diff := cmp.Diff([]diag.Code{diag.GitAdoptRepo}, codes(t, err)); diff != "" {
				t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
			}
			if !bytes.Equal(index, l.read(filepath.Join(r.gitDir, "index"))) {
				t.Error("a refused Adopt changed the index")
			}
		})
	}
}

// The check after read-tree: when the index git wrote is not the tree
// that was checked (here read-tree is pointed at another commit, one with
// a gitlink, standing for a git that disagrees with its own listing), the
// old index goes back byte for byte and the adoption is refused.
func TestIndexCheckedAfterReadTree(t *testing.T) {
	l := newLab(t)
	r := l.build(true)
	l.write(filepath.Join(r.wt, "c"), "c\n")
	l.agentCommit(r, "c", func(git func(...string) string) { git("add", "c") })
	other := l.git(r.wt, "commit-tree", "-p", "HEAD", "-m", "other", l.rawTree(r,
		[3]string{"100644", "a", l.git(r.wt, "rev-parse", "HEAD:a")},
		[3]string{"160000", "evil", r.lib1},
		[3]string{"160000", "sub", r.lib1},
	))
	indexPath := filepath.Join(r.gitDir, "index")
	index := l.read(indexPath)
	_, err := l.adopt(r, func(o *Options) { o.readTreeOf = other })
	if diff := cmp.Diff([]diag.Code{diag.GitAdoptTree}, codes(t, err)); diff != "" {
		t.Fatalf("codes (-want +got):\n%s\n%v", diff, err)
	}
	if !bytes.Equal(index, l.read(indexPath)) {
		t.Error("the old index was not put back")
	}
	if _, err := os.Stat(indexPath + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("index.lock left behind: %v", err)
	}
}

// An index that did not exist before goes back to not existing.
func TestRestoreAbsentIndex(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "index")
	if err := os.WriteFile(path, []byte("written by read-tree"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := restoreIndex(path, nil, false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + ".lock"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want gone", p, err)
		}
	}
	// A lock held by another git is never taken over.
	if err := os.WriteFile(path+".lock", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := restoreIndex(path, []byte("old"), true); !errors.Is(err, os.ErrExist) {
		t.Errorf("restore under another's lock: %v, want ErrExist", err)
	}
}

// An index.lock another git holds is never taken over: Adopt fails (not a
// refusal: it is not the commit's doing) and the index keeps its bytes.
func TestIndexLockHeld(t *testing.T) {
	l := newLab(t)
	r := l.build(true)
	l.write(filepath.Join(r.wt, "c"), "c\n")
	l.agentCommit(r, "c", func(git func(...string) string) { git("add", "c") })
	indexPath := filepath.Join(r.gitDir, "index")
	index := l.read(indexPath)
	l.write(indexPath+".lock", "")
	_, err := l.adopt(r)
	var dl diag.List
	if err == nil || errors.As(err, &dl) {
		t.Fatalf("Adopt with index.lock held = %v, want a plain error", err)
	}
	if !bytes.Equal(index, l.read(indexPath)) {
		t.Error("the index changed")
	}
	if _, err := os.Stat(indexPath + ".lock"); err != nil {
		t.Errorf("the other git's lock: %v", err)
	}
}
