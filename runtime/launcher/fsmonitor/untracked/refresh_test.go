package untracked

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
)

var (
	// refreshFiles are the touched repo's tracked files.
	refreshFiles = []string{"d/f00.go", "d/f01.go", "d/sub/f04.go", "d/sub/f05.go", "e/f10.go", "e/f11.go", "d/cc.go", "e/racy.go", "top.txt"}
	// touched have the same bytes and a new mtime before the token (one
	// rewritten in place, one made anew as `git reset --hard` does, one
	// whose mtime alone moved): git refreshes them, Splice takes them.
	touched = []string{"d/f01.go", "d/sub/f05.go", "e/f10.go"}
)

const (
	// contentChanged has other bytes of the same size, its mtime put back
	// to the nanosecond, before the token: git finds another object.
	contentChanged = "d/cc.go"
	// racyTouched has the same bytes and an mtime in the token's second:
	// git refreshes it, Splice does not take it.
	racyTouched = "e/racy.go"
)

// committed is a worktree of files committed, its index written again a
// second later so that no entry is racily clean in it (the vouch would
// not vouch for one).
func committed(t testing.TB, files []string) string {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, ws, nil, "init", "-q")
	for _, f := range files {
		write(t, filepath.Join(ws, f), "package x // "+f+"\n")
	}
	git(t, ws, nil, "add", "-A")
	git(t, ws, nil, "commit", "-qm", "one")
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	git(t, ws, nil, "update-index", "--really-refresh")
	return ws
}

// newTouchedRepo is a committed worktree whose touched, contentChanged
// and racyTouched files changed before the token, watched and vouched.
func newTouchedRepo(t testing.TB) *repo {
	t.Helper()
	ws := committed(t, refreshFiles)
	p := func(f string) string { return filepath.Join(ws, f) }
	same := func(f string) string { return "package x // " + f + "\n" }
	write(t, p(touched[0]), same(touched[0]))
	os.Remove(p(touched[1]))
	write(t, p(touched[1]), same(touched[1]))
	later := time.Now().Add(-10 * time.Second)
	if err := os.Chtimes(p(touched[2]), later, later); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p(contentChanged))
	if err != nil {
		t.Fatal(err)
	}
	write(t, p(contentChanged), strings.ToUpper(same(contentChanged)))
	if err := os.Chtimes(p(contentChanged), fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	// Into a second of their own, the token's: racyTouched is stamped
	// in it, just before the token is taken.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1150 * time.Millisecond)))
	sec := time.Now().Truncate(time.Second)
	racy := sec.Add(999 * time.Millisecond)
	if err := os.Chtimes(p(racyTouched), racy, racy); err != nil {
		t.Fatal(err)
	}
	r := watched(t, ws)
	if !r.tokenTime.Truncate(time.Second).Equal(sec) || r.tokenTime.Sub(sec) < ClockSlack {
		t.Fatalf("the token was taken at %v, not in %v past the clock's slack: the machine stalled the test", r.tokenTime, sec)
	}
	return r
}

// fullWith is a full scan (the seed's index, no monitor, no cache) with
// the stat check's settings check.
func (r *repo) fullWith(t *testing.T, check []string) string {
	t.Helper()
	pre := append([]string{"--git-dir=" + r.install(t, nil), "--work-tree=" + r.ws, "-c", "core.untrackedCache=false", "-c", "core.fsmonitor=false"}, check...)
	return git(t, r.ws, nil, append(pre, "status", "--porcelain")...)
}

// valid is ls-files -f's answer through the watcher's hook: the entries
// git holds as fsmonitor-valid.
func (r *repo) valid(t *testing.T, index []byte) []string {
	t.Helper()
	var out []string
	ls := git(t, r.ws, nil, "--git-dir="+r.install(t, index), "--work-tree="+r.ws, "-c", "core.fsmonitor="+r.hook, "ls-files", "-f")
	for _, l := range strings.Split(strings.TrimSpace(ls), "\n") {
		if tag, name, ok := strings.Cut(l, " "); ok && tag == strings.ToLower(tag) {
			out = append(out, name)
		}
	}
	return out
}

