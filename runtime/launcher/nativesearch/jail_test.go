package nativesearch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// The workspace's path in the jail, as in a sandbox.
const wsDest = "/srv/paseo/ws"

// jailFixture is a workspace beside a host secret, and a jail over it.
type jailFixture struct {
	ws, secret string
	j          Jail
	rg         string // the image's rg, for the host controls
	spool      string // the spool serveJail made, which the client reads
}

func newJail(t *testing.T) jailFixture {
	t.Helper()
	skip.UnlessRoot(t, "it builds the search jail (user, mount, pid namespaces as the agent's uid)")
	if err := Probe(); err != nil {
		t.Fatal(err)
	}
	usr := filepath.Join(testbundle.Repo(t, ".image"), "rootfs", "usr")
	if _, err := os.Stat(filepath.Join(usr, "bin/rg")); err != nil {
		t.Fatalf("the image's rg is missing (%v): run `make image`", err)
	}
	base := t.TempDir()
	f := jailFixture{ws: filepath.Join(base, "ws"), secret: filepath.Join(base, "host-secret"), rg: filepath.Join(usr, "bin/rg")}
	for name, body := range map[string]string{
		"a.go": "package a\nfunc A() {}\n", "sub/b.go": "package sub\nfunc B() {}\nfunc C() {}\n",
		"sub/deep/c.txt": "nothing here\n", ".hidden/d.go": "func D() {}\n", "notes.md": "func in prose\n",
	} {
		write(t, filepath.Join(f.ws, name), body)
	}
	write(t, filepath.Join(f.secret, "key"), "func HOSTSECRET() {}\n")
	f.j = Jail{Workspace: f.ws, Dest: wsDest, Usr: usr, UID: 1000, GID: 1000, Limits: DefaultLimits}
	return f
}

