package gitindex

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fsmonitorRepo is a worktree of n files added, and a core.fsmonitor hook
// that answers every query "nothing changed since your token".
func fsmonitorRepo(t *testing.T, n int) (dir, hook string, names []string) {
	t.Helper()
	dir = t.TempDir()
	git(t, dir, "init", "-q")
	for i := range n {
		f := filepath.Join("d", strings.Repeat("f", 1+i/26)+string(rune('a'+i%26)))
		os.MkdirAll(filepath.Join(dir, "d"), 0o755)
		os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644)
	}
	git(t, dir, "add", "-A")
	hook = filepath.Join(t.TempDir(), "hook")
	os.WriteFile(hook, []byte("#!/bin/sh\nprintf 'tok1\\0'\n"), 0o755)
	return dir, hook, strings.Fields(git(t, dir, "ls-files"))
}

// lsInvalid is git's reading of the fsmonitor bits: the entries ls-files
// -f tags uppercase (not valid).
func lsInvalid(t *testing.T, dir, hook string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(git(t, dir, "-c", "core.fsmonitor="+hook, "ls-files", "-f")), "\n") {
		if tag, name, _ := strings.Cut(l, " "); tag != strings.ToLower(tag) {
			out = append(out, name)
		}
	}
	return out
}

// Git's own bitmap (written by update-index, with its runs of clean words)
// reads as git reads it, and one AppendFSMonitor writes reads back the
// same and as git reads it.
func TestFSMonitorMatchesGit(t *testing.T) {
	dir, hook, names := fsmonitorRepo(t, 300)
	invalid := []string{names[3], names[70], names[128], names[299]}
	git(t, dir, append([]string{"-c", "core.fsmonitor=" + hook, "update-index", "--fsmonitor-valid"}, names...)...)
	git(t, dir, append([]string{"-c", "core.fsmonitor=" + hook, "update-index", "--no-fsmonitor-valid"}, invalid...)...)
	index := filepath.Join(dir, ".git", "index")
	data, _ := os.ReadFile(index)
	ix, err := Read(data)
	if err != nil {
		t.Fatal(err)
	}
	fm, err := ReadFSMonitor(data, ix)
	if err != nil {
		t.Fatal(err)
	}
	dirtyNames := func(dirty []bool) []string {
		var out []string
		for i, d := range dirty {
			if d {
				out = append(out, ix.Entries[i].Name)
			}
		}
		return out
	}
	if got := dirtyNames(fm.Dirty); fm.Token == "" || !slices.Equal(got, invalid) || !slices.Equal(lsInvalid(t, dir, hook), invalid) {
		t.Fatalf("read token %q, not valid %q; git %q; want %q", fm.Token, got, lsInvalid(t, dir, hook), invalid)
	}

	// Ours: every fourth entry not valid, in place of git's extension.
	mine := make([]bool, len(names))
	for i := range mine {
		mine[i] = i%4 == 1
	}
	var out []byte
	out = append(out, data[:ix.EntriesEnd]...)
	for _, x := range ix.Extensions {
		if x.Sig != "FSMN" {
			out = append(out, data[x.Off:x.Off+8+x.Size]...)
		}
	}
	out = AppendFSMonitor(out, "tok1", mine)
	sum := sha1.Sum(out)
	out = append(out, sum[:]...)
	ix2, err := Read(out)
	if err != nil {
		t.Fatal(err)
	}
	fm2, err := ReadFSMonitor(out, ix2)
	if err != nil || fm2.Token != "tok1" || !slices.Equal(fm2.Dirty, mine) {
		t.Fatalf("read back %v, %+v", err, fm2)
	}
	os.WriteFile(index, out, 0o644)
	if got := lsInvalid(t, dir, hook); !slices.Equal(got, dirtyNames(mine)) {
		t.Fatalf("git reads %d entries not valid, want %d", len(got), len(dirtyNames(mine)))
	}
}

// What is not one bit per entry, or not a version 2 extension, is an
// error.
func TestFSMonitorRefusals(t *testing.T) {
	ix := &Index{Entries: make([]Entry, 3)}
	ext := func(payload []byte) []byte {
		out := append([]byte("FSMN"), binary.BigEndian.AppendUint32(nil, uint32(len(payload)))...)
		ix.Extensions = []Extension{{Sig: "FSMN", Off: 0, Size: len(payload)}}
		return append(out, payload...)
	}
	good := AppendFSMonitor(nil, "t", []bool{true, false, true})
	if fm, err := ReadFSMonitor(ext(good[8:]), ix); err != nil || !slices.Equal(fm.Dirty, []bool{true, false, true}) {
		t.Fatalf("the control: %v %+v", err, fm)
	}
	four := AppendFSMonitor(nil, "t", []bool{true, false, true, false})
	v1 := bytes.Clone(good[8:])
	v1[3] = 1
	runPast := bytes.Clone(good[8:])
	// The run-length word: a run of one word of set bits (64 > 3 bits).
	binary.BigEndian.PutUint64(runPast[4+2+4+8:], 1<<1|1)
	for name, p := range map[string][]byte{
		"four bits":    four[8:],
		"version 1":    v1,
		"no token end": []byte("\x00\x00\x00\x02tok"),
		"cut":          good[8 : len(good)-3],
		"run past":     runPast,
	} {
		if _, err := ReadFSMonitor(ext(p), ix); err == nil {
			t.Errorf("%s: read", name)
		}
	}
	ix.Extensions = nil
	if _, err := ReadFSMonitor(nil, ix); err == nil {
		t.Error("no extension: read")
	}
}

// unewah on arbitrary bytes: an error or bits, never a panic, and what
// ewah writes reads back.
func FuzzUnewah(f *testing.F) {
	f.Add(ewah([]bool{true, false, true}))
	f.Add(ewah(make([]bool, 200)))
	f.Fuzz(func(t *testing.T, p []byte) {
		bits, err := unewah(p)
		if err != nil {
			return
		}
		if back, err := unewah(ewah(bits)); err != nil || !slices.Equal(back, bits) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
