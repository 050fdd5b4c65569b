package launcher

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
	"strings"
	"syscall"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/gitimport"
)

// Issue 30's write-side plants, from inside the pinned runsc with the
// compiled layout of a real linked worktree (busybox only): in the
// repository and in the agent's store, a reflog (logs/HEAD) made a symlink
// to a file of the daemon user's, objects/pack a symlink to another
// repository's packs, a loose object of main overwritten, main moved,
// grafts. Then, as the deployment user on the host, the daemon's
// write-side git in the repository (checkout, commit, merge, gc, a push
// to a local bare repository) and the import. The control plants the
// same into the repository on the host, as issue 19's read-write layout
// let the sandbox do, and the same commands corrupt or write through.
const gitPlantScript = `b=/bin/busybox
W=$PASEO_AGENT_CWD
. $W/plant.env
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
plant() {
  p=$1; T=$2
  try $p-reflog-symlink $b sh -c "$b rm -f $T/logs/HEAD; $b ln -s $VICTIM $T/logs/HEAD"
  try $p-pack-symlink $b sh -c "$b rm -rf $T/objects/pack; $b ln -s $OTHER/objects/pack $T/objects/pack"
  try $p-object-overwrite $b sh -c "$b mkdir -p $T/objects/$OBJDIR && $b rm -f $T/objects/$OBJDIR/$OBJFILE; $b cp $W/evil.obj $T/objects/$OBJDIR/$OBJFILE"
  try $p-ref-move $b sh -c "echo $EVIL > $T/refs/heads/main"
  try $p-grafts $b sh -c "$b mkdir -p $T/info && echo $MAIN > $T/info/grafts"
}
plant repo $REPO
plant store /run/paseo/git-store
`

func TestGitWriteSidePlantsInRunsc(t *testing.T) {
	var l *plantLab
	sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(gitPlantScript), Prepare: func(t testing.TB, host string) {
		l = newPlantLab(t.(*testing.T), host)
	}})
	s := sceneSandbox(sc)
	res, out, stderr, err := s.launch(t, staticSecret("sk"))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v %+v\n%s\n%s", err, res, out, stderr)
	}
	t.Logf("sandbox:\n%s", out)
	got := outcomes(out)
	for _, p := range []string{"reflog-symlink", "pack-symlink", "object-overwrite", "ref-move", "grafts"} {
		if g := got["repo-"+p]; g == "ok" || g == "" {
			t.Errorf("repo-%s: %q, want a refusal (the repository is read-only)", p, g)
		}
	}
	// In its own store the agent may do anything; none of it is read.
	for _, p := range []string{"reflog-symlink", "pack-symlink", "object-overwrite", "ref-move"} {
		if g := got["store-"+p]; g != "ok" {
			t.Errorf("store-%s: %q, want it planted (the store is the agent's)", p, g)
		}
	}
	contained := l.hostWriteSide(t)
	if contained.failed != "" {
		t.Errorf("contained: the daemon's write-side git failed: %s", contained.failed)
	}
	if contained.corrupted() {
		t.Errorf("contained: the daemon's git was led by the sandbox's plants: %+v", contained)
	}
	_, err = gitimport.Import(context.Background(), gitimport.Options{Repo: l.common, StateRoot: filepath.Join(l.host, "srv/paseo/state"), Store: l.store,
		Agent: "agent-7f3c", Branch: "refs/heads/feature", Base: l.main, Home: "/nonexistent"})
	var dl diag.List
	if !errors.As(err, &dl) || !slices.ContainsFunc(dl, func(d diag.Diagnostic) bool { return d.Code == diag.GitImportStore }) {
		t.Errorf("the import of the planted store: %v, want %s", err, diag.GitImportStore)
	}
	if g := l.git(t, l.common, "rev-parse", "refs/heads/feature"); g != l.main {
		t.Errorf("feature moved to %s", g)
	}
	s.assertClean(t)

	// The control: the same plants in the repository, on the host.
	c := newPlantLab(t, t.TempDir())
	c.plantOnHost(t)
	control := c.hostWriteSide(t)
	t.Logf("control: %+v", control)
	if !control.victimWritten || !control.objectChanged || !control.mainMoved || !control.otherTaken {
		t.Errorf("control: the plants did not take where nothing protects: %+v", control)
	}
}

