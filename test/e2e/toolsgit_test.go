package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Pi's tools: the sandbox's git, with the settings the pi-session profile ships
// (checkStat minimal, no ctime, an untracked cache: docs/spec.md, "An
// agent's tools and the file path"), still sees what the host changes in
// the workspace mid-session, and host git, as the deployment user, sees
// what the agent changes, with no refresh of its own (issue 33). One
// sandbox of the profile as it ships, the image's git in it, a generated
// repository whose worktree is the workspace; the sandbox's git has
// already read the tree (a status, which writes its private index and
// untracked cache) before each host change. That the sandbox sees the
// host's files at all, and that a caching file mode would not, is the
// launcher's TestWorkspaceCoherence and its control.
func TestPiToolsGitSeesHostEdits(t *testing.T) {
	im := image(t)
	host := filepath.Join(t.TempDir(), "host")
	r := genToolsRepo(t, host, 60)
	sbx := startToolsSandbox(t, im, host, r)
	status := func(what string, want ...string) {
		t.Helper()
		got := strings.Split(strings.TrimSuffix(sbx.output(t, "git status --porcelain"), "\n"), "\n")
		if len(got) == 1 && got[0] == "" {
			got = nil
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the sandbox's git status gave %q, want %q", what, got, want)
		}
	}
	status("the worktree as host git left it")
	files := strings.Fields(sbx.output(t, "git ls-files -- src"))
	if len(files) < 4 {
		t.Fatalf("want 4 tracked files under src, got %q", files)
	}
	edit, gone, moved := files[0], files[1], files[2]
	// Appended to, deleted, renamed, and a new file in a directory the
	// untracked cache has seen: each as the user's editor or tools would.
	f, err := os.OpenFile(filepath.Join(r.ws, edit), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("// edited on the host\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Remove(filepath.Join(r.ws, gone)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(r.ws, moved), filepath.Join(r.ws, moved+".moved")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(r.ws, filepath.Dir(edit), "host-new.txt"), "new\n")
	status("after the host's edits", " M "+edit, " D "+gone, " D "+moved, "?? "+moved+".moved", "?? "+filepath.Dir(edit)+"/host-new.txt")

	// The agent's changes, seen by host git as the deployment user.
	sbx.run(t, "echo agent >agent.txt && echo agent-edit >>"+files[3])
	if b, err := os.ReadFile(filepath.Join(r.ws, "agent.txt")); err != nil || string(b) != "agent\n" {
		t.Errorf("the agent's file on the host: %q, %v", b, err)
	}
	out, err := deployGit(t, r.ws, "status", "--porcelain")
	if err != nil {
		t.Fatalf("host git status: %v\n%s", err, out)
	}
	for _, want := range []string{" M " + files[3], "?? agent.txt", " M " + edit} {
		if !slices.Contains(strings.Split(out, "\n"), want) {
			t.Errorf("host git status lacks %q:\n%s", want, out)
		}
	}
}