func write(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// hostRg runs the image's rg on the host in dir, as root and with no jail:
// the controls' "nothing protects".
func (f jailFixture) hostRg(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(f.rg, append([]string{"--no-config"}, args...)...)
	cmd.Dir, cmd.Env = dir, []string{}
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func sortedLines(s string) []string {
	l := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	slices.Sort(l)
	return l
}

func pat(s string) *string { return &s }

// TestJailAnswersLikeRg: the jail's answers are the same rg's on the same
// tree (lines sorted: rg's thread order is not fixed), exit codes too.
func TestJailAnswersLikeRg(t *testing.T) {
	f := newJail(t)
	for _, tc := range []struct {
		name string
		r    Request
		args []string
		dir  string
	}{
		{"count", Request{Cwd: ".", Pattern: pat("func "), Options: []Option{{Name: "count"}}}, []string{"--count", "--", "func "}, ""},
		{"pi grep", Request{Cwd: ".", Pattern: pat("func [A-C]"), Options: []Option{{Name: "json"}, {Name: "line-number"}, {Name: "color=never"}, {Name: "hidden"}, {Name: "glob", Value: "*.go"}}, Paths: []string{"."}},
			[]string{"--line-number", "--color=never", "--hidden", "--glob=*.go", "--", "func [A-C]", "."}, ""},
		{"subdir, files", Request{Cwd: "sub", Options: []Option{{Name: "files"}, {Name: "sort=path"}}}, []string{"--files", "--sort=path"}, "sub"},
		{"none", Request{Cwd: ".", Pattern: pat("zzz-no-match")}, []string{"--", "zzz-no-match"}, ""},
		{"absolute path", Request{Cwd: ".", Pattern: pat("B"), Options: []Option{{Name: "with-filename"}}, Paths: []string{wsDest + "/sub/b.go"}},
			[]string{"--with-filename", "--", "B", filepath.Join(f.ws, "sub/b.go")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := f.j.Run(context.Background(), tc.r)
			if err != nil {
				t.Fatal(err)
			}
			want, code := f.hostRg(t, filepath.Join(f.ws, tc.dir), tc.args...)
			got := string(res.Stdout)
			if tc.name == "pi grep" { // --json's stats hold times; compare the match lines
				got = matchLines(got)
				want, code = f.hostRg(t, filepath.Join(f.ws, tc.dir), append([]string{"--json"}, tc.args...)...)
				want = matchLines(want)
			}
			got = strings.ReplaceAll(got, wsDest, f.ws)
			if res.Exit != code || !slices.Equal(sortedLines(got), sortedLines(want)) {
				t.Errorf("jail: exit %d\n%s\nhost rg: exit %d\n%s\nstderr: %s", res.Exit, got, code, want, res.Stderr)
			}
		})
	}
}

func matchLines(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, `"type":"match"`) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// runArgv runs argv in the jail past Request's check: what the jail alone
// holds against, were a check to let something through.
func (f jailFixture) runArgv(t *testing.T, cwd string, argv ...string) Result {
	t.Helper()
	return f.runTool(t, Rg, cwd, argv...)
}

// runTool is runArgv for any tool.
func (f jailFixture) runTool(t *testing.T, tool Tool, cwd string, argv ...string) Result {
	t.Helper()
	res, err := f.j.run(context.Background(), tool, cwd, argv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestJailPlantedLink: a link the agent planted to a host file is not
// followed out of the workspace: not by the request (no --follow on the
// list), not by the jail even when rg is told to follow (the jail holds
// nothing it could lead to). Control: rg on the host follows it.
func TestJailPlantedLink(t *testing.T) {
	f := newJail(t)
	if err := os.Symlink(f.secret, filepath.Join(f.ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(f.secret, "key"), filepath.Join(f.ws, "escape-file")); err != nil {
		t.Fatal(err)
	}
	out, _ := f.hostRg(t, f.ws, "--follow", "HOSTSECRET")
	if !strings.Contains(out, "HOSTSECRET") {
		t.Fatalf("control: host rg --follow did not read the planted link's target:\n%s", out)
	}
	if _, err := Decode(Request{Cwd: ".", Pattern: pat("HOSTSECRET"), Options: []Option{{Name: "follow"}}}.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
		t.Errorf("--follow: %v, want %s", err, diag.SearchRequest)
	}
	for _, args := range [][]string{
		{"--", "HOSTSECRET"},
		{"--follow", "--", "HOSTSECRET"},
		{"--", "HOSTSECRET", "escape", "escape-file", "escape/key"},
		{"--", "HOSTSECRET", f.secret + "/key"},
	} {
		res := f.runArgv(t, ".", args...)
		if strings.Contains(string(res.Stdout), "HOSTSECRET") {
			t.Errorf("rg %q in the jail read the host secret:\n%s", args, res.Stdout)
		}
	}
}

// TestJailPre: --pre (rg runs a program per file) is refused by the
// request's check; and the jail runs nothing the agent wrote even past it
// (the workspace is noexec, Landlock executes rg only). Control: rg --pre
// on the host runs the agent's program.
func TestJailPre(t *testing.T) {
	f := newJail(t)
	marker := filepath.Join(t.TempDir(), "ran")
	write(t, filepath.Join(f.ws, "evil"), "#!/bin/sh\ntouch "+marker+"\ncat \"$1\"\n")
	os.Chmod(filepath.Join(f.ws, "evil"), 0o755)
	f.hostRg(t, f.ws, "--pre", "./evil", "func")
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("control: host rg --pre did not run ./evil: %v", err)
	}
	os.Remove(marker)
	for _, name := range []string{"pre", "pre-glob", "search-zip", "follow", "ignore-file", "file", "type-add"} {
		r := Request{Cwd: ".", Pattern: pat("func"), Options: []Option{{Name: name, Value: "./evil"}}}
		if _, err := Decode(r.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("--%s: %v, want %s", name, err, diag.SearchRequest)
		}
	}
	res := f.runArgv(t, ".", "--pre=./evil", "--", "func")
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the jail ran the workspace's ./evil")
	}
	if res.Exit != 2 && len(res.Stdout) != 0 {
		t.Errorf("rg --pre=./evil in the jail: exit %d, stdout %q", res.Exit, res.Stdout)
	}
}

// TestJailSwapRace: the agent swaps a directory for a link out of the
// workspace while searches run; no search reads outside, since the jail's
// root holds only the workspace and the image. Control: host rg given the
// swapped name reads the host secret.
func TestJailSwapRace(t *testing.T) {
	f := newJail(t)
	d := filepath.Join(f.ws, "d")
	write(t, filepath.Join(d, "x.go"), "func X() {}\n")
	os.Rename(d, d+".dir")
	os.Symlink(f.secret, d)
	if out, _ := f.hostRg(t, f.ws, "HOSTSECRET", "d"); !strings.Contains(out, "HOSTSECRET") {
		t.Fatalf("control: host rg on the swapped name did not read the secret:\n%s", out)
	}
	os.Remove(d)
	os.Rename(d+".dir", d)
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			os.Rename(d, d+".dir")
			os.Symlink(f.secret, d)
			os.Remove(d)
			os.Rename(d+".dir", d)
		}
	}()
	defer func() { stop.Store(true); <-done }()
	for i := 0; i < 20; i++ {
		res, err := f.j.run(context.Background(), Rg, ".", []string{"--", "func", "d"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(res.Stdout), "HOSTSECRET") {
			t.Fatalf("search %d read the host secret through the swap:\n%s", i, res.Stdout)
		}
	}
}

// TestJailBounds: output past the bound, and a search past its wall time,
// are not answered (the client then runs the sandbox's rg). Control: the
// same search within the default bounds is answered.
func TestJailBounds(t *testing.T) {
	f := newJail(t)
	for i := 0; i < 200; i++ {
		write(t, filepath.Join(f.ws, "many", strings.Repeat("x", 1+i%50)+string(rune('a'+i%26))+".txt"), strings.Repeat("func line\n", 50))
	}
	r := Request{Cwd: ".", Pattern: pat("func")}
	if res, err := f.j.Run(context.Background(), r); err != nil || len(res.Stdout) < 4096 {
		t.Fatalf("control: %v, %d bytes", err, len(res.Stdout))
	}
	small := f.j
	small.Limits.Stdout = 4096
	if _, err := small.Run(context.Background(), r); !errors.Is(err, ErrFallback) {
		t.Errorf("output past 4096 bytes: %v, want ErrFallback", err)
	}
	quick := f.j
	quick.Limits.Wall = time.Millisecond
	if _, err := quick.Run(context.Background(), r); !errors.Is(err, ErrFallback) {
		t.Errorf("past the wall time: %v, want ErrFallback", err)
	}
}

// TestJailIdentity: the search runs as the agent's uid, not root: a file
// only root may read stays unread. Control: host rg as root reads it.
func TestJailIdentity(t *testing.T) {
	f := newJail(t)
	write(t, filepath.Join(f.ws, "rootonly"), "func ROOTONLY() {}\n")
	os.Chmod(filepath.Join(f.ws, "rootonly"), 0o600)
	if out, _ := f.hostRg(t, f.ws, "ROOTONLY"); !strings.Contains(out, "ROOTONLY") {
		t.Fatalf("control: root did not read the file")
	}
	res := f.runArgv(t, ".", "--", "ROOTONLY")
	if strings.Contains(string(res.Stdout), "ROOTONLY") || res.Exit != 2 {
		t.Errorf("the jail read a root-only file (exit %d):\n%s", res.Exit, res.Stdout)
	}
}

func isCode(err error, c diag.Code) bool {
	var e interface{ Code() diag.Code }
	return errors.As(err, &e) && e.Code() == c
}