// plantLab is a real repository with a linked worktree at the reference
// workspace, another repository, a file of the daemon user's, and the
// agent's store seeded as the start script seeds it.
type plantLab struct {
	host, common, store, other, victim string
	main, evil, readme, secret         string
}

func newPlantLab(t *testing.T, host string) *plantLab {
	l := &plantLab{host: host, common: filepath.Join(host, "srv/paseo/repos/proj/.git"), store: filepath.Join(host, "srv/paseo/state/pi-git/agent-7f3c"),
		other: filepath.Join(host, "srv/paseo/repos/other"), victim: filepath.Join(host, "home/deploy/.profile")}
	repo, ws := filepath.Dir(l.common), filepath.Join(host, "srv/paseo/workspace/proj-feature")
	for _, p := range []string{repo, ws, l.store} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{repo, filepath.Dir(ws), filepath.Join(l.store, "objects/info"), filepath.Join(l.store, "logs"), filepath.Dir(l.victim)} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFileT(t, l.victim, "# the deployment user's login script\n")
	l.git(t, "", "init", "-q", "-b", "main", repo)
	writeFileT(t, filepath.Join(repo, "README"), "proj\n")
	l.git(t, l.common, "--work-tree="+repo, "add", "README")
	l.git(t, l.common, "--work-tree="+repo, "commit", "-q", "-m", "init")
	l.main = l.git(t, l.common, "rev-parse", "HEAD")
	l.readme = l.git(t, l.common, "rev-parse", "HEAD:README")
	l.git(t, "", "-C", repo, "worktree", "add", "-q", "-b", "feature", ws)
	l.evil = l.git(t, l.common, "commit-tree", "-m", "evil", l.git(t, l.common, "rev-parse", "HEAD^{tree}"))
	l.git(t, "", "init", "-q", "-b", "main", l.other)
	writeFileT(t, filepath.Join(l.other, "secret"), "other repository\n")
	l.git(t, "", "-C", l.other, "add", "secret")
	l.git(t, "", "-C", l.other, "commit", "-q", "-m", "secret")
	l.git(t, "", "-C", l.other, "gc", "-q")
	l.secret = l.git(t, "", "-C", l.other, "rev-parse", "HEAD")
	// The store as the start script leaves it at a first launch.
	if out, err := exec.Command("cp", "-R", filepath.Join(l.common, "refs"), filepath.Join(l.store, "refs")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	writeFileT(t, filepath.Join(l.store, "objects/info/alternates"), filepath.Join(l.common, "objects")+"\n")
	var evil bytes.Buffer
	zw := zlib.NewWriter(&evil)
	fmt.Fprintf(zw, "blob 5\x00evil\n")
	zw.Close()
	writeFileT(t, filepath.Join(ws, "evil.obj"), evil.String())
	writeFileT(t, filepath.Join(ws, "plant.env"), fmt.Sprintf("REPO=%s\nVICTIM=%s\nOTHER=%s\nOBJDIR=%s\nOBJFILE=%s\nEVIL=%s\nMAIN=%s\n",
		l.common, l.victim, l.other+"/.git", l.readme[:2], l.readme[2:], l.evil, l.main))
	for _, p := range []string{filepath.Join(host, "srv/paseo/repos"), ws, l.store, filepath.Dir(l.victim)} {
		chownTree(t, p)
	}
	openUp(t, host)
	return l
}

// plantOnHost is the control: plant.env's plants made in the repository
// as the deployment user, as issue 19's read-write objects/, refs/ and
// logs/ let a sandbox make them.
func (l *plantLab) plantOnHost(t *testing.T) {
	t.Helper()
	ws := filepath.Join(l.host, "srv/paseo/workspace/proj-feature")
	script := `set -e; . ` + ws + `/plant.env; T=$REPO
rm -f $T/logs/HEAD; ln -s $VICTIM $T/logs/HEAD
rmdir $T/objects/pack; ln -s $OTHER/objects/pack $T/objects/pack
mkdir -p $T/objects/$OBJDIR; rm -f $T/objects/$OBJDIR/$OBJFILE; cp ` + ws + `/evil.obj $T/objects/$OBJDIR/$OBJFILE
echo $EVIL > $T/refs/heads/main`
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("control plant: %v\n%s", err, out)
	}
}

