package gitplant

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Issue 30's write-side surfaces. Issue 19 shared the repository's
// objects/, refs/ and logs/ read-write with the sandbox; host git writes
// into and trusts all three. WriteLab is a real repository with a linked
// worktree at the reference workspace (testdata/base), another
// repository, a file of the deployment user's (a login script), and the
// agent's Git store as the start script seeds it; WriteScript plants from
// inside a sandbox (busybox only) into the repository and into the store;
// HostWriteSide runs the daemon's write-side git as the deployment user
// and reads what it must not have changed.

// WriteSurfaces are the plants whose effect HostWriteSide reads, each
// with the effect that counts as the plant's win.
var WriteSurfaces = []struct{ Name, Effect string }{
	{"reflog-symlink", "a reflog line written through logs/HEAD into the deployment user's login script"},
	{"pack-symlink", "objects/pack led to another repository's packs: its objects taken into this one, or its pack gone"},
	{"object-overwrite", "main's README reads as the agent wrote it, under its old id"},
	{"ref-move", "main is not where the user left it"},
	{"replace-ref", "refs/replace/<main> names the agent's commit: git shows it for main's id"},
	{"object-delete", "an object of main's tree is gone from the repository"},
}

// WriteScript plants each surface (and grafts, whose effect is not read)
// in the repository ($REPO from plant.env in the workspace) and in the
// agent's store (/run/paseo/git-store), printing label=ok or the error.
const WriteScript = `b=/bin/busybox
W=$PASEO_AGENT_CWD
. $W/plant.env
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
plant() {
  p=$1; T=$2
  try $p-reflog-symlink $b sh -c "$b rm -f $T/logs/HEAD; $b ln -s $VICTIM $T/logs/HEAD"
  try $p-pack-symlink $b sh -c "$b rm -rf $T/objects/pack; $b ln -s $OTHER/objects/pack $T/objects/pack"
  try $p-object-overwrite $b sh -c "$b mkdir -p $T/objects/$OBJDIR && $b rm -f $T/objects/$OBJDIR/$OBJFILE; $b cp $W/evil.obj $T/objects/$OBJDIR/$OBJFILE"
  try $p-ref-move $b sh -c "echo $EVIL > $T/refs/heads/main"
  try $p-replace-ref $b sh -c "$b mkdir -p $T/refs/replace && echo $EVIL > $T/refs/replace/$MAIN"
  try $p-object-delete $b rm -f $T/objects/$DELDIR/$DELFILE
  try $p-grafts $b sh -c "$b mkdir -p $T/info && echo $MAIN > $T/info/grafts"
}
plant repo $REPO
plant store /run/paseo/git-store
`

// WriteLab is the host side of the write-side plants.
type WriteLab struct {
	Host, Common, Store, Other, Victim string
	// Main is main's commit (and the worktree branch feature's), Evil a
	// commit the agent moves main to, Readme main's README blob, License
	// another blob of main's, Secret the other repository's commit.
	Main, Evil, Readme, License, Secret string
	uid                                 int
}

