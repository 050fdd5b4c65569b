package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// ociImage is an image the node imports from a local archive (no registry
// is ever asked): one layer, deterministic (sorted entries, root-owned,
// mtime 0), so the same tree is always the same digest.
type ociImage struct {
	Name    string // repository:tag the archive names
	Digest  string // sha256:<hex> of the manifest
	Archive string // the OCI image layout, as a tar file
}

// ByDigest is the image's reference by digest, as the rendering wants it.
func (i ociImage) ByDigest() string {
	repo, _, _ := strings.Cut(i.Name, ":")
	return repo + "@" + i.Digest
}

// layerEntry is one entry of the layer: a file with its bytes and mode, a
// directory, or a symlink.
type layerEntry struct {
	mode    int64
	data    []byte
	dir     bool
	symlink string
}

// treeEntries reads a host directory into layer entries (its rootfs).
func treeEntries(t *testing.T, root string) map[string]layerEntry {
	t.Helper()
	out := map[string]layerEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			out[rel] = layerEntry{dir: true, mode: int64(info.Mode().Perm())}
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = layerEntry{symlink: target, mode: 0o777}
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = layerEntry{data: data, mode: int64(info.Mode().Perm())}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// buildImage writes an OCI image layout archive of entries into dir, its
// config running entrypoint: one layer, held in memory (a small tree).
func buildImage(t *testing.T, dir, name string, entries map[string]layerEntry, entrypoint []string) ociImage {
	t.Helper()
	layer := memLayer(t, entries)
	return writeArchive(t, dir, name, entrypoint, []blob{layer}, []blob{layer})
}

// memLayer is the tar of entries, sorted, root-owned, mtime 0.
func memLayer(t *testing.T, entries map[string]layerEntry) blob {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: n, Mode: e.mode, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
		case e.symlink != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.symlink
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return blob{digest: sha(layer.Bytes()), size: int64(layer.Len()), data: layer.Bytes()}
}

// blob is one blob of an image: its bytes in memory, or a file streamed
// into the archive.
type blob struct {
	digest string
	size   int64
	data   []byte
	file   string
}

// writeArchive writes the OCI image layout archive of an image whose
// config runs entrypoint and whose layers (uncompressed tars, bottom
// first) are layers; the archive carries the config, the manifest and the
// blobs of include, which may leave out a layer the node already has (an
// import takes a layout's blobs as they come and the unpack finds the
// others in the content store).
func writeArchive(t *testing.T, dir, name string, entrypoint []string, layers, include []blob) ociImage {
	t.Helper()
	var diffIDs []string
	var descs []any
	for _, l := range layers {
		diffIDs = append(diffIDs, l.digest)
		descs = append(descs, map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": l.digest, "size": l.size})
	}
	config := mustJSON(t, map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	manifest := mustJSON(t, map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config), "size": len(config)},
		"layers": descs,
	})
	index := mustJSON(t, map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(manifest), "size": len(manifest),
			"annotations": map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
		}},
	})
	path := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(name)+".tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	aw := tar.NewWriter(f)
	add := func(n string, size int64, r io.Reader) {
		if err := aw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(aw, r); err != nil {
			t.Fatal(err)
		}
	}
	add("oci-layout", int64(len(`{"imageLayoutVersion":"1.0.0"}`)), strings.NewReader(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", int64(len(index)), bytes.NewReader(index))
	for _, b := range append([]blob{{digest: sha(config), size: int64(len(config)), data: config}, {digest: sha(manifest), size: int64(len(manifest)), data: manifest}}, include...) {
		bn := "blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:")
		if b.file == "" {
			add(bn, b.size, bytes.NewReader(b.data))
			continue
		}
		lf, err := os.Open(b.file)
		if err != nil {
			t.Fatal(err)
		}
		add(bn, b.size, lf)
		lf.Close()
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return ociImage{Name: name, Digest: sha(manifest), Archive: path}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
