package nativesearch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"paseo.dev/paseo-policy/policy/bundle"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"paseo.dev/paseo-policy/diag"
)

// The image's fd and find, for the host controls.
func (f jailFixture) bin(tool Tool) string {
	bin := toolSpecs[tool].bin
	if tool == Cat {
		// No jail runs cat (the server copies its files); the sandbox's
		// own cat is the image's, which the client falls back to.
		bin = bundle.SearchReal["cat"]
	}
	return filepath.Join(filepath.Dir(filepath.Dir(f.rg)), strings.TrimPrefix(bin, "/usr/"))
}

// hostTool runs the image's tool on the host in dir, as root and with no
// jail: the controls' "nothing protects".
func (f jailFixture) hostTool(t *testing.T, tool Tool, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(f.bin(tool), args...)
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

// listingTree adds what name listings meet to f's workspace: a Git
// marker and a .gitignore with an ignored file, a link to a file and one
// to a directory inside, an empty directory.
func listingTree(t *testing.T, f jailFixture) {
	t.Helper()
	write(t, filepath.Join(f.ws, ".git", "HEAD"), "ref: refs/heads/main\n")
	write(t, filepath.Join(f.ws, ".gitignore"), "*.log\nbuild/\n")
	write(t, filepath.Join(f.ws, "debug.log"), "ignored\n")
	write(t, filepath.Join(f.ws, "build", "out.go"), "package build\n")
	write(t, filepath.Join(f.ws, "sub", "deep", "e.GO"), strings.Repeat("x", 3000))
	os.MkdirAll(filepath.Join(f.ws, "empty"), 0o755)
	os.Symlink("a.go", filepath.Join(f.ws, "a-link.go"))
	os.Symlink("sub", filepath.Join(f.ws, "sub-link"))
}

// TestJailAnswersLikeFdAndFind: the jail's fd and find list what the
// image's fd and find list on the same tree (lines sorted: fd's thread
// order is not fixed), exit codes too; Pi's find tool's argv among them.
func TestJailAnswersLikeFdAndFind(t *testing.T) {
	f := newJail(t)
	listingTree(t, f)
	for _, tc := range []struct {
		name string
		r    Request
		args []string
		dir  string
	}{
		{"fd all", Request{Tool: Fd, Cwd: "."}, []string{}, ""},
		{"fd -e go", Request{Tool: Fd, Cwd: ".", Options: []Option{{Name: "extension", Value: "go"}}}, []string{"-e", "go"}, ""},
		{"fd hidden no-ignore", Request{Tool: Fd, Cwd: ".", Options: []Option{{Name: "hidden"}, {Name: "no-ignore"}, {Name: "type", Value: "f"}}}, []string{"-HI", "-tf"}, ""},
		{"fd pi find", Request{Tool: Fd, Cwd: ".", Pattern: pat("*.go"), Paths: []string{wsDest},
			Options: []Option{{Name: "color=never"}, {Name: "hidden"}, {Name: "glob"}, {Name: "max-results", Value: "1001"}}},
			[]string{"--color=never", "--hidden", "--glob", "--max-results", "1001", "--", "*.go", "WS"}, ""},
		{"fd pi find, a path pattern", Request{Tool: Fd, Cwd: ".", Pattern: pat(wsDest + "/sub/**/*.go"), Paths: []string{wsDest},
			Options: []Option{{Name: "color=never"}, {Name: "hidden"}, {Name: "glob"}, {Name: "max-results", Value: "1001"}, {Name: "full-path"}, {Name: "ignore-case"}}},
			[]string{"--color=never", "--hidden", "--glob", "--max-results", "1001", "--full-path", "--ignore-case", "--", "WS/sub/**/*.go", "WS"}, ""},
		{"fd links, absolute", Request{Tool: Fd, Cwd: ".", Options: []Option{{Name: "type", Value: "l"}, {Name: "absolute-path"}}}, []string{"-tl", "-a"}, ""},
		{"fd in a subdir", Request{Tool: Fd, Cwd: "sub", Options: []Option{{Name: "hidden"}}}, []string{"-H"}, "sub"},
		{"fd none", Request{Tool: Fd, Cwd: ".", Pattern: pat("zzz-none")}, []string{"zzz-none"}, ""},
		{"fd missing path", Request{Tool: Fd, Cwd: ".", Pattern: pat("x"), Paths: []string{"no-such-dir"}}, []string{"x", "no-such-dir"}, ""},
		{"find -name", Request{Tool: Find, Cwd: ".", Paths: []string{"."}, Expr: mustFind(t, "-name", "*.go")}, []string{".", "-name", "*.go"}, ""},
		{"find all", Request{Tool: Find, Cwd: "."}, []string{}, ""},
		{"find prune, types", Request{Tool: Find, Cwd: ".", Expr: mustFind(t, "-path", "./.git", "-prune", "-o", "(", "-type", "f", "-o", "-type", "l", ")", "-print")},
			[]string{"-path", "./.git", "-prune", "-o", "(", "-type", "f", "-o", "-type", "l", ")", "-print"}, ""},
		{"find depth, size, empty", Request{Tool: Find, Cwd: ".", Paths: []string{"sub", "empty"}, Expr: mustFind(t, "-maxdepth", "3", "(", "-size", "+1k", "-o", "-empty", ")")},
			[]string{"sub", "empty", "-maxdepth", "3", "(", "-size", "+1k", "-o", "-empty", ")"}, ""},
		{"find -iname, absolute", Request{Tool: Find, Cwd: "sub", Paths: []string{wsDest + "/sub"}, Expr: mustFind(t, "-iname", "*.go", "-print0")},
			[]string{"WS/sub", "-iname", "*.go", "-print0"}, "sub"},
		{"find -newer", Request{Tool: Find, Cwd: ".", Expr: mustFind(t, "-newer", "a.go", "-not", "-type", "d")}, []string{"-newer", "a.go", "-not", "-type", "d"}, ""},
		{"find missing", Request{Tool: Find, Cwd: ".", Paths: []string{"no-such"}}, []string{"no-such"}, ""},
		{"find warns", Request{Tool: Find, Cwd: ".", Expr: mustFind(t, "-name", "x", "-maxdepth", "1")}, []string{"-name", "x", "-maxdepth", "1"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := f.j.Run(context.Background(), tc.r)
			if err != nil {
				t.Fatal(err)
			}
			var args []string
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "WS", f.ws))
			}
			want, code := f.hostTool(t, tc.r.Tool, filepath.Join(f.ws, tc.dir), args...)
			got := strings.ReplaceAll(string(res.Stdout), wsDest, f.ws)
			if res.Exit != code || !slices.Equal(sortedLines(got), sortedLines(want)) {
				t.Errorf("jail: exit %d\n%s\nhost %s: exit %d\n%s\nstderr: %s", res.Exit, got, tc.r.Tool, code, want, res.Stderr)
			}
		})
	}
}