// NewWriteLab replaces the base tree's hand-made repository beneath host
// with real ones, owned by uid.
func NewWriteLab(t testing.TB, host string, uid int) *WriteLab {
	t.Helper()
	l := &WriteLab{Host: host, Common: filepath.Join(host, "srv/paseo/repos/proj/.git"), Store: filepath.Join(host, "srv/paseo/state/pi-git/agent-7f3c"),
		Other: filepath.Join(host, "srv/paseo/repos/other"), Victim: filepath.Join(host, "home/deploy/.profile"), uid: uid}
	repo, ws := filepath.Dir(l.Common), filepath.Join(host, "srv/paseo/workspace/proj-feature")
	for _, p := range []string{repo, ws, l.Store} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{repo, filepath.Dir(ws), filepath.Join(l.Store, "objects/info"), filepath.Join(l.Store, "logs"), filepath.Dir(l.Victim)} {
		mkdirAll(t, p)
	}
	writeFile(t, l.Victim, "# the deployment user's login script\n")
	l.git(t, "", "init", "-q", "-b", "main", repo)
	writeFile(t, filepath.Join(repo, "README"), "proj\n")
	writeFile(t, filepath.Join(repo, "LICENSE"), "the user's license\n")
	l.git(t, l.Common, "--work-tree="+repo, "add", "README", "LICENSE")
	l.git(t, l.Common, "--work-tree="+repo, "commit", "-q", "-m", "init")
	l.Main = l.git(t, l.Common, "rev-parse", "HEAD")
	l.Readme = l.git(t, l.Common, "rev-parse", "HEAD:README")
	l.License = l.git(t, l.Common, "rev-parse", "HEAD:LICENSE")
	l.git(t, "", "-C", repo, "worktree", "add", "-q", "-b", "feature", ws)
	l.Evil = l.git(t, l.Common, "commit-tree", "-m", "evil", l.git(t, l.Common, "rev-parse", "HEAD^{tree}"))
	l.git(t, "", "init", "-q", "-b", "main", l.Other)
	writeFile(t, filepath.Join(l.Other, "secret"), "other repository\n")
	l.git(t, "", "-C", l.Other, "add", "secret")
	l.git(t, "", "-C", l.Other, "commit", "-q", "-m", "secret")
	l.git(t, "", "-C", l.Other, "gc", "-q")
	l.Secret = l.git(t, "", "-C", l.Other, "rev-parse", "HEAD")
	// The store as the start script leaves it at a first launch.
	if out, err := exec.Command("cp", "-R", filepath.Join(l.Common, "refs"), filepath.Join(l.Store, "refs")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	writeFile(t, filepath.Join(l.Store, "objects/info/alternates"), filepath.Join(l.Common, "objects")+"\n")
	var evil bytes.Buffer
	zw := zlib.NewWriter(&evil)
	fmt.Fprintf(zw, "blob 5\x00evil\n")
	zw.Close()
	writeFile(t, filepath.Join(ws, "evil.obj"), evil.String())
	writeFile(t, filepath.Join(ws, "plant.env"), fmt.Sprintf("REPO=%s\nVICTIM=%s\nOTHER=%s\nOBJDIR=%s\nOBJFILE=%s\nEVIL=%s\nMAIN=%s\nDELDIR=%s\nDELFILE=%s\n",
		l.Common, l.Victim, l.Other+"/.git", l.Readme[:2], l.Readme[2:], l.Evil, l.Main, l.License[:2], l.License[2:]))
	for _, p := range []string{filepath.Join(host, "srv/paseo/repos"), ws, l.Store, filepath.Dir(l.Victim)} {
		chownAll(t, p, uid)
	}
	openUp(t, host)
	return l
}

// hostPlants are the control's plants, one surface each, made in the
// repository ($T) on the host.
var hostPlants = map[string]string{
	"reflog-symlink":   `rm -f $T/logs/HEAD; ln -s $VICTIM $T/logs/HEAD`,
	"pack-symlink":     `rmdir $T/objects/pack; ln -s $OTHER/objects/pack $T/objects/pack`,
	"object-overwrite": `mkdir -p $T/objects/$OBJDIR; rm -f $T/objects/$OBJDIR/$OBJFILE; cp $W/evil.obj $T/objects/$OBJDIR/$OBJFILE`,
	"ref-move":         `echo $EVIL > $T/refs/heads/main`,
	"replace-ref":      `mkdir -p $T/refs/replace; echo $EVIL > $T/refs/replace/$MAIN`,
	"object-delete":    `rm -f $T/objects/$DELDIR/$DELFILE`,
}

// PlantOnHost is the control for one surface: its plant made in the
// repository as the deployment user, as issue 19's read-write objects/,
// refs/ and logs/ let a sandbox make it.
func (l *WriteLab) PlantOnHost(t testing.TB, surface string) {
	t.Helper()
	ws := filepath.Join(l.Host, "srv/paseo/workspace/proj-feature")
	cmd := exec.Command("sh", "-c", `set -e; W=`+ws+`; . $W/plant.env; T=$REPO; `+hostPlants[surface])
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred()}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("control plant %s: %v\n%s", surface, err, out)
	}
}

