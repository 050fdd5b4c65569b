package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A large rootfs (the Pi image's, about 520 MB in 29,000 entries) as a
// node image: its one layer is a tar written to a file while it is hashed,
// never held in memory, and the OCI archive that carries it is kept in the
// user's cache dir (os.UserCacheDir()/paseo-policy/kube-images, as
// internal/testkit/mcpstandin keeps its install), named by a hash of the
// tree's listing, so a second run of the same tree reuses it. The listing
// is every entry's path, type, mode, owner, size, mtime and link target:
// a tree changed in any of those is built again (and the old archive
// removed). A cached archive whose layer is corrupt fails the import (the
// manifest names the layer by its digest, which the node checks).

// treeImageVersion changes when the layer's encoding does, so an archive
// written by an older encoder is not taken for this one's.
const treeImageVersion = "paseo-kube-tree-image v1"

// treeImage is the cached archive of a tree's image and its one layer's
// descriptor.
type treeImage struct {
	ociImage
	Layer blob
	// Paths are the tree's entries (slash-separated, relative), so a
	// layer above it adds only what the tree lacks.
	Paths map[string]bool
	// Cached says whether the archive came from the cache.
	Cached bool
	// Seconds is the time to list the tree and, if not cached, to write the
	// layer and the archive.
	Seconds float64
}

// treeCacheEntry is the sidecar of a cached archive, written last: an
// archive without it is an unfinished build.
type treeCacheEntry struct {
	Name        string `json:"name"`
	Manifest    string `json:"manifest"`
	LayerDigest string `json:"layerDigest"`
	LayerSize   int64  `json:"layerSize"`
}

type treeEntry struct {
	rel  string
	st   unix.Stat_t
	link string
}

// listTree lists root in lexical order (parents before children) and
// hashes the listing.
func listTree(t *testing.T, root string) ([]treeEntry, string) {
	t.Helper()
	var entries []treeEntry
	h := sha256.New()
	fmt.Fprintln(h, treeImageVersion)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		e := treeEntry{rel: filepath.ToSlash(rel)}
		if err := unix.Lstat(p, &e.st); err != nil {
			return err
		}
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			if e.link, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFDIR, unix.S_IFREG:
		default:
			return fmt.Errorf("%s: a special file (mode %o); the layer holds files, directories and symlinks", p, e.st.Mode)
		}
		fmt.Fprintf(h, "%q %o %d %d %d %d.%09d %q\n", e.rel, e.st.Mode, e.st.Uid, e.st.Gid, e.st.Size, e.st.Mtim.Sec, e.st.Mtim.Nsec, e.link)
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return entries, hex.EncodeToString(h.Sum(nil))
}

// treeCacheDir is where tree images are kept between runs: the user's
// cache dir, or without one (no HOME) a dir of this test's alone.
func treeCacheDir(t *testing.T) string {
	t.Helper()
	base, err := os.UserCacheDir()
	if err != nil {
		t.Logf("no cache dir (%v): the tree's image is built for this run", err)
		return t.TempDir()
	}
	return filepath.Join(base, "paseo-policy", "kube-images")
}