// setFSMN is index with entry name's fsmonitor bit set to dirty.
func setFSMN(t *testing.T, index []byte, name string, dirty bool) []byte {
	t.Helper()
	ix, err := gitindex.Read(index)
	if err != nil {
		t.Fatal(err)
	}
	fm, err := gitindex.ReadFSMonitor(index, ix)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ix.Entries, func(e gitindex.Entry) bool { return e.Name == name })
	fm.Dirty[i] = dirty
	out := slices.Clone(index[:ix.EntriesEnd])
	for _, x := range ix.Extensions {
		if x.Sig == "FSMN" {
			out = gitindex.AppendFSMonitor(out, fm.Token, fm.Dirty)
		} else {
			out = append(out, index[x.Off:x.Off+8+x.Size]...)
		}
	}
	sum := sha1.Sum(out)
	return append(out, sum[:]...)
}

// Files rewritten with the same bytes before the token are taken: git
// holds them fsmonitor-valid, the first status does not lstat or hash
// them (trace2's refresh counts, against the cache alone) and equals a
// full scan's; a file whose content changed is not taken and shows
// modified, one in the token's second is not taken; a change after the
// token to a taken file is named by the monitor and seen. Control: the
// content-changed entry marked valid is missed.
func TestRefreshedEntriesAreValidAndRight(t *testing.T) {
	r := newTouchedRepo(t)
	spliced := r.hostBuild(t)
	sp := r.spliced
	if sp.Refreshed != len(touched) || sp.Skipped != 1 {
		t.Fatalf("refreshed %d, skipped %d: want %d and 1 (%s)", sp.Refreshed, sp.Skipped, len(touched), racyTouched)
	}
	if again, err := Splice(r.vouched, r.built, r.ws, Racy(r.tokenTime, r.written)); err != nil || !bytes.Equal(again.Index, spliced) {
		t.Fatalf("the same inputs spliced again differ (%v)", err)
	}
	// Before: the vouch vouched for none of the changed entries.
	vouchedValid := r.valid(t, r.vouched)
	for _, f := range append([]string{contentChanged, racyTouched}, touched...) {
		if slices.Contains(vouchedValid, f) {
			t.Fatalf("the vouch vouched for %s: the fixture changes nothing", f)
		}
	}
	var want []string
	for _, f := range refreshFiles {
		if f != contentChanged && f != racyTouched {
			want = append(want, f)
		}
	}
	slices.Sort(want)
	if got := r.valid(t, spliced); !slices.Equal(got, want) {
		t.Fatalf("fsmonitor-valid %q, want %q", got, want)
	}

	full := r.full(t)
	if !strings.Contains(full, " M "+contentChanged+"\n") || strings.Contains(full, touched[0]) {
		t.Fatalf("the full scan is not the fixture's:\n%s", full)
	}
	got, n := r.statusWith(t, r.install(t, spliced), r.hook, gitCheck)
	if got != full {
		t.Errorf("status from the spliced index:\n%s\nfull scan:\n%s", got, full)
	}
	if got, _ := r.statusWith(t, r.install(t, spliced), r.hook, sandboxCheck); got != r.fullWith(t, sandboxCheck) {
		t.Errorf("status from the spliced index with the sandbox's check:\n%s\nfull scan:\n%s", got, r.fullWith(t, sandboxCheck))
	}
	// The cache alone (no refreshed entry taken) lstats and hashes them.
	alone, err := Splice(r.vouched, r.built, r.ws, time.Time{})
	if err != nil || alone.Refreshed != 0 || alone.RefreshReason == "" {
		t.Fatalf("the cache alone: %v %+v", err, alone)
	}
	got0, n0 := r.statusWith(t, r.install(t, alone.Index), r.hook, gitCheck)
	if got0 != full {
		t.Errorf("status from the cache alone:\n%s", got0)
	}
	lstat, scan := n["index/refresh/sum_lstat"], n["index/refresh/sum_scan"]
	lstat0, scan0 := n0["index/refresh/sum_lstat"], n0["index/refresh/sum_scan"]
	t.Logf("refresh: %d lstat, %d hashed from the spliced index; %d and %d from the cache alone", lstat, scan, lstat0, scan0)
	if scan0 < len(touched) || lstat0-lstat != len(touched) || scan0-scan != len(touched) {
		t.Errorf("the touched files were lstat'ed or hashed: %d lstat and %d scans from the spliced index, %d and %d from the cache alone", lstat, scan, lstat0, scan0)
	}

	// Control: the content-changed entry taken is missed.
	bad := setFSMN(t, spliced, contentChanged, false)
	if got, _ := r.statusWith(t, r.install(t, bad), r.hook, gitCheck); strings.Contains(got, contentChanged) {
		t.Errorf("an index that marks %s valid still shows it: the test cannot fail\n%s", contentChanged, got)
	}

	// After the token: a taken file edited (the same size, stamped now).
	write(t, filepath.Join(r.ws, touched[0]), strings.ToUpper("package x // "+touched[0]+"\n"))
	full = r.full(t)
	if !strings.Contains(full, " M "+touched[0]+"\n") {
		t.Fatalf("the full scan does not show %s:\n%s", touched[0], full)
	}
	if got, _ := r.statusWith(t, r.install(t, spliced), r.hook, sandboxCheck); got != r.fullWith(t, sandboxCheck) || !strings.Contains(got, touched[0]) {
		t.Errorf("after an edit to %s, status from the spliced index:\n%s\nfull scan:\n%s", touched[0], got, r.fullWith(t, sandboxCheck))
	}
	if got, _ := r.statusWith(t, r.install(t, spliced), r.hook, gitCheck); got != full {
		t.Errorf("after an edit to %s, status from the spliced index (Git's check):\n%s\nfull scan:\n%s", touched[0], got, full)
	}
}