// WriteSide is what the daemon's write-side git did to what it must not
// touch, by surface name (WriteSurfaces), and the commands' failures.
type WriteSide struct {
	Won    map[string]bool `json:"won"`
	Failed string          `json:"failed,omitempty"`
}

// Corrupted reports whether any surface won.
func (w WriteSide) Corrupted() bool {
	for _, v := range w.Won {
		if v {
			return true
		}
	}
	return false
}

// HostWriteSide runs the daemon's write-side git in the main worktree as
// the deployment user (checkout, commit, merge of the agent's branch, gc,
// a push to a local bare repository, checkout back), then reads what the
// plants would have changed.
func (l *WriteLab) HostWriteSide(t testing.TB) WriteSide {
	t.Helper()
	repo := filepath.Dir(l.Common)
	bare := filepath.Join(l.Host, "srv/paseo/repos/pushed.git")
	victim, err := os.ReadFile(l.Victim)
	if err != nil {
		t.Fatal(err)
	}
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
		if out, err := l.deployGit(append([]string{"-c", "user.name=d", "-c", "user.email=d@example.test"}, args...)...); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v %s", strings.Join(args, " "), err, out))
		}
	}
	w := WriteSide{Won: map[string]bool{}, Failed: strings.Join(failed, "; ")}
	now, _ := os.ReadFile(l.Victim)
	w.Won["reflog-symlink"] = !bytes.Equal(now, victim)
	got, _ := l.deployGit("--git-dir="+l.Common, "cat-file", "blob", l.Readme)
	w.Won["object-overwrite"] = got != "proj\n"
	got, _ = l.deployGit("--git-dir="+l.Common, "rev-parse", "refs/heads/main")
	w.Won["ref-move"] = strings.TrimSpace(got) != l.Main
	packs, _ := filepath.Glob(filepath.Join(l.Other, ".git/objects/pack/*.pack"))
	_, otherErr := l.deployGit("--git-dir="+filepath.Join(l.Other, ".git"), "cat-file", "-e", l.Secret)
	_, takenErr := l.deployGit("--git-dir="+l.Common, "cat-file", "-e", l.Secret)
	w.Won["pack-symlink"] = otherErr != nil || len(packs) == 0 || takenErr == nil
	// As the daemon's git reads it by default: replace objects on.
	got, _ = l.deployGit("--git-dir="+l.Common, "log", "-1", "--format=%s", l.Main)
	w.Won["replace-ref"] = strings.TrimSpace(got) == "evil"
	_, err = l.deployGit("--git-dir="+l.Common, "--no-replace-objects", "cat-file", "-e", l.License)
	w.Won["object-delete"] = err != nil
	return w
}

func (l *WriteLab) cred() *syscall.Credential {
	return &syscall.Credential{Uid: uint32(l.uid), Gid: uint32(l.uid), Groups: []uint32{}}
}

func (l *WriteLab) git(t testing.TB, gitDir string, args ...string) string {
	t.Helper()
	if gitDir != "" {
		args = append([]string{"--git-dir=" + gitDir}, args...)
	}
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test"}, args...)...)
	cmd.Env = writeLabEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// deployGit runs git as the deployment user, as the daemon does.
func (l *WriteLab) deployGit(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Env = writeLabEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func writeLabEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
}

func chownAll(t testing.TB, dir string, uid int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// openUp lets the deployment user reach dir through the test's temporary
// directories, which testing makes 0700 for root.
func openUp(t testing.TB, dir string) {
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
