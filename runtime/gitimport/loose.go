package gitimport

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"paseo.dev/paseo-policy/diag"
)

// copyLoose copies one loose object of the store into the quarantine's
// objects dir, checking on the way that it is what its name says: zlib
// data of "<type> <size>\0<content>" whose hash is the id it is filed
// under. Git itself does not re-hash a loose object when it reads one, so
// an object overwritten in place keeps its id (issue 30); here it is
// refused, and the shared repository's fetch (index-pack) hashes every
// object it receives again.
func copyLoose(objects storeDir, o looseObject, dst string, hexLen int, maxBytes int64) error {
	fanout, _, err := objects.dir(o.path[:2])
	if err != nil {
		return err
	}
	defer fanout.close()
	src, _, ok, err := fanout.file(o.path[3:], maxBytes)
	if err != nil {
		return err
	}
	if !ok {
		return refusef(diag.GitImportStore, "store/objects/"+o.path, "vanished while the import read the store")
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Join(dst, o.path[:2]), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(dst, o.path), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	verr := verifyLoose(io.TeeReader(src, out), o.id, hexLen, maxBytes)
	if cerr := out.Close(); verr == nil {
		verr = cerr
	}
	if verr != nil {
		return verr
	}
	return nil
}

func verifyLoose(r io.Reader, id string, hexLen int, maxBytes int64) error {
	bad := func(format string, args ...any) error {
		return refusef(diag.GitImportObject, "store/objects/"+id[:2]+"/"+id[2:], format, args...)
	}
	zr, err := zlib.NewReader(r)
	if err != nil {
		return bad("is not zlib data: %v", err)
	}
	br := bufio.NewReader(io.LimitReader(zr, maxBytes+64))
	header, err := br.ReadSlice(0)
	if err != nil {
		return bad("has no object header")
	}
	typ, size, ok := bytes.Cut(header[:len(header)-1], []byte(" "))
	if !ok {
		return bad("has no object header")
	}
	switch string(typ) {
	case "commit", "tree", "blob", "tag":
	default:
		return bad("has an object type the import does not take")
	}
	n, err := strconv.ParseInt(string(size), 10, 64)
	if err != nil || n < 0 || n > maxBytes || strconv.FormatInt(n, 10) != string(size) {
		return bad("has a malformed size")
	}
	var h hash.Hash = sha1.New()
	if hexLen == 64 {
		h = sha256.New()
	}
	h.Write(header)
	got, err := io.Copy(h, io.LimitReader(br, n+1))
	if err != nil {
		return bad("cannot be inflated: %v", err)
	}
	if got != n {
		return bad("holds %d bytes of content, its header says %d", got, n)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return bad("has data after its content")
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != id {
		return bad("is filed under %s but its content hashes to %s: an object may never change under its id", id, sum)
	}
	return nil
}

// refusef is a one-diagnostic refusal.
func refusef(code diag.Code, path, format string, args ...any) error {
	var l diag.List
	l.Addf(code, path, "%s", fmt.Sprintf(format, args...))
	return l
}
