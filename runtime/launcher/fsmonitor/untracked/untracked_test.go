package untracked

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor/vouch"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
)

// git runs host git (the image's version, 2.39) with no system or global
// config and env added.
func git(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.test"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1"}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func write(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

type repo struct {
	ws, gitDir string
	hook       string // core.fsmonitor: the watcher's answers
	w          *fsmonitor.Watcher
	tok        string
	tokenTime  time.Time // read before tok was taken
	vouched    []byte
	written    time.Time // the mtime of the index hostBuilt's git wrote
	built      []byte    // hostBuild's git's index
	spliced    *Spliced  // hostBuild's
}

// newRepo is a committed worktree with every kind of untracked and
// ignored name, watched, its token taken and its index vouched for.
func newRepo(t testing.TB) *repo {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, ws, nil, "init", "-q")
	for f, s := range map[string]string{
		"a/f1": "1\n", "a/b/g1": "1\n", "c/h1": "1\n", "top.txt": "top\n",
		".gitignore":   "*.log\n!keep.log\nbuild/\n**/tmp\n",
		"c/.gitignore": "x\n!y\n",
	} {
		write(t, filepath.Join(ws, f), s)
	}
	git(t, ws, nil, "add", "-A")
	git(t, ws, nil, "commit", "-qm", "one")
	for _, f := range []string{"a/u1", "a/nu/deeper/z", "a/x.log", "a/keep.log", "build/o", "c/x", "c/y", "c/d/y", "excl/e", "deep/tmp/t", "deep/kept"} {
		write(t, filepath.Join(ws, f), "u\n")
	}
	for _, d := range []string{"empty/e2", "a/emptyish"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(ws, ".git/info/exclude"), "excl/\n")
	return watched(t, ws)
}

// watched is ws watched and served on loopback (hook asks there), its
// token taken and its index vouched for.
func watched(t testing.TB, ws string) *repo {
	t.Helper()
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
	r := &repo{ws: ws, gitDir: filepath.Join(ws, ".git"), hook: hook, w: w, tokenTime: time.Now()}
	r.tok = w.Token()
	res, err := vouch.Vouch(r.gitDir, ws, r.tok)
	if err != nil {
		t.Fatal(err)
	}
	r.vouched = res.Index
	return r
}