// cachedTreeImage returns the image of the tree at root, named
// repo:<12 hex of the listing's hash>, from the cache dir or built into
// it; the archives of other trees in dir are removed.
func cachedTreeImage(t *testing.T, root, repo, dir string) treeImage {
	t.Helper()
	start := time.Now()
	entries, key := listTree(t, root)
	paths := make(map[string]bool, len(entries))
	for _, e := range entries {
		paths[e.rel] = true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	archive, sidecar := filepath.Join(dir, key+".tar"), filepath.Join(dir, key+".json")
	img := treeImage{Paths: paths}
	if data, err := os.ReadFile(sidecar); err == nil {
		var c treeCacheEntry
		if st, serr := os.Stat(archive); json.Unmarshal(data, &c) == nil && serr == nil && c.LayerSize > 0 && st.Size() > c.LayerSize {
			img.ociImage = ociImage{Name: c.Name, Digest: c.Manifest, Archive: archive}
			img.Layer = blob{digest: c.LayerDigest, size: c.LayerSize}
			img.Cached, img.Seconds = true, time.Since(start).Seconds()
			return img
		}
	}

	// Another tree's archives go: one tree is cached at a time.
	old, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, p := range old {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	work, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	layerPath := filepath.Join(work, "layer.tar")
	lf, err := os.Create(layerPath)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(lf, sum)}
	writeTreeLayer(t, cw, root, entries)
	if err := lf.Close(); err != nil {
		t.Fatal(err)
	}
	img.Layer = blob{digest: "sha256:" + hex.EncodeToString(sum.Sum(nil)), size: cw.n, file: layerPath}
	name := repo + ":" + key[:12]
	built := writeArchive(t, work, name, nil, []blob{img.Layer}, []blob{img.Layer})
	if err := os.Rename(built.Archive, archive); err != nil {
		t.Fatal(err)
	}
	c := treeCacheEntry{Name: name, Manifest: built.Digest, LayerDigest: img.Layer.digest, LayerSize: img.Layer.size}
	if err := os.WriteFile(sidecar+".tmp", mustJSON(t, c), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(sidecar+".tmp", sidecar); err != nil {
		t.Fatal(err)
	}
	img.Layer.file = ""
	img.ociImage = ociImage{Name: name, Digest: built.Digest, Archive: archive}
	img.Seconds = time.Since(start).Seconds()
	return img
}

// writeTreeLayer writes the tar of entries (as listed) to w: each entry's
// mode bits, owner and link target as the tree has them, mtime 0, a hard
// link's bytes as a file of its own; each file is opened without
// following a link and must still be what the listing saw.
func writeTreeLayer(t *testing.T, w io.Writer, root string, entries []treeEntry) {
	t.Helper()
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.rel, Mode: int64(e.st.Mode & 0o7777), Uid: int(e.st.Uid), Gid: int(e.st.Gid), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		var f *os.File
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Typeflag, h.Name = tar.TypeDir, e.rel+"/"
		case unix.S_IFLNK:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			fd, err := unix.Open(filepath.Join(root, e.rel), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatalf("%s: %v", e.rel, err)
			}
			f = os.NewFile(uintptr(fd), e.rel)
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil || st.Ino != e.st.Ino || st.Size != e.st.Size {
				f.Close()
				t.Fatalf("%s changed while the layer was written (%v)", e.rel, err)
			}
			h.Typeflag, h.Size = tar.TypeReg, e.st.Size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if f != nil {
			n, err := io.Copy(tw, f)
			f.Close()
			if err != nil || n != e.st.Size {
				t.Fatalf("%s: %d of %d bytes (%v)", e.rel, n, e.st.Size, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// overTree is an image of tree's layer with a layer of entries above it
// (the entries the tree lacks: a Pod's mount points), in dir, named name.
// Its archive carries the upper layer only: import the tree's archive
// first, and the node has the lower one.
func overTree(t *testing.T, dir, name string, tree treeImage, entries map[string]layerEntry) ociImage {
	t.Helper()
	upper := map[string]layerEntry{}
	for p, e := range entries {
		if !tree.Paths[p] {
			upper[p] = e
		}
	}
	if len(upper) == 0 {
		t.Fatal("no entry above the tree")
	}
	top := memLayer(t, upper)
	return writeArchive(t, dir, name, nil, []blob{tree.Layer, top}, []blob{top})
}

// treeStandIns are layer entries standing for the tree's own (a directory
// or a file), so addMountPoints adds only the mount points the tree lacks.
func treeStandIns(tree treeImage) map[string]layerEntry {
	out := make(map[string]layerEntry, len(tree.Paths))
	for p := range tree.Paths {
		out[p] = layerEntry{}
	}
	return out
}

// TestTreeImageCache builds a small tree's image twice (the second from
// the cache, the same digests), reads its layer back out of the archive
// (the tree's entries, bytes, modes and link targets, mtime 0; the layer's
// digest its bytes'), then changes one file: the image is built again and
// the old archive removed.
func TestTreeImageCache(t *testing.T) {
	root, cache := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "a/b"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "a/b/x"), []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a/b/x", filepath.Join(root, "l")); err != nil {
		t.Fatal(err)
	}
	first := cachedTreeImage(t, root, "paseo.test/tree", cache)
	again := cachedTreeImage(t, root, "paseo.test/tree", cache)
	if first.Cached || !again.Cached || again.Digest != first.Digest || again.Layer.digest != first.Layer.digest || again.Archive != first.Archive {
		t.Fatalf("first %+v, again %+v: want one build, then the same image from the cache", first, again)
	}

	// The layer, as the archive carries it.
	f, err := os.Open(first.Archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ar := tar.NewReader(f)
	var layer []byte
	for {
		h, err := ar.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "blobs/sha256/"+strings.TrimPrefix(first.Layer.digest, "sha256:") {
			if layer, err = io.ReadAll(ar); err != nil {
				t.Fatal(err)
			}
		}
	}
	if sha(layer) != first.Layer.digest || int64(len(layer)) != first.Layer.size {
		t.Fatalf("the archive's layer is %d bytes of %s; want %d of %s", len(layer), sha(layer), first.Layer.size, first.Layer.digest)
	}
	var got []string
	lr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(lr)
		if h.ModTime.Unix() != 0 {
			t.Errorf("%s: mtime %v, want 0", h.Name, h.ModTime)
		}
		got = append(got, fmt.Sprintf("%s %c %o %q %q", h.Name, h.Typeflag, h.Mode, h.Linkname, data))
	}
	want := []string{`a/ 5 750 "" ""`, `a/b/ 5 750 "" ""`, `a/b/x 0 640 "" "one\n"`, `l 2 777 "a/b/x" ""`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the layer holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A changed tree is another image; the old archive goes.
	if err := os.WriteFile(filepath.Join(root, "a/b/x"), []byte("two, longer\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	changed := cachedTreeImage(t, root, "paseo.test/tree", cache)
	if changed.Cached || changed.Layer.digest == first.Layer.digest {
		t.Fatalf("the changed tree's image %+v is the first's", changed)
	}
	if _, err := os.Stat(first.Archive); err == nil {
		t.Error("the first tree's archive is still cached")
	}
	if left, _ := filepath.Glob(filepath.Join(cache, "*")); len(left) != 2 {
		t.Errorf("the cache holds %v; want the changed tree's archive and sidecar", left)
	}
}
