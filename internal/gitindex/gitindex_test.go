package gitindex

import (
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

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

// lsGitlinks is git's own answer: the stage entries of mode 160000.
func lsGitlinks(t *testing.T, dir string) []Gitlink {
	var out []Gitlink
	for _, rec := range strings.Split(git(t, dir, "ls-files", "-s", "-z"), "\x00") {
		meta, p, ok := strings.Cut(rec, "\t")
		if !ok || !strings.HasPrefix(meta, "160000 ") {
			continue
		}
		f := strings.Fields(meta)
		out = append(out, Gitlink{Path: p, Stage: int(f[2][0] - '0')})
	}
	return out
}

// Real indexes of every version and both object formats, with gitlinks
// among files, an intent-to-add entry (extended flags) and long paths.
func TestGitlinksMatchGit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		init    []string
		version string
	}{
		{"v2", nil, "2"},
		{"v3", nil, "3"},
		{"v4", nil, "4"},
		{"sha256-v2", []string{"--object-format=sha256"}, "2"},
		{"sha256-v4", []string{"--object-format=sha256"}, "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			git(t, dir, append([]string{"init", "-q"}, tc.init...)...)
			long := strings.Repeat("d", 200) + "/" + strings.Repeat("e", 120)
			for _, f := range []string{"a.txt", "vendor/lib/x.go", long, "zz"} {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
				os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644)
			}
			git(t, dir, "add", "a.txt", "vendor", long)
			git(t, dir, "add", "-N", "zz")
			id := strings.TrimSpace(git(t, dir, "hash-object", "-w", "a.txt"))
			for _, p := range []string{"sub/one", "vendor/lib/two", "zzz/" + strings.Repeat("x", 300)} {
				git(t, dir, "update-index", "--add", "--cacheinfo", "160000,"+id+","+p)
			}
			git(t, dir, "update-index", "--index-version", tc.version)
			data, err := os.ReadFile(filepath.Join(dir, ".git", "index"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Gitlinks(data)
			if err != nil {
				t.Fatal(err)
			}
			if want := lsGitlinks(t, dir); !slices.Equal(got, want) || len(want) != 3 {
				t.Fatalf("gitlinks %v, git says %v", got, want)
			}
		})
	}
}

// A split index and damaged bytes are refused, never read as "no gitlinks".
func TestRefusals(t *testing.T) {
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	os.WriteFile(filepath.Join(dir, "f"), []byte("f"), 0o644)
	id := strings.TrimSpace(git(t, dir, "hash-object", "-w", "f"))
	git(t, dir, "update-index", "--add", "--cacheinfo", "160000,"+id+",sub")
	index := filepath.Join(dir, ".git", "index")
	data, _ := os.ReadFile(index)
	if links, err := Gitlinks(data); err != nil || len(links) != 1 {
		t.Fatalf("plain index: %v %v", links, err)
	}
	for i := range data[:len(data)-20] {
		bad := slices.Clone(data)
		bad[i] ^= 0x40
		if _, err := Gitlinks(bad); err == nil {
			t.Fatalf("flipping byte %d still parsed", i)
		}
	}
	if _, err := Gitlinks(data[:len(data)-1]); err == nil {
		t.Fatal("a truncated index parsed")
	}
	git(t, dir, "update-index", "--split-index")
	data, _ = os.ReadFile(index)
	if _, err := Gitlinks(data); err == nil || !strings.Contains(err.Error(), "split index") {
		t.Fatalf("split index: %v", err)
	}
}

// The fuzzer's bytes get a valid SHA-1 checksum appended, so that it
// reaches the entry and extension parser rather than the checksum check.
func FuzzGitlinks(f *testing.F) {
	f.Add([]byte("DIRC\x00\x00\x00\x02\x00\x00\x00\x00"))
	f.Add([]byte("DIRC\x00\x00\x00\x04\x00\x00\x00\x01" + strings.Repeat("\x00", 24) + "\x00\x00\xe0\x00" + strings.Repeat("\x00", 32) + "\x00\x03\x00sub\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		sum := sha1.Sum(body)
		links, err := Gitlinks(append(body[:len(body):len(body)], sum[:]...))
		if err != nil {
			return
		}
		for _, l := range links {
			if !clean(l.Path) || l.Stage < 0 || l.Stage > 3 {
				t.Fatalf("accepted %+v", l)
			}
		}
	})
}