func (r *repo) exclude(t testing.TB) []byte {
	b, err := os.ReadFile(filepath.Join(r.gitDir, "info/exclude"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hostBuilt is the index Build's git writes, with host git in place of
// the jail: the same scratch directory, command line and environment.
func (r *repo) hostBuilt(t testing.TB) []byte {
	t.Helper()
	dir, err := Prepare(t.TempDir(), os.Getuid(), os.Getgid(), r.exclude(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index"), r.vouched, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", Args()...)
	cmd.Dir = r.ws
	cmd.Env = append(Env(dir, r.ws, nil), "PATH="+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git: %v\n%s", err, out)
	}
	built, written, err := ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	r.written = written
	return built
}

// hostBuild is hostBuilt's cache and refreshed entries spliced into the
// vouched index, as Finish splices them.
func (r *repo) hostBuild(t testing.TB) []byte {
	t.Helper()
	built := r.hostBuilt(t)
	r.built = built
	sp, err := Splice(r.vouched, built, r.ws, Racy(r.tokenTime, r.written))
	if err != nil {
		t.Fatal(err)
	}
	if sp.RefreshReason != "" {
		t.Fatalf("no refreshed entry was looked at: %s", sp.RefreshReason)
	}
	r.spliced = sp
	return sp.Index
}

// install copies the Git dir with index as its index.
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

// status is `git status --porcelain` (and args) on gitDir as the
// sandbox's git runs it (the profile's settings), with hook as
// core.fsmonitor ("" none), and the read_directory counts trace2 gave.
func (r *repo) status(t *testing.T, gitDir, hook string, args ...string) (string, map[string]int) {
	t.Helper()
	return r.statusWith(t, gitDir, hook, sandboxCheck, args...)
}

// sandboxCheck is the stat check the sandbox's git runs with (the
// pi-session profile's); gitCheck is Git's default, which also compares
// ctime, inode and owner.
var (
	sandboxCheck = []string{"-c", "core.checkStat=minimal", "-c", "core.trustctime=false"}
	gitCheck     = []string{"-c", "core.checkStat=default", "-c", "core.trustctime=true"}
)

// statusWith is status with the stat check's settings check. Its counts
// are read_directory's by key, and the index's refresh counts as
// "index/refresh/sum_lstat" (entries lstat'ed) and "index/refresh/sum_scan"
// (entries whose stat data differed: opened and hashed).
func (r *repo) statusWith(t *testing.T, gitDir, hook string, check []string, args ...string) (string, map[string]int) {
	t.Helper()
	trace := filepath.Join(t.TempDir(), "trace")
	pre := append([]string{"--git-dir=" + gitDir, "--work-tree=" + r.ws, "-c", "core.untrackedCache=true"}, check...)
	if hook != "" {
		pre = append(pre, "-c", "core.fsmonitor="+hook)
	}
	out := git(t, r.ws, []string{"GIT_TRACE2_EVENT=" + trace, "GIT_TRACE2_EVENT_NESTING=10"}, append(append(pre, "status", "--porcelain"), args...)...)
	counts := map[string]int{}
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct {
			Event, Category, Key string
			Value                json.RawMessage
		}
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "data" && (ev.Category == "read_directory" || ev.Category == "index") {
			if ev.Category == "index" {
				ev.Key = "index/" + ev.Key
			}
			var n int
			if json.Unmarshal(ev.Value, &n) == nil {
				counts[ev.Key] += n
			} else {
				var s string
				if json.Unmarshal(ev.Value, &s) == nil {
					n, _ := json.Number(s).Int64()
					counts[ev.Key] += int(n)
				}
			}
		}
	}
	return out, counts
}

// full is a full scan: no monitor, no untracked cache.
func (r *repo) full(t *testing.T, args ...string) string {
	t.Helper()
	pre := []string{"--git-dir=" + r.install(t, nil), "--work-tree=" + r.ws, "-c", "core.untrackedCache=false", "-c", "core.fsmonitor=false"}
	return git(t, r.ws, nil, append(append(pre, "status", "--porcelain"), args...)...)
}

// silentHook answers every query "nothing changed" (the control: a cache
// the monitor's answers do not invalidate).
func silentHook(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "silent")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nprintf 'pp1:silent:0\\0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The spliced cache is used (no directory opened) and right before any
// change, and after changes made past the token (a new untracked file in
// a cached directory, a new directory, an untracked file gone, a new
// .gitignore line) the first status is still a full scan's, since the
// monitor's answers invalidate their directories. Controls: the vouched
// index alone opens every directory; the same cache with a monitor that
// answers nothing misses the changes.
func TestSplicedCacheIsUsedAndRight(t *testing.T) {
	r := newRepo(t)
	spliced := r.hostBuild(t)
	if _, err := gitindex.Read(spliced); err != nil {
		t.Fatal(err)
	}

	full := r.full(t)
	for _, w := range []string{"?? a/keep.log", "?? a/nu/", "?? a/u1", "?? c/d/", "?? c/y", "?? deep/"} {
		if !strings.Contains(full, w+"\n") {
			t.Fatalf("the full scan lacks %q (the fixture):\n%s", w, full)
		}
	}
	got, n := r.status(t, r.install(t, spliced), r.hook)
	if got != full {
		t.Errorf("first status from the spliced index:\n%s\nfull scan:\n%s", got, full)
	}
	if n["opendir"] != 0 || n["directory-invalidation"] != 0 || n["gitignore-invalidation"] != 0 {
		t.Errorf("the spliced cache was not used: read_directory %v", n)
	}
	// Control: without the cache, every directory is opened.
	_, n0 := r.status(t, r.install(t, r.vouched), r.hook)
	if n0["opendir"] < 10 {
		t.Errorf("the vouched index alone opened %d directories: the trace counts nothing", n0["opendir"])
	}
	for _, uall := range []bool{false, true} {
		var args []string
		if uall {
			args = []string{"-uall"}
		}
		if got, _ := r.status(t, r.install(t, spliced), r.hook, args...); got != r.full(t, args...) {
			t.Errorf("status %v from the spliced index differs from a full scan:\n%s", args, got)
		}
	}

	// After the token: the watcher's to report.
	write(t, filepath.Join(r.ws, "a/b/new1"), "n\n")
	write(t, filepath.Join(r.ws, "newdir/sub/f"), "n\n")
	os.Remove(filepath.Join(r.ws, "a/u1"))
	os.Remove(filepath.Join(r.ws, "c/d/y"))
	full = r.full(t)
	for _, w := range []string{"?? a/b/new1", "?? newdir/", "?? a/nu/"} {
		if !strings.Contains(full, w+"\n") {
			t.Fatalf("the full scan lacks %q:\n%s", w, full)
		}
	}
	for _, w := range []string{"a/u1", "c/d/"} {
		if strings.Contains(full, w) {
			t.Fatalf("the full scan still shows %q:\n%s", w, full)
		}
	}
	got, n = r.status(t, r.install(t, spliced), r.hook)
	if got != full {
		t.Errorf("status after the changes from the spliced index:\n%s\nfull scan:\n%s", got, full)
	}
	if n["opendir"] == 0 || n["opendir"] >= n0["opendir"] {
		t.Errorf("after the changes the cache opened %d directories (%d without it): want some, not all", n["opendir"], n0["opendir"])
	}
	// Control: the same cache with a monitor that reports nothing.
	stale, _ := r.status(t, r.install(t, spliced), silentHook(t))
	if stale == full || !strings.Contains(stale, "?? a/u1") || strings.Contains(stale, "a/b/new1") {
		t.Errorf("a cache nothing invalidates still gave the full scan's answer: the test cannot fail\n%s", stale)
	}

	// A new .gitignore line (the file is tracked: the monitor names it,
	// and Git hashes every .gitignore the cache recorded anyway).
	f, err := os.OpenFile(filepath.Join(r.ws, ".gitignore"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("a/nu/\n")
	f.Close()
	full = r.full(t)
	if strings.Contains(full, "a/nu/") {
		t.Fatalf("the full scan still shows a/nu/:\n%s", full)
	}
	if got, _ := r.status(t, r.install(t, spliced), r.hook); got != full {
		t.Errorf("status after the new .gitignore line from the spliced index:\n%s\nfull scan:\n%s", got, full)
	}
}

// Splice takes only the cache, and only one the sandbox's git will use.
func TestSpliceRefuses(t *testing.T) {
	r := newRepo(t)
	built := r.hostBuilt(t)
	racy := Racy(r.tokenTime, r.written)
	if _, err := Splice(r.vouched, built, r.ws, racy); err != nil {
		t.Fatalf("the control splice: %v", err)
	}
	if _, err := Splice(r.vouched, built, "/elsewhere", racy); err == nil || !strings.Contains(err.Error(), "ident") {
		t.Errorf("a cache for another worktree: %v", err)
	}
	if _, err := Splice(r.vouched, r.vouched, r.ws, racy); !errors.Is(err, ErrNoCache) {
		t.Errorf("an index without a cache: %v", err)
	}
	if _, err := Splice(built, built, r.ws, racy); err == nil {
		t.Error("an index that already has a cache and no FSMN was spliced")
	}
	bad := bytes.Clone(built)
	bad[len(bad)-1] ^= 1
	if _, err := Splice(r.vouched, bad, r.ws, racy); err == nil {
		t.Error("an index with a bad checksum was spliced")
	}
	other := git(t, r.ws, nil, "ls-files")
	_ = other
	// Another index's entries (one entry more).
	write(t, filepath.Join(r.ws, "extra"), "x\n")
	idx2 := filepath.Join(t.TempDir(), "index")
	os.WriteFile(idx2, built, 0o644)
	git(t, r.ws, []string{"GIT_INDEX_FILE=" + idx2}, "add", "extra")
	b2, _ := os.ReadFile(idx2)
	if _, err := Splice(r.vouched, b2, r.ws, racy); !errors.Is(err, ErrMismatch) {
		t.Errorf("another index's cache: %v", err)
	}
	for i := 0; i < len(built); i += 97 {
		Splice(r.vouched, built[:i], r.ws, racy) // no panic on a cut
	}
}

// headerSeed is a cache header for /ws that checkHeader accepts.
var headerSeed = []byte("\x1bLocation /ws, system Linux\x00" + strings.Repeat("\x00", 72) + "\x00\x00\x00\x06" + strings.Repeat("\x00", 40) + ".gitignore\x00")

func TestCheckHeader(t *testing.T) {
	if err := checkHeader(headerSeed, "/ws", 20); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"flags -uall":  bytes.Replace(headerSeed, []byte("\x00\x00\x00\x06"), []byte("\x00\x00\x00\x00"), 1),
		"another file": bytes.Replace(headerSeed, []byte(".gitignore"), []byte(".gitexclud"), 1),
		"cut":          headerSeed[:40],
		"long ident":   append([]byte{0x7f}, headerSeed[1:]...),
	} {
		if err := checkHeader(b, "/ws", 20); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Splice and the cache header's check on arbitrary bytes: an error, never
// a panic or a read past the end. The bytes are also spliced as git's
// index (a SHA-1 checksum appended, so they reach the parser and the
// refreshed entries' checks) into a real vouched index, seeded with the
// index git wrote for it: what is spliced is an index whose entries are
// the vouched ones.
func FuzzSplice(f *testing.F) {
	r := newTouchedRepo(f)
	r.hostBuild(f)
	racy := Racy(r.tokenTime, r.written)
	f.Add([]byte("DIRC"), "/ws")
	f.Add(headerSeed, "/ws")
	f.Add(r.built[:len(r.built)-20], r.ws)
	vx, err := gitindex.Read(r.vouched)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, built []byte, ws string) {
		Splice(built, built, ws, racy)
		checkHeader(built, ws, 20)
		sum := sha1.Sum(built)
		sp, err := Splice(r.vouched, append(built[:len(built):len(built)], sum[:]...), r.ws, racy)
		if err != nil {
			return
		}
		ox, err := gitindex.Read(sp.Index)
		if err != nil {
			t.Fatalf("the spliced index does not parse: %v", err)
		}
		if len(ox.Entries) != len(vx.Entries) || sp.Refreshed+sp.Skipped > len(vx.Entries) {
			t.Fatalf("%d entries, %d refreshed", len(ox.Entries), sp.Refreshed)
		}
		for i, e := range ox.Entries {
			v := vx.Entries[i]
			if e.Name != v.Name || e.Mode != v.Mode || e.OID != v.OID || e.Stage != v.Stage {
				t.Fatalf("entry %d is not the vouched one", i)
			}
		}
	})
}

// Build with the image's git in the search jail (the agent's uid, the
// workspace read-only at the path the sandbox's git sees it): the same
// cache as host git's, used and right.
func TestBuildInTheJail(t *testing.T) {
	skip.UnlessRoot(t, "it builds the search jail (user, mount, pid namespaces as the agent's uid)")
	if err := nativesearch.Probe(); err != nil {
		t.Fatal(err)
	}
	usr := filepath.Join(testbundle.Repo(t, ".image"), "rootfs", "usr")
	r := newRepo(t)
	j := nativesearch.Jail{Workspace: r.ws, Dest: r.ws, Usr: usr, UID: 1000, GID: 1000, Limits: nativesearch.DefaultLimits}
	start := time.Now()
	sp, err := Build(context.Background(), Options{Jail: j, Parent: t.TempDir(), Exclude: r.exclude(t),
		GitConfig: []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.checkStat", "GIT_CONFIG_VALUE_0=minimal", "PATH=/x"}}, r.vouched, r.tokenTime)
	if err != nil {
		t.Fatal(err)
	}
	spliced := sp.Index
	t.Logf("built in %v (indicative: a loaded machine)", time.Since(start))
	full := r.full(t)
	got, n := r.status(t, r.install(t, spliced), r.hook)
	if got != full || n["opendir"] != 0 {
		t.Errorf("status from the jail's cache (read_directory %v):\n%s\nfull scan:\n%s", n, got, full)
	}
	write(t, filepath.Join(r.ws, "a/b/new1"), "n\n")
	if got, full := r.status2(t, spliced), r.full(t); got != full || !strings.Contains(got, "?? a/b/new1\n") {
		t.Errorf("after a change, status from the jail's cache:\n%s\nfull scan:\n%s", got, full)
	}
	// A build ended unused leaves no jail and no scratch directory; Close
	// after Finish, or twice, does nothing.
	parent := t.TempDir()
	p, err := Start(Options{Jail: j, Parent: parent, Exclude: r.exclude(t)})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
	if _, err := p.Finish(context.Background(), r.vouched, r.tokenTime); err == nil {
		t.Error("a closed build ran")
	}
	if p, err = Start(Options{Jail: j, Parent: parent, Exclude: r.exclude(t)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Finish(context.Background(), r.vouched, r.tokenTime); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if left, _ := os.ReadDir(parent); len(left) != 0 {
		t.Errorf("scratch directories left: %v", left)
	}
	// Control: a git that fails (an index it cannot read) leaves no cache.
	if _, err := Build(context.Background(), Options{Jail: j, Parent: t.TempDir()}, []byte("DIRC not an index"), r.tokenTime); err == nil {
		t.Error("a cache was built from a broken index")
	}
}

func (r *repo) status2(t *testing.T, index []byte) string {
	got, _ := r.status(t, r.install(t, index), r.hook)
	return got
}
