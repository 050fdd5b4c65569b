package gitplant

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Plain file operations: all a plant may use, since a sandbox with only
// busybox has no git. Each fails the test on error.

func mkdirAll(t testing.TB, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, p, s string) {
	t.Helper()
	mkdirAll(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeExec(t testing.TB, p, s string) {
	t.Helper()
	writeFile(t, p, s)
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t testing.TB, p, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func rename(t testing.TB, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

func symlink(t testing.TB, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func remove(t testing.TB, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

// copyFiles copies the named regular files from one dir to another.
func copyFiles(t testing.TB, from, to string, names ...string) {
	t.Helper()
	for _, n := range names {
		writeFile(t, filepath.Join(to, n), readFile(t, filepath.Join(from, n)))
	}
}

// backdate gives a tracked file an old mtime, so the next index refresh
// finds its stat data stale and writes the index (content unchanged).
func backdate(t testing.TB, p string) {
	t.Helper()
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

// writeObject stores a loose object (zlib of "<kind> <len>\0<body>"), as
// printf and a zlib stream can, and returns its id.
func writeObject(t testing.TB, objects, kind, body string) string {
	t.Helper()
	raw := fmt.Sprintf("%s %d\x00%s", kind, len(body), body)
	id := objectID(kind, body)
	var z bytes.Buffer
	w := zlib.NewWriter(&z)
	w.Write([]byte(raw))
	w.Close()
	writeFile(t, filepath.Join(objects, id[:2], id[2:]), z.String())
	return id
}

// objectID is the id Git gives the object, stored or not.
func objectID(kind, body string) string {
	sum := sha1.Sum(fmt.Appendf(nil, "%s %d\x00%s", kind, len(body), body))
	return hex.EncodeToString(sum[:])
}

// emptyTree is Git's built-in empty tree: a commit may name it without the
// object being stored.
const emptyTree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

// signedCommit stores a commit carrying a gpgsig header: `git log` checks
// it with gpg.program when log.showSignature is set. The signature is junk;
// Git runs the program before it can know.
func signedCommit(t testing.TB, objects, subject string) string {
	t.Helper()
	body := "tree " + emptyTree + "\n" +
		"author Agent <agent@example.invalid> 1700000000 +0000\n" +
		"committer Agent <agent@example.invalid> 1700000000 +0000\n" +
		"gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n" +
		"\n" + subject + "\n"
	return writeObject(t, objects, "commit", body)
}

// headRef is the ref the Git dir's HEAD names ("" when detached).
func headRef(t testing.TB, gitdir string) string {
	t.Helper()
	ref, _ := strings.CutPrefix(strings.TrimSpace(readFile(t, filepath.Join(gitdir, "HEAD"))), "ref: ")
	return ref
}

// moveHead points the worktree's HEAD (its branch, kept in the common dir)
// at commit.
func moveHead(t testing.TB, gitdir, common, commit string) {
	t.Helper()
	if ref := headRef(t, gitdir); ref != "" {
		writeFile(t, filepath.Join(common, ref), commit+"\n")
		return
	}
	writeFile(t, filepath.Join(gitdir, "HEAD"), commit+"\n")
}
