package fsmonitor

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mustWrite(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func watch(t *testing.T, root string, lim Limits) *Watcher {
	t.Helper()
	w, err := Watch(root, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// first is the token of a watcher's first answer (to a token it did not
// issue: everything).
func first(t *testing.T, w *Watcher) string {
	t.Helper()
	tok, names := w.Since("1796299530652204200")
	if !slices.Equal(names, []string{Everything}) {
		t.Fatalf("a foreign token: %q, want everything", names)
	}
	return tok
}

func TestSinceNamesEveryChange(t *testing.T) {
	ws := t.TempDir()
	mustWrite(t, ws+"/a/b/keep.go", "x")
	mustWrite(t, ws+"/a/b/edit.go", "x")
	mustWrite(t, ws+"/gone.txt", "x")
	mustWrite(t, ws+"/old.txt", "x")
	mustWrite(t, ws+"/olddir/f", "x")
	w := watch(t, ws, DefaultLimits)
	tok := first(t, w)
	if tok2, names := w.Since(tok); len(names) != 0 || tok2 != tok {
		t.Fatalf("nothing changed: %q %q, want no names and the same token", tok2, names)
	}
	mustWrite(t, ws+"/a/b/edit.go", "y")
	mustWrite(t, ws+"/new.txt", "n")
	os.Remove(ws + "/gone.txt")
	os.Rename(ws+"/old.txt", ws+"/a/moved.txt")
	os.Rename(ws+"/olddir", ws+"/newdir")
	mustWrite(t, ws+"/fresh/deep/er/file.go", "f") // MkdirAll then a file: made before any watch could hold
	os.Chmod(ws+"/a/b/keep.go", 0o755)
	tok2, names := w.Since(tok)
	want := []string{"a/b/edit.go", "new.txt", "gone.txt", "old.txt", "a/moved.txt", "olddir", "olddir/", "newdir", "newdir/", "newdir/f",
		"fresh", "fresh/", "fresh/deep/er/file.go", "fresh/deep/er/", "a/b/keep.go"}
	for _, n := range want {
		if !slices.Contains(names, n) {
			t.Errorf("%q missing from %q", n, names)
		}
	}
	if tok2 == tok {
		t.Error("the token did not move")
	}
	// The new directories are watched: a change deep in them is named.
	mustWrite(t, ws+"/fresh/deep/er/file.go", "g")
	mustWrite(t, ws+"/newdir/g", "g")
	_, names = w.Since(tok2)
	if !slices.Contains(names, "fresh/deep/er/file.go") || !slices.Contains(names, "newdir/g") {
		t.Errorf("changes in new directories: %q", names)
	}
	// The moved directory's old watch is gone: nothing is named under its old name.
	for _, n := range names {
		if strings.HasPrefix(n, "olddir") {
			t.Errorf("a name under the moved directory's old name: %q", n)
		}
	}
}

func TestSinceRefusesTokensItCannotVouchFor(t *testing.T) {
	ws := t.TempDir()
	w := watch(t, ws, DefaultLimits)
	tok := first(t, w)
	other := watch(t, ws, DefaultLimits)
	otok := first(t, other)
	for _, bad := range []string{"", otok, tok + "0", tok[:len(tok)-1] + "9", strings.Replace(tok, ":0", ":00", 1), "pp1:" + w.inst + ":-1"} {
		if _, names := w.Since(bad); !slices.Equal(names, []string{Everything}) {
			t.Errorf("token %q: %q, want everything", bad, names)
		}
	}
	if _, names := w.Since(tok); len(names) != 0 {
		t.Errorf("its own token: %q", names)
	}
}

// An inotify queue overflow (events dropped by the kernel) makes every
// token issued before it answer "everything", and the tree is watched
// again: a directory made while events were lost is watched afterwards.
func TestOverflowAnswersEverything(t *testing.T) {
	ws := t.TempDir()
	w := watch(t, ws, DefaultLimits)
	tok := first(t, w)
	w.mu.Lock() // the events of what follows stay queued until the overflow
	for wd := range w.wds {
		unix.InotifyRmWatch(w.ifd, uint32(wd)) // the watches "lost" along with the events
	}
	mustWrite(t, ws+"/lost/f", "x")
	w.event(-1, unix.IN_Q_OVERFLOW, "")
	w.mu.Unlock()
	tok2, names := w.Since(tok)
	if !slices.Equal(names, []string{Everything}) {
		t.Fatalf("after an overflow: %q, want everything", names)
	}
	mustWrite(t, ws+"/lost/f", "y")
	if _, names := w.Since(tok2); !slices.Contains(names, "lost/f") {
		t.Fatalf("after the rewatch: %q, want lost/f", names)
	}
	if w.Stats().Overflows != 1 {
		t.Errorf("stats: %+v", w.Stats())
	}
}

// Past the reply's count or byte limit, or past the journal, the answer
// is "everything".
func TestLimitsAnswerEverything(t *testing.T) {
	for _, lim := range []Limits{{Paths: 10, Bytes: 1 << 20, Journal: 1000, Watches: 100}, {Paths: 1000, Bytes: 100, Journal: 1000, Watches: 100},
		{Paths: 1000, Bytes: 1 << 20, Journal: 10, Watches: 100}} {
		ws := t.TempDir()
		w := watch(t, ws, lim)
		tok := first(t, w)
		for i := range 30 {
			mustWrite(t, filepath.Join(ws, "f"+strings.Repeat("x", i)), "x")
		}
		if _, names := w.Since(tok); !slices.Equal(names, []string{Everything}) {
			t.Errorf("%+v: %d names, want everything", lim, len(names))
		}
	}
}

// Past the watch limit, every watch is dropped and every answer is
// "everything", for good: the host's inotify watches are not the agent's
// to spend.
func TestWatchLimitDegrades(t *testing.T) {
	ws := t.TempDir()
	w := watch(t, ws, Limits{Paths: 1000, Bytes: 1 << 20, Journal: 1000, Watches: 5})
	tok := first(t, w)
	for i := range 5 {
		os.MkdirAll(filepath.Join(ws, "d", strconv.Itoa(i)), 0o755)
	}
	tok, names := w.Since(tok)
	if !slices.Equal(names, []string{Everything}) {
		t.Fatalf("past the watch limit: %q, want everything", names)
	}
	if _, names := w.Since(tok); !slices.Equal(names, []string{Everything}) {
		t.Fatalf("past the watch limit, asked again: %q, want everything", names)
	}
	if st := w.Stats(); !st.Degraded || st.Watches != 0 {
		t.Fatalf("stats %+v, want degraded with no watch left", st)
	}
}

// A symlink the agent plants, pointing out of the workspace, is a name to
// the watcher and never a place: no watch is added through it, and a
// change behind it is never reported. The control: a watch added by name
// through the same link (what a watcher following links would do) sees
// the change outside.
func TestPlantedSymlinkIsNotFollowed(t *testing.T) {
	base := t.TempDir()
	ws, outside := base+"/ws", base+"/outside"
	mustWrite(t, outside+"/secret/keys", "k")
	mustWrite(t, ws+"/README", "r")
	w := watch(t, ws, DefaultLimits)
	tok := first(t, w)
	watches := w.Stats().Watches
	if err := os.Symlink(outside, ws+"/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside+"/secret", ws+"/dirlink"); err != nil {
		t.Fatal(err)
	}
	tok2, names := w.Since(tok)
	if !slices.Contains(names, "link") || slices.Contains(names, "link/") {
		t.Fatalf("the planted link: %q, want its name only", names)
	}
	mustWrite(t, outside+"/secret/keys", "changed")
	mustWrite(t, outside+"/new", "n")
	if _, names := w.Since(tok2); len(names) != 0 {
		t.Fatalf("a change behind a planted link was reported: %q", names)
	}
	if got := w.Stats().Watches; got != watches {
		t.Fatalf("watches %d after the links, %d before", got, watches)
	}

	// Control: following the link by name watches the outside.
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ifd)
	if _, err := unix.InotifyAddWatch(ifd, ws+"/dirlink", watchMask); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, outside+"/secret/keys", "again")
	var buf [4096]byte
	if n, err := unix.Read(ifd, buf[:]); err != nil || n == 0 {
		t.Fatalf("control: a watch through the link saw nothing (%v): the test proves nothing", err)
	}
}

// A directory swapped for a symlink between its creation event and the
// watch is not followed either.
func TestSwappedDirectoryIsNotFollowed(t *testing.T) {
	base := t.TempDir()
	ws, outside := base+"/ws", base+"/outside"
	mustWrite(t, outside+"/x", "x")
	os.MkdirAll(ws, 0o755)
	w := watch(t, ws, DefaultLimits)
	tok := first(t, w)
	w.mu.Lock() // hold the watcher: the event is queued, not handled
	os.Mkdir(ws+"/d", 0o755)
	os.Remove(ws + "/d")
	os.Symlink(outside, ws+"/d")
	w.mu.Unlock()
	tok, _ = w.Since(tok)
	mustWrite(t, outside+"/x", "y")
	if _, names := w.Since(tok); len(names) != 0 {
		t.Fatalf("reported a change behind the swapped link: %q", names)
	}
}

func TestServerProtocol(t *testing.T) {
	ws := t.TempDir()
	w := watch(t, ws, DefaultLimits)
	s, addr := serveLoopback(t, w)
	ask := func(req string) string { return askFrom(t, addr, netip.MustParseAddr("127.0.0.1"), req) }
	ans := ask("since 123\n")
	tok, rest, ok := strings.Cut(ans, "\x00")
	if !ok || rest != "/\x00" || !strings.HasPrefix(tok, "pp1:") {
		t.Fatalf("answer %q", ans)
	}
	mustWrite(t, ws+"/n", "x")
	if ans := ask("since " + tok + "\n"); !strings.HasSuffix(ans, "\x00n\x00") {
		t.Fatalf("answer %q", ans)
	}
	for _, bad := range []string{"", "since\n", "since \n", "since a b\n", "since a\nsince b\n", "since a", "until a\n",
		"since " + strings.Repeat("a", 129) + "\n", "since a\x01\n", "since ../../etc\n\x00"} {
		if ans := ask(bad); ans != "" {
			t.Errorf("request %q answered %q", bad, ans)
		}
	}
	if s.Refused() == 0 {
		t.Error("no refusal counted")
	}
	// Another address than the sandbox's: closed unanswered, however
	// well formed the request.
	refused := s.Refused()
	if ans := askFrom(t, addr, netip.MustParseAddr("127.0.0.2"), "since 123\n"); ans != "" {
		t.Errorf("a connection from another address was answered %q", ans)
	}
	if s.Refused() != refused+1 {
		t.Errorf("refused %d, want %d", s.Refused(), refused+1)
	}
}

// serveLoopback serves w on an ephemeral loopback port for 127.0.0.1.
func serveLoopback(t *testing.T, w *Watcher) (*Server, netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := Serve(w, ln, netip.MustParseAddr("127.0.0.1"))
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().(*net.TCPAddr).AddrPort()
}

// askFrom sends req from the address from, half-closes and reads the
// whole answer.
func askFrom(t *testing.T, addr netip.AddrPort, from netip.Addr, req string) string {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
	c, err := d.Dial("tcp4", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte(req))
	c.(*net.TCPConn).CloseWrite()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var b []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			return string(b)
		}
	}
}

