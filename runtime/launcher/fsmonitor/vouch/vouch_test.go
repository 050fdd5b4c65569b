package vouch

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
)

// git runs host git with no system or global config.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.test"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// repo is a committed worktree with a file for every way a change can
// hide from a stat, and the names of those that change before the vouch.
type repo struct {
	ws, gitDir string
	hook       string // a core.fsmonitor hook asking the watcher
	w          *fsmonitor.Watcher
}

var (
	keep      = []string{"keep/a.go", "keep/b.go", "keep/deep/c.go", "top.txt", "later/edited.go", "later/gone.go", "run.sh"}
	changedBy = map[string]string{
		"same/size.go":  "content changed, same size, mtime restored to the nanosecond (only ctime moved)",
		"grow.go":       "size changed",
		"mode.sh":       "exec bit set",
		"link.go":       "replaced by a symlink",
		"pdir/inner.go": "parent directory replaced by a symlink",
		"deleted.go":    "deleted",
		"racy.go":       "recorded in the index's own second (racily clean)",
		"skip.go":       "skip-worktree, and changed",
	}
)

func newRepo(t *testing.T) *repo {
	t.Helper()
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	for _, f := range keep {
		write(t, filepath.Join(ws, f), "package x // "+f+"\n")
	}
	os.Chmod(filepath.Join(ws, "run.sh"), 0o755)
	for f := range changedBy {
		write(t, filepath.Join(ws, f), "package x // "+f+"\n")
	}
	git(t, ws, "add", "-A")
	id := strings.TrimSpace(git(t, ws, "hash-object", "-w", "top.txt"))
	git(t, ws, "update-index", "--add", "--cacheinfo", "160000,"+id+",sub") // a gitlink
	os.Mkdir(filepath.Join(ws, "sub"), 0o755)
	git(t, ws, "commit", "-qm", "one")
	git(t, ws, "update-index", "--skip-worktree", "skip.go")
	// racy.go: written and added in a second of its own, after every
	// other entry's, and the index's mtime set to it, as when host git
	// writes the index in the second it recorded the file: racily clean.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	write(t, filepath.Join(ws, "racy.go"), "package x // racy.go, again\n")
	git(t, ws, "add", "racy.go")
	rst, err := os.Stat(filepath.Join(ws, "racy.go"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(ws, ".git", "index"), rst.ModTime(), rst.ModTime()); err != nil {
		t.Fatal(err)
	}

	// The changes before the watch and the vouch.
	p := func(f string) string { return filepath.Join(ws, f) }
	fi, _ := os.Stat(p("same/size.go"))
	write(t, p("same/size.go"), strings.ToUpper("package x // same/size.go\n"))
	if err := os.Chtimes(p("same/size.go"), fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	write(t, p("grow.go"), "package x // grew\n\n")
	os.Chmod(p("mode.sh"), 0o755)
	os.Remove(p("link.go"))
	os.Symlink("top.txt", p("link.go"))
	os.Rename(p("pdir"), p("pdir.real"))
	os.Symlink("pdir.real", p("pdir"))
	os.Remove(p("deleted.go"))
	write(t, p("skip.go"), "changed while skipped\n")
	write(t, p("untracked/new.go"), "new\n")

	w, err := fsmonitor.Watch(ws, fsmonitor.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := fsmonitor.Serve(w, ln, netip.MustParseAddr("127.0.0.1"))
	t.Cleanup(func() { srv.Close() })
	hook := filepath.Join(t.TempDir(), "hook")
	if err := os.WriteFile(hook, []byte(fsmonitor.HookFor(netip.MustParseAddrPort(ln.Addr().String()), ws)), 0o755); err != nil {
		t.Fatal(err)
	}
	return &repo{ws: ws, gitDir: filepath.Join(ws, ".git"), hook: hook, w: w}
}

// install copies the Git dir (outside the worktree) with index as its
// index, as the start script copies the seed into the sandbox's tmpfs.
func (r *repo) install(t *testing.T, index []byte) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "gitdir")
	if out, err := exec.Command("cp", "-a", r.gitDir, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if index != nil {
		if err := os.WriteFile(filepath.Join(dst, "index"), index, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// run is git on the worktree with gitDir, with the hook when monitored.
func (r *repo) run(t *testing.T, gitDir string, monitored bool, args ...string) string {
	t.Helper()
	pre := []string{"--git-dir=" + gitDir, "--work-tree=" + r.ws}
	if monitored {
		pre = append(pre, "-c", "core.fsmonitor="+r.hook)
	}
	return git(t, r.ws, append(pre, args...)...)
}

// fsmonitorValid is ls-files -f's answer: the entries git holds as
// fsmonitor-valid (a lowercase tag).
func (r *repo) fsmonitorValid(t *testing.T, gitDir string) []string {
	var valid []string
	for _, l := range strings.Split(strings.TrimSpace(r.run(t, gitDir, true, "ls-files", "-f")), "\n") {
		if tag, name, ok := strings.Cut(l, " "); ok && tag == strings.ToLower(tag) {
			valid = append(valid, name)
		}
	}
	slices.Sort(valid)
	return valid
}

// Every way an entry can change before the vouch leaves it unvouched, and
// every change after the token is reported by the watcher: the first
// status from the vouched index is a full scan's, and git holds as
// fsmonitor-valid exactly the untouched entries.
func TestVouchedIndexStatusIsAFullScans(t *testing.T) {
	r := newRepo(t)
	tok := r.w.Token()
	res, err := Vouch(r.gitDir, r.ws, tok)
	if err != nil {
		t.Fatal(err)
	}
	if res.Vouched != len(keep) || res.NotVouched != len(changedBy)+1 {
		t.Fatalf("vouched %d, not %d; want %d and %d (every changed entry and the gitlink)", res.Vouched, res.NotVouched, len(keep), len(changedBy)+1)
	}
	// After the token, before git: the watcher's to report.
	write(t, filepath.Join(r.ws, "later/edited.go"), "package X // later/edited.go\n") // same size
	os.Remove(filepath.Join(r.ws, "later/gone.go"))
	write(t, filepath.Join(r.ws, "later/new.go"), "new\n")

	vouched := r.install(t, res.Index)
	if got, want := r.fsmonitorValid(t, vouched), []string{"keep/a.go", "keep/b.go", "keep/deep/c.go", "run.sh", "top.txt"}; !slices.Equal(got, want) {
		t.Fatalf("fsmonitor-valid %q, want %q", got, want)
	}
	full := r.run(t, r.install(t, nil), false, "status", "--porcelain")
	got := r.run(t, vouched, true, "status", "--porcelain")
	if got != full {
		t.Fatalf("status from the vouched index:\n%s\nfull scan:\n%s", got, full)
	}
	for _, f := range []string{"same/size.go", "grow.go", "mode.sh", "link.go", "pdir/inner.go", "deleted.go", "later/edited.go", "later/gone.go"} {
		if !strings.Contains(full, f) {
			t.Errorf("the full scan does not show %s: the test changes nothing git sees\n%s", f, full)
		}
	}
	// The status took the vouched index's word: git wrote it back with
	// its extension, the entries still fsmonitor-valid.
	if !slices.Contains(r.fsmonitorValid(t, vouched), "keep/deep/c.go") {
		t.Fatal("the vouched entries did not stay valid")
	}
}

// Control: an index that marks a changed entry valid (what a vouch that
// trusted size and mtime alone would write) makes git miss the change, so
// the test above can fail.
func TestMisvouchedEntryIsMissed(t *testing.T) {
	r := newRepo(t)
	tok := r.w.Token()
	data, mtime, err := readIndex(r.gitDir)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := gitindex.Read(data)
	if err != nil {
		t.Fatal(err)
	}
	dirty := sweep(ix, openDir(t, r.ws), mtime)
	i := slices.IndexFunc(ix.Entries, func(e gitindex.Entry) bool { return e.Name == "same/size.go" })
	if !dirty[i] {
		t.Fatal("the sweep vouched for a changed entry")
	}
	dirty[i] = false
	bad := r.install(t, build(data, ix, tok, dirty))
	full := r.run(t, r.install(t, nil), false, "status", "--porcelain")
	got := r.run(t, bad, true, "status", "--porcelain")
	if !strings.Contains(full, "same/size.go") || strings.Contains(got, "same/size.go") {
		t.Fatalf("control: the full scan\n%s\nthe misvouched index\n%s\nwant the change missed only by the second", full, got)
	}
}

// The vouched index is the seed's bytes up to its extensions, the same
// for the same inputs and token, and read by the reader whole.
func TestVouchIsDeterministic(t *testing.T) {
	r := newRepo(t)
	tok := r.w.Token()
	a, err := Vouch(r.gitDir, r.ws, tok)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Vouch(r.gitDir, r.ws, tok)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := os.ReadFile(filepath.Join(r.gitDir, "index"))
	ix, err := gitindex.Read(a.Index)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Index, b.Index) || !bytes.Equal(a.Index[:ix.EntriesEnd], seed[:ix.EntriesEnd]) {
		t.Fatal("two vouches differ, or the entries are not the seed's")
	}
	if x := ix.Extensions[len(ix.Extensions)-1]; x.Sig != "FSMN" || !bytes.Contains(a.Index[x.Off:], []byte(tok+"\x00")) {
		t.Fatalf("last extension %q, want FSMN with the token", x.Sig)
	}
}

// What cannot be vouched for is an error, never a partial index: no
// index, a split index, a link in the index's place, a foreign token, a
// workspace that is not the worktree's top.
func TestVouchRefusals(t *testing.T) {
	r := newRepo(t)
	tok := r.w.Token()
	if _, err := Vouch(r.gitDir, r.ws, "bad token"); !errors.Is(err, ErrToken) {
		t.Fatalf("a token with a space: %v", err)
	}
	empty := t.TempDir()
	if _, err := Vouch(empty, r.ws, tok); !errors.Is(err, ErrNoIndex) {
		t.Fatalf("no index: %v", err)
	}
	linked := t.TempDir()
	os.Symlink(filepath.Join(r.gitDir, "index"), filepath.Join(linked, "index"))
	if _, err := Vouch(linked, r.ws, tok); err == nil {
		t.Fatal("an index that is a symlink was read")
	}
	if _, err := Vouch(r.gitDir, filepath.Join(r.ws, "keep"), tok); !errors.Is(err, ErrNotTop) {
		t.Fatalf("a subdirectory of the worktree: %v", err)
	}
	split := r.install(t, nil)
	git(t, r.ws, "--git-dir="+split, "--work-tree="+r.ws, "update-index", "--split-index")
	if _, err := Vouch(split, r.ws, tok); !errors.Is(err, gitindex.ErrSplit) {
		t.Fatalf("split index: %v", err)
	}
}

func openDir(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// The bitmap past one 64-bit word: git reads the bits of entries 70, 128
// and 199 of 200 as the ones not vouched for, and no other.
func TestBitmapPastOneWord(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	var names []string
	for i := range 200 {
		n := filepath.Join("d", strings.Repeat("f", 1+i/26)+string(rune('a'+i%26)))
		names = append(names, n)
		write(t, filepath.Join(ws, n), n)
	}
	git(t, ws, "add", "-A")
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	// The index written again a second after the files: none racy.
	git(t, ws, "update-index", "--really-refresh")
	order := strings.Fields(git(t, ws, "ls-files"))
	changed := []string{order[70], order[128], order[199]}
	for _, n := range changed {
		write(t, filepath.Join(ws, n), "changed, longer than before")
	}
	w, err := fsmonitor.Watch(ws, fsmonitor.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	res, err := Vouch(filepath.Join(ws, ".git"), ws, w.Token())
	if err != nil {
		t.Fatal(err)
	}
	if res.Vouched != 197 || res.NotVouched != 3 {
		t.Fatalf("vouched %d, not %d", res.Vouched, res.NotVouched)
	}
	r := &repo{ws: ws, gitDir: filepath.Join(ws, ".git"), w: w}
	// No hook needed to read the bits: with core.fsmonitor set to a hook
	// that answers nothing changed since the token, ls-files keeps them.
	r.hook = filepath.Join(t.TempDir(), "hook")
	os.WriteFile(r.hook, []byte("#!/bin/sh\nprintf '%s\\0' \"$2\"\n"), 0o755)
	var invalid []string
	for _, l := range strings.Split(strings.TrimSpace(r.run(t, r.install(t, res.Index), true, "ls-files", "-f")), "\n") {
		if tag, name, _ := strings.Cut(l, " "); tag != strings.ToLower(tag) {
			invalid = append(invalid, name)
		}
	}
	if !slices.Equal(invalid, changed) {
		t.Fatalf("git reads %q as not vouched for, want %q", invalid, changed)
	}
}