// An entry git refreshed with an mtime in the token's second is not
// taken: an edit after the token in that second, the same size, would
// otherwise compare equal under the sandbox's check (mtime seconds and
// size) once the monitor names it. Control: with Git's own racy rule
// alone (the written index's mtime) it is taken and the edit is missed.
func TestRefreshedInTheTokensSecondIsNotTaken(t *testing.T) {
	ws := committed(t, []string{"f.go", "g.go"})
	// The token's second, simulated: S, with the pre-token touch at
	// S+0.3 s, the token at S+0.5 s and the edit at S+0.7 s.
	s := time.Now().Truncate(time.Second).Add(-20 * time.Second)
	f := filepath.Join(ws, "f.go")
	if err := os.Chtimes(f, s.Add(300*time.Millisecond), s.Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	r := watched(t, ws)
	built := r.hostBuilt(t)
	write(t, f, strings.ToUpper("package x // f.go\n"))
	if err := os.Chtimes(f, s.Add(700*time.Millisecond), s.Add(700*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	full := r.fullWith(t, sandboxCheck)
	if !strings.Contains(full, " M f.go\n") {
		t.Fatalf("the full scan does not show f.go:\n%s", full)
	}

	sp, err := Splice(r.vouched, built, r.ws, Racy(s.Add(500*time.Millisecond), r.written))
	if err != nil || sp.Refreshed != 0 || sp.Skipped != 1 {
		t.Fatalf("refreshed %d, skipped %d (%v): want f.go skipped", sp.Refreshed, sp.Skipped, err)
	}
	if got, _ := r.statusWith(t, r.install(t, sp.Index), r.hook, sandboxCheck); got != full {
		t.Errorf("status from the spliced index:\n%s\nfull scan:\n%s", got, full)
	}

	// Control: Git's rule alone.
	sp, err = Splice(r.vouched, built, r.ws, r.written)
	if err != nil || sp.Refreshed != 1 {
		t.Fatalf("control: refreshed %d (%v)", sp.Refreshed, err)
	}
	if got, _ := r.statusWith(t, r.install(t, sp.Index), r.hook, sandboxCheck); strings.Contains(got, "f.go") {
		t.Errorf("control: an entry taken in the token's second still showed the edit: the test cannot fail\n%s", got)
	}
}

// patchEntry is index with entry name's bytes at off (from the entry's
// start) set to b, its SHA-1 checksum recomputed.
func patchEntry(t *testing.T, index []byte, name string, off int, b []byte) []byte {
	t.Helper()
	ix, err := gitindex.Read(index)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ix.Entries, func(e gitindex.Entry) bool { return e.Name == name })
	out := slices.Clone(index[:len(index)-20])
	copy(out[ix.Entries[i].Off+off:], b)
	sum := sha1.Sum(out)
	return append(out, sum[:]...)
}

// What git's index shows that is not a refresh: a size set to 0 (Git's
// smudge of a racily clean entry) is skipped; an entry whose object or
// mode is not the vouched one takes none, and the cache is spliced alone,
// as before.
func TestSpliceRefreshRefusals(t *testing.T) {
	r := newTouchedRepo(t)
	built := r.hostBuilt(t)
	racy := Racy(r.tokenTime, r.written)
	smudged := patchEntry(t, built, touched[0], 36, []byte{0, 0, 0, 0})
	sp, err := Splice(r.vouched, smudged, r.ws, racy)
	if err != nil || sp.Refreshed != len(touched)-1 || sp.Skipped != 2 {
		t.Fatalf("a smudged entry: refreshed %d, skipped %d (%v)", sp.Refreshed, sp.Skipped, err)
	}
	if slices.Contains(r.valid(t, sp.Index), touched[0]) {
		t.Fatal("a smudged entry was taken")
	}
	// The cache alone: the vouched index's bytes and the cache.
	bx, _ := gitindex.Read(built)
	var untr []byte
	for _, x := range bx.Extensions {
		if x.Sig == "UNTR" {
			untr = built[x.Off : x.Off+8+x.Size]
		}
	}
	alone := append(slices.Clone(r.vouched[:len(r.vouched)-20]), untr...)
	sum := sha1.Sum(alone)
	alone = append(alone, sum[:]...)
	for name, b := range map[string][]byte{
		"another object": patchEntry(t, built, "top.txt", gitindex.StatBytes, bytes.Repeat([]byte{0xab}, 20)),
		"another mode":   patchEntry(t, built, touched[1], 24, binary.BigEndian.AppendUint32(nil, 0o100755)),
		"assume-valid":   patchEntry(t, built, touched[2], gitindex.StatBytes+20, []byte{0x80}),
	} {
		sp, err := Splice(r.vouched, b, r.ws, racy)
		if err != nil || sp.Refreshed != 0 || sp.RefreshReason == "" || !bytes.Equal(sp.Index, alone) {
			t.Errorf("%s: refreshed %d, reason %q (%v), the cache alone: %v", name, sp.Refreshed, sp.RefreshReason, err, bytes.Equal(sp.Index, alone))
		}
	}
}

// The image's git in the search jail, with the sandbox's stat check,
// refreshes the touched entries and Splice takes them; a RefreshOff keeps
// them out and the cache in.
func TestBuildInTheJailRefreshes(t *testing.T) {
	skip.UnlessRoot(t, "it builds the search jail (user, mount, pid namespaces as the agent's uid)")
	if err := nativesearch.Probe(); err != nil {
		t.Fatal(err)
	}
	usr := filepath.Join(testbundle.Repo(t, ".image"), "rootfs", "usr")
	r := newTouchedRepo(t)
	j := nativesearch.Jail{Workspace: r.ws, Dest: r.ws, Usr: usr, UID: 1000, GID: 1000, Limits: nativesearch.DefaultLimits}
	o := Options{Jail: j, Parent: t.TempDir(), Exclude: r.exclude(t), GitConfig: []string{"GIT_CONFIG_COUNT=2", "GIT_CONFIG_KEY_0=core.checkStat", "GIT_CONFIG_VALUE_0=minimal",
		"GIT_CONFIG_KEY_1=core.trustctime", "GIT_CONFIG_VALUE_1=false"}}
	sp, err := Build(context.Background(), o, r.vouched, r.tokenTime)
	if err != nil {
		t.Fatal(err)
	}
	if sp.Refreshed != len(touched) || sp.Skipped != 1 || sp.RefreshReason != "" {
		t.Fatalf("refreshed %d, skipped %d (%q): want %d and 1", sp.Refreshed, sp.Skipped, sp.RefreshReason, len(touched))
	}
	valid := r.valid(t, sp.Index)
	for _, f := range touched {
		if !slices.Contains(valid, f) {
			t.Errorf("%s is not valid: %q", f, valid)
		}
	}
	// Hashed: the two entries not taken (contentChanged, racyTouched).
	got, n := r.statusWith(t, r.install(t, sp.Index), r.hook, gitCheck)
	if got != r.full(t) || n["index/refresh/sum_scan"] != 2 {
		t.Errorf("status from the jail's index (%v):\n%s\nfull scan:\n%s", n, got, r.full(t))
	}
	o.RefreshOff = "the store says so"
	sp, err = Build(context.Background(), o, r.vouched, r.tokenTime)
	if err != nil || sp.Refreshed != 0 || sp.RefreshReason != o.RefreshOff {
		t.Fatalf("with RefreshOff: refreshed %d, reason %q (%v)", sp.Refreshed, sp.RefreshReason, err)
	}
	// Git invalidates the cached directory of every entry not valid
	// (fsmonitor_ewah_callback): the touched entries' directories are
	// read again too.
	got0, n0 := r.statusWith(t, r.install(t, sp.Index), r.hook, gitCheck)
	if got0 != r.full(t) || n0["index/refresh/sum_scan"] != 2+len(touched) || n0["opendir"] <= n["opendir"] {
		t.Errorf("status from the cache alone (%v, with the refreshed entries %v):\n%s", n0, n, got0)
	}
	t.Logf("directories opened: %d with the refreshed entries, %d without", n["opendir"], n0["opendir"])
}