// TestJailFindAndFdRunNothing: find's -exec, -delete and -fprint and fd's
// -x are refused by the request's check; past it, in the jail, nothing
// the agent wrote runs, nothing is deleted or written. Control: the host's
// find and fd run, delete and write.
func TestJailFindAndFdRunNothing(t *testing.T) {
	f := newJail(t)
	marker := filepath.Join(t.TempDir(), "ran")
	write(t, filepath.Join(f.ws, "evil"), "#!/bin/sh\ntouch "+marker+"\n")
	os.Chmod(filepath.Join(f.ws, "evil"), 0o755)
	victim := filepath.Join(f.ws, "victim.txt")
	out := filepath.Join(t.TempDir(), "fprint")
	hostWS := t.TempDir() // the control's copy: -delete there
	write(t, filepath.Join(hostWS, "victim.txt"), "x")

	// Controls.
	f.hostTool(t, Find, f.ws, ".", "-name", "a.go", "-exec", "./evil", ";")
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("control: host find -exec did not run ./evil: %v", err)
	}
	os.Remove(marker)
	f.hostTool(t, Fd, f.ws, "-x", "./evil", ";", "--", "a.go")
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("control: host fd -x did not run ./evil: %v", err)
	}
	os.Remove(marker)
	f.hostTool(t, Find, hostWS, ".", "-name", "victim.txt", "-delete")
	if _, err := os.Stat(filepath.Join(hostWS, "victim.txt")); err == nil {
		t.Fatal("control: host find -delete did not delete")
	}
	f.hostTool(t, Find, f.ws, ".", "-name", "a.go", "-fprint", out)
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("control: host find -fprint did not write: %v", err)
	}
	os.Remove(out)

	write(t, victim, "x")
	for _, toks := range [][]string{{"-exec", "./evil", ";"}, {"-execdir", "./evil", ";"}, {"-delete"}, {"-fprint", out}} {
		r := Request{Tool: Find, Cwd: "."}
		enc := string(r.Encode())
		for _, tok := range toks {
			enc += "expr\x00" + tok + "\x00"
		}
		if _, err := Decode([]byte(enc), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("find %q: %v, want %s", toks, err, diag.SearchRequest)
		}
	}
	if _, err := Decode(Request{Tool: Fd, Cwd: ".", Options: []Option{{Name: "exec", Value: "./evil"}}}.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
		t.Errorf("fd -x: %v, want %s", err, diag.SearchRequest)
	}
	// Past the list: the jail alone.
	f.runTool(t, Find, ".", ".", "-name", "a.go", "-exec", "./evil", ";")
	f.runTool(t, Find, ".", ".", "-name", "a.go", "-exec", "/bin/sh", "-c", "touch "+marker, ";")
	f.runTool(t, Fd, ".", "-x", "./evil", ";", "--", "a.go")
	f.runTool(t, Find, ".", ".", "-name", "victim.txt", "-delete")
	f.runTool(t, Find, ".", ".", "-name", "a.go", "-fprint", "/tmp/fprint")
	f.runTool(t, Find, ".", ".", "-name", "a.go", "-fprint", "fprint-in-ws")
	if _, err := os.Stat(marker); err == nil {
		t.Error("the jail ran a program through find or fd")
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("find -delete in the jail deleted the agent's file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.ws, "fprint-in-ws")); err == nil {
		t.Error("find -fprint in the jail wrote into the workspace")
	}
}

