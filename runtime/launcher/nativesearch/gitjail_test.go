package nativesearch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// The launcher's git writes in its scratch directory and nowhere else: a
// config file it writes there is written (the control), one in the
// workspace or at the jail's root is not, and it cannot make a directory
// even in the scratch directory.
func TestRunGitWritesOnlyItsScratch(t *testing.T) {
	f := newJail(t)
	scratch := filepath.Join(t.TempDir(), "scratch")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(scratch, int(f.j.UID), int(f.j.GID)); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) Result {
		t.Helper()
		res, err := f.j.RunGit(context.Background(), scratch, 1<<20, args, []string{"GIT_CONFIG_NOSYSTEM=1", "HOME=" + ScratchPath})
		if err != nil {
			t.Fatalf("git %q: %v", args, err)
		}
		return res
	}
	if res := run("config", "--file", ScratchPath+"/x.cfg", "a.b", "c"); res.Exit != 0 {
		t.Fatalf("git config in the scratch dir exited %d: %s", res.Exit, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(scratch, "x.cfg")); err != nil || len(b) == 0 {
		t.Fatalf("the scratch dir's file: %q %v", b, err)
	}
	for _, p := range []string{wsDest + "/x.cfg", "/x.cfg", "/usr/x.cfg"} {
		if res, err := f.j.RunGit(context.Background(), scratch, 1<<20, []string{"config", "--file", p, "a.b", "c"}, []string{"GIT_CONFIG_NOSYSTEM=1"}); err == nil && res.Exit == 0 {
			t.Errorf("git wrote %s", p)
		}
	}
	if _, err := os.Stat(filepath.Join(f.ws, "x.cfg")); err == nil {
		t.Error("git wrote in the workspace")
	}
	if res, err := f.j.RunGit(context.Background(), scratch, 1<<20, []string{"init", "-q", ScratchPath + "/repo"}, []string{"GIT_CONFIG_NOSYSTEM=1"}); err == nil && res.Exit == 0 {
		t.Error("git made a repository (directories) in the scratch dir")
	}
	// Past RLIMIT_FSIZE a write fails.
	if res, err := f.j.RunGit(context.Background(), scratch, 8, []string{"config", "--file", ScratchPath + "/y.cfg", "a.b", "a long value"}, []string{"GIT_CONFIG_NOSYSTEM=1"}); err == nil && res.Exit == 0 {
		t.Error("git wrote past the jail's file size limit")
	}
}