// writeSide is what the daemon's write-side git did to what it must not
// touch.
type writeSide struct {
	victimWritten bool   // a reflog line landed in the daemon user's file
	objectChanged bool   // main's README reads as the agent wrote it
	mainMoved     bool   // main is not where the user left it
	otherTaken    bool   // the other repository's object is in this one, or its pack is gone
	failed        string // the commands' failures, for the log
}

func (w writeSide) corrupted() bool {
	return w.victimWritten || w.objectChanged || w.mainMoved || w.otherTaken
}

// hostWriteSide runs the daemon's write-side git in the main worktree as
// the deployment user, then reads what it must not have changed.
func (l *plantLab) hostWriteSide(t *testing.T) writeSide {
	t.Helper()
	repo := filepath.Dir(l.common)
	bare := filepath.Join(l.host, "srv/paseo/repos/pushed.git")
	victim := readFileT(t, l.victim)
	var failed []string
	for _, args := range [][]string{
		{"init", "-q", "--bare", bare},
		{"-C", repo, "checkout", "-q", "-b", "review"},
		{"-C", repo, "commit", "-q", "--allow-empty", "-m", "daemon"},
		{"-C", repo, "merge", "-q", "--no-edit", "feature"},
		{"-C", repo, "gc", "-q"},
		{"-C", repo, "push", "-q", bare, "review"},
		{"-C", repo, "checkout", "-q", "main"},
	} {
		if out, err := deployGit(append([]string{"-c", "user.name=d", "-c", "user.email=d@example.test"}, args...)...); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v %s", args[len(args)-2], err, out))
		}
	}
	w := writeSide{victimWritten: readFileT(t, l.victim) != victim, failed: strings.Join(failed, "; ")}
	if got, _ := deployGit("--git-dir="+l.common, "cat-file", "blob", l.readme); got != "proj\n" {
		w.objectChanged = true
	}
	if got, _ := deployGit("--git-dir="+l.common, "rev-parse", "refs/heads/main"); strings.TrimSpace(got) != l.main {
		w.mainMoved = true
	}
	packs, _ := filepath.Glob(filepath.Join(l.other, ".git/objects/pack/*.pack"))
	if _, err := deployGit("--git-dir="+filepath.Join(l.common, "..", "..", "other", ".git"), "cat-file", "-e", l.secret); err != nil || len(packs) == 0 {
		w.otherTaken = true
	}
	if _, err := deployGit("--git-dir="+l.common, "cat-file", "-e", l.secret); err == nil {
		w.otherTaken = true
	}
	return w
}

func (l *plantLab) git(t *testing.T, gitDir string, args ...string) string {
	t.Helper()
	if gitDir != "" {
		args = append([]string{"--git-dir=" + gitDir}, args...)
	}
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test"}, args...)...)
	cmd.Env = hostGitEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// deployGit runs git as the deployment user, as the daemon does.
func deployGit(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Env = hostGitEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func hostGitEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
}

// openUp lets uid 1000 reach dir through the test's temporary
// directories, which testing makes 0700 for root.
func openUp(t *testing.T, dir string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for d := dir; strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
			t.Fatal(err)
		}
	}
}