// TestJailFindAndFdFollowNothingOut: a link the agent planted to a host
// directory is not followed out of the workspace: -L/--follow are off the
// list, and even told to follow in the jail, find and fd list nothing of
// the host's. Control: the host's find -L and fd -L list the host's
// secret through the link.
func TestJailFindAndFdFollowNothingOut(t *testing.T) {
	f := newJail(t)
	if err := os.Symlink(f.secret, filepath.Join(f.ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if out, _ := f.hostTool(t, Find, f.ws, "-L", ".", "-name", "key"); !strings.Contains(out, "escape/key") {
		t.Fatalf("control: host find -L did not list the planted link's target: %q", out)
	}
	if out, _ := f.hostTool(t, Fd, f.ws, "-L", "key"); !strings.Contains(out, "escape/key") {
		t.Fatalf("control: host fd -L did not list the planted link's target: %q", out)
	}
	if _, err := Decode(Request{Tool: Fd, Cwd: ".", Options: []Option{{Name: "follow"}}}.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
		t.Errorf("fd -L: %v", err)
	}
	if _, err := Decode([]byte(string(Request{Tool: Find, Cwd: "."}.Encode())+"expr\x00-follow\x00"), wsDest); !isCode(err, diag.SearchRequest) {
		t.Errorf("find -follow: %v", err)
	}
	for _, tc := range []struct {
		tool Tool
		argv []string
	}{
		{Find, []string{"-L", ".", "-name", "key"}},
		{Find, []string{".", "-follow", "-name", "key"}},
		{Find, []string{"escape/", "-name", "key"}},
		{Find, []string{f.secret}},
		{Fd, []string{"-L", "key"}},
		{Fd, []string{"-L", "key", "escape"}},
		{Fd, []string{"key", f.secret}},
	} {
		res := f.runTool(t, tc.tool, ".", tc.argv...)
		if strings.Contains(string(res.Stdout), "key") {
			t.Errorf("%s %q in the jail listed the host's directory:\n%s", tc.tool, tc.argv, res.Stdout)
		}
	}
}

// TestJailListingSwapRace: the agent swaps a directory for a link out of
// the workspace while find and fd list it; no listing names the host's
// files. Control: host find given the swapped name lists them.
func TestJailListingSwapRace(t *testing.T) {
	f := newJail(t)
	d := filepath.Join(f.ws, "d")
	write(t, filepath.Join(d, "x.go"), "func X() {}\n")
	os.Rename(d, d+".dir")
	os.Symlink(f.secret, d)
	if out, _ := f.hostTool(t, Find, f.ws, "d/"); !strings.Contains(out, "key") {
		t.Fatalf("control: host find on the swapped name did not list the secret: %q", out)
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
	for i := 0; i < 10; i++ {
		for _, tc := range []struct {
			tool Tool
			argv []string
		}{{Find, []string{"d/"}}, {Find, []string{"."}}, {Fd, []string{"--", ".", "d/"}}, {Fd, []string{"-H"}}} {
			res, err := f.j.run(context.Background(), tc.tool, ".", tc.argv, nil)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(res.Stdout), "key") {
				t.Fatalf("%s %q, round %d, listed the host's directory through the swap:\n%s", tc.tool, tc.argv, i, res.Stdout)
			}
		}
	}
}

// TestJailListingBounds: a listing past the output bound is not answered
// (the client then runs the sandbox's find or fd). Control: within the
// default bounds it is.
func TestJailListingBounds(t *testing.T) {
	f := newJail(t)
	for i := 0; i < 300; i++ {
		write(t, filepath.Join(f.ws, "many", strings.Repeat("y", 1+i%60)+string(rune('a'+i%26))+".txt"), "")
	}
	small := f.j
	small.Limits.Stdout = 2048
	for _, r := range []Request{{Tool: Find, Cwd: "."}, {Tool: Fd, Cwd: "."}} {
		if res, err := f.j.Run(context.Background(), r); err != nil || len(res.Stdout) < 4096 {
			t.Fatalf("control: %s: %v, %d bytes", r.Tool, err, len(res.Stdout))
		}
		if _, err := small.Run(context.Background(), r); !errors.Is(err, ErrFallback) {
			t.Errorf("%s: output past 2048 bytes: %v, want ErrFallback", r.Tool, err)
		}
	}
}