// Git with the hook in a real repository: after each change made beside
// it, `git status` with the monitor says exactly what it says without.
func TestGitStatusWithHook(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		t.Fatal("perl is needed (the image has it; so must the host running this test)")
	}
	ws := t.TempDir()
	for i := range 50 {
		mustWrite(t, filepath.Join(ws, "src", string(rune('a'+i%5)), "f"+string(rune('a'+i%26))+".go"), "package x\n")
	}
	mustWrite(t, ws+"/.gitignore", "build/\n")
	mustWrite(t, ws+"/build/out", "o")
	gitEnv := []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C",
		"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@a", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@a"}
	git := func(extra []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = ws, append(slices.Clone(gitEnv), extra...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %q: %v: %s", args, err, out)
		}
		return string(out)
	}
	git(nil, "init", "-q")
	git(nil, "add", "-A")
	git(nil, "commit", "-qm", "base")

	w := watch(t, ws, Limits{Paths: 40, Bytes: 1 << 20, Journal: 1 << 16, Watches: 100})
	dir := t.TempDir()
	hook := dir + "/hook"
	_, addr := serveLoopback(t, w)
	mustWrite(t, hook, HookFor(addr, ws))
	os.Chmod(hook, 0o755)
	mon := []string{"GIT_CONFIG_COUNT=3", "GIT_CONFIG_KEY_0=core.fsmonitor", "GIT_CONFIG_VALUE_0=" + hook,
		"GIT_CONFIG_KEY_1=core.untrackedCache", "GIT_CONFIG_VALUE_1=true", "GIT_CONFIG_KEY_2=core.checkStat", "GIT_CONFIG_VALUE_2=minimal"}
	plain := []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.fsmonitor", "GIT_CONFIG_VALUE_0=false"}
	check := func(step string) {
		t.Helper()
		got := git(mon, "status", "--porcelain", "-uall")
		// Without the monitor, and without writing the index (which
		// would drop the monitor's token from it).
		want := git(plain, "--no-optional-locks", "status", "--porcelain", "-uall")
		if got != want {
			t.Fatalf("%s: with the monitor:\n%s\nwithout:\n%s", step, got, want)
		}
	}
	check("start")
	check("again")
	lists := w.Stats().Lists
	steps := []struct {
		name string
		do   func()
	}{
		{"edit", func() { mustWrite(t, ws+"/src/a/fa.go", "package y\n") }},
		{"create", func() { mustWrite(t, ws+"/src/b/new.go", "n") }},
		{"delete", func() { os.Remove(ws + "/src/c/fc.go") }},
		{"rename", func() { os.Rename(ws+"/src/d/fd.go", ws+"/src/d/renamed.go") }},
		{"new tree", func() { mustWrite(t, ws+"/pkg/deep/x/y.go", "y") }},
		{"dir rename", func() { os.Rename(ws+"/src/e", ws+"/src/e2") }},
		{"ignored", func() { mustWrite(t, ws+"/build/more", "m") }},
		{"chmod", func() { os.Chmod(ws+"/src/a/fk.go", 0o755) }},
		{"flood past the limit", func() {
			for i := range 100 {
				mustWrite(t, filepath.Join(ws, "flood", strings.Repeat("z", i%7+1)+string(rune('a'+i%26))), "z")
			}
		}},
		{"commit", func() { git(nil, "add", "-A"); git(nil, "commit", "-qm", "c") }},
		{"edit after commit", func() { mustWrite(t, ws+"/src/b/new.go", "changed") }},
		{"planted link", func() { os.Symlink("/etc", ws+"/etc-link") }},
	}
	for _, st := range steps {
		st.do()
		check(st.name)
	}
	// A repository of its own beneath the workspace (the agent's clone):
	// the hook, which the environment gives every git in the sandbox,
	// must not answer it with the workspace's names.
	nested := ws + "/vendor/lib"
	mustWrite(t, nested+"/a.go", "a")
	git(nil, "-C", nested, "init", "-q")
	git(nil, "-C", nested, "add", "-A")
	git(nil, "-C", nested, "commit", "-qm", "n")
	nestedStatus := func() (string, string) {
		return git(mon, "-C", nested, "status", "--porcelain"), git(plain, "-C", nested, "--no-optional-locks", "status", "--porcelain")
	}
	nestedStatus()
	nestedStatus()
	mustWrite(t, nested+"/a.go", "changed")
	if got, want := nestedStatus(); got != want {
		t.Fatalf("a nested repository: with the monitor %q, without %q", got, want)
	}
	if got := w.Stats(); got.Lists <= lists || got.Everything == 0 {
		t.Errorf("the monitor answered with lists %d (before the steps %d) and everything %d times: it was not used", got.Lists, lists, got.Everything)
	}
}