// Every entry's stat data, mode, stage and flags are what git itself reads
// from the same index (ls-files --debug, -s and -v), in every version and
// both object formats, with skip-worktree, assume-unchanged and
// intent-to-add entries among plain ones.
func TestEntriesMatchGit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		init    []string
		version string
	}{
		{"v3", nil, "3"},
		{"v4", nil, "4"},
		{"sha256-v3", []string{"--object-format=sha256"}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			git(t, dir, append([]string{"init", "-q"}, tc.init...)...)
			for _, f := range []string{"a.txt", "b/c.sh", "b/d", "e", "itoa"} {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
				os.WriteFile(filepath.Join(dir, f), []byte(f+"\n"), 0o644)
			}
			os.Chmod(filepath.Join(dir, "b/c.sh"), 0o755)
			git(t, dir, "add", "a.txt", "b", "e")
			git(t, dir, "add", "-N", "itoa")
			git(t, dir, "update-index", "--skip-worktree", "b/d")
			git(t, dir, "update-index", "--assume-unchanged", "e")
			git(t, dir, "update-index", "--index-version", tc.version)
			data, err := os.ReadFile(filepath.Join(dir, ".git", "index"))
			if err != nil {
				t.Fatal(err)
			}
			ix, err := Read(data)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range ix.Entries {
				s := e.Stat
				// Off is where the entry's bytes are: its stat data there
				// is what was parsed, its object name follows.
				if e.Off < 12 || e.Off+StatBytes+len(e.OID) > ix.EntriesEnd ||
					binary.BigEndian.Uint32(data[e.Off+8:]) != s.MtimeSec || binary.BigEndian.Uint32(data[e.Off+36:]) != s.Size ||
					string(data[e.Off+StatBytes:e.Off+StatBytes+len(e.OID)]) != e.OID {
					t.Errorf("%s: offset %d is not the entry's", e.Name, e.Off)
				}
				got = append(got, fmt.Sprintf("%s %o %x %d %v %v %v|%d:%d %d:%d %d %d %d %d %d",
					e.Name, e.Mode, e.OID, e.Stage, e.AssumeValid, e.SkipWorktree, e.IntentToAdd,
					s.CtimeSec, s.CtimeNsec, s.MtimeSec, s.MtimeNsec, s.Dev, s.Ino, s.UID, s.GID, s.Size))
			}
			// git's own reading of the same bytes.
			var want []string
			debug := strings.Split(git(t, dir, "ls-files", "--debug"), "\n")
			stage := strings.Split(strings.TrimSpace(git(t, dir, "ls-files", "-s")), "\n")
			tags := strings.Split(strings.TrimSpace(git(t, dir, "ls-files", "-v", "-t")), "\n")
			for i := 0; i+5 < len(debug); i += 6 {
				name := debug[i]
				var cs, cn, ms, mn, dev, ino, uid, gid, size, flags uint64
				fmt.Sscanf(strings.TrimSpace(debug[i+1]), "ctime: %d:%d", &cs, &cn)
				fmt.Sscanf(strings.TrimSpace(debug[i+2]), "mtime: %d:%d", &ms, &mn)
				fmt.Sscanf(strings.TrimSpace(debug[i+3]), "dev: %d\tino: %d", &dev, &ino)
				fmt.Sscanf(strings.TrimSpace(debug[i+4]), "uid: %d\tgid: %d", &uid, &gid)
				fmt.Sscanf(strings.TrimSpace(debug[i+5]), "size: %d\tflags: %x", &size, &flags)
				f := strings.Fields(stage[i/6])
				var mode uint64
				fmt.Sscanf(f[0], "%o", &mode)
				tag := tags[i/6][:1]
				want = append(want, fmt.Sprintf("%s %o %s %s %v %v %v|%d:%d %d:%d %d %d %d %d %d",
					name, mode, f[1], f[2], tag == "h" || tag == "s", tag == "S" || tag == "s", flags&(1<<29) != 0,
					cs, cn, ms, mn, dev, ino, uid, gid, size))
			}
			if !slices.Equal(got, want) || len(want) != 5 {
				t.Fatalf("entries\n%s\ngit reads\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if ix.EntriesEnd > len(data) || ix.NewHash().Size() != map[bool]int{true: 32, false: 20}[tc.init != nil] {
				t.Fatalf("entries end at %d of %d, hash size %d", ix.EntriesEnd, len(data), ix.NewHash().Size())
			}
		})
	}
}

// EmptyBlob is git's empty blob in both object formats.
func TestEmptyBlob(t *testing.T) {
	for _, init := range [][]string{nil, {"--object-format=sha256"}} {
		dir := t.TempDir()
		git(t, dir, append([]string{"init", "-q"}, init...)...)
		os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644)
		git(t, dir, "add", "empty")
		data, _ := os.ReadFile(filepath.Join(dir, ".git", "index"))
		ix, err := Read(data)
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.TrimSpace(git(t, dir, "hash-object", "empty")); fmt.Sprintf("%x", ix.EmptyBlob()) != want || ix.Entries[0].OID != ix.EmptyBlob() {
			t.Errorf("%v: empty blob %x, git's %s", init, ix.EmptyBlob(), want)
		}
	}
}
