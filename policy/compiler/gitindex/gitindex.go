// Package gitindex reads the one thing the compiler needs from a Git index:
// its gitlinks (mode 160000 entries), the paths host git recurses into as
// submodules. It reads index versions 2 to 4 with SHA-1 or SHA-256 object
// names and refuses what it cannot read whole (a split index keeps its
// entries in another file), so a gitlink is never missed by a guess.
package gitindex

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"path"
	"strings"
)

// Gitlink is one submodule entry of the index.
type Gitlink struct {
	Path  string // relative to the worktree root, slash-separated
	Stage int    // 0, or 1 to 3 for an unmerged entry
}

const (
	modeMask    = 0o170000
	modeGitlink = 0o160000
	statBytes   = 40 // ctime, mtime (seconds and nanoseconds), dev, ino, mode, uid, gid, size
	flagExtend  = 0x4000
	nameMask    = 0x0fff
)

// Gitlinks returns the index's gitlinks in index order. The object format
// is not known here: the index is read with each hash length and kept only
// when it parses whole and its trailing checksum (or the zeros of
// index.skipHash) matches, which no index satisfies for both.
func Gitlinks(data []byte) ([]Gitlink, error) {
	var errs []error
	for _, h := range []func() hash.Hash{sha1.New, sha256.New} {
		links, err := parse(data, h)
		if err == nil {
			return links, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("not a Git index this compiler can read: %w", errors.Join(errs...))
}

func parse(data []byte, newHash func() hash.Hash) ([]Gitlink, error) {
	h := newHash()
	hashLen := h.Size()
	if len(data) < 12+hashLen {
		return nil, errors.New("shorter than a header and checksum")
	}
	body, sum := data[:len(data)-hashLen], data[len(data)-hashLen:]
	if !bytes.Equal(sum, make([]byte, hashLen)) {
		h.Write(body)
		if !bytes.Equal(h.Sum(nil), sum) {
			return nil, fmt.Errorf("checksum is not the %d-byte hash of the index", hashLen)
		}
	}
	if string(body[:4]) != "DIRC" {
		return nil, errors.New("no DIRC signature")
	}
	version := binary.BigEndian.Uint32(body[4:8])
	if version < 2 || version > 4 {
		return nil, fmt.Errorf("index version %d", version)
	}
	count := binary.BigEndian.Uint32(body[8:12])
	off := 12
	var prev string
	var links []Gitlink
	for i := uint32(0); i < count; i++ {
		start := off
		fixed := statBytes + hashLen + 2
		if off+fixed > len(body) {
			return nil, fmt.Errorf("entry %d runs past the end", i)
		}
		mode := binary.BigEndian.Uint32(body[off+24 : off+28])
		flags := binary.BigEndian.Uint16(body[off+statBytes+hashLen:])
		off += fixed
		if flags&flagExtend != 0 {
			if version < 3 {
				return nil, fmt.Errorf("entry %d has extended flags in a version 2 index", i)
			}
			if off+2 > len(body) {
				return nil, fmt.Errorf("entry %d runs past the end", i)
			}
			off += 2
		}
		var name string
		if version == 4 {
			strip, n, err := varint(body[off:])
			if err != nil || strip > uint64(len(prev)) {
				return nil, fmt.Errorf("entry %d: bad path prefix length", i)
			}
			off += n
			end := bytes.IndexByte(body[off:], 0)
			if end < 0 {
				return nil, fmt.Errorf("entry %d: path not terminated", i)
			}
			name = prev[:len(prev)-int(strip)] + string(body[off:off+end])
			off += end + 1
		} else {
			end := bytes.IndexByte(body[off:], 0)
			if end < 0 {
				return nil, fmt.Errorf("entry %d: path not terminated", i)
			}
			name = string(body[off : off+end])
			// One to eight NULs pad the entry to a multiple of eight bytes.
			entryLen := (off + end - start + 8) &^ 7
			if start+entryLen > len(body) || !allZero(body[off+end:start+entryLen]) {
				return nil, fmt.Errorf("entry %d: bad padding", i)
			}
			off = start + entryLen
		}
		if l := int(flags & nameMask); l != nameMask && l != len(name) {
			return nil, fmt.Errorf("entry %d: path length %d, flags say %d", i, len(name), l)
		}
		if !clean(name) {
			return nil, fmt.Errorf("entry %d: path %q is not a clean relative path", i, name)
		}
		if mode&modeMask == modeGitlink {
			links = append(links, Gitlink{Path: name, Stage: int(flags>>12) & 3})
		}
		prev = name
	}
	// Extensions: a split index ("link") keeps entries in a shared index
	// file, which this reader does not follow.
	for off < len(body) {
		if off+8 > len(body) {
			return nil, errors.New("extension header runs past the end")
		}
		sig, size := string(body[off:off+4]), binary.BigEndian.Uint32(body[off+4:off+8])
		off += 8
		if uint64(off)+uint64(size) > uint64(len(body)) {
			return nil, fmt.Errorf("extension %q runs past the end", sig)
		}
		if sig == "link" {
			return nil, errors.New("a split index (core.splitIndex): its entries are in a shared index file")
		}
		off += int(size)
	}
	return links, nil
}

// varint is Git's offset encoding (varint.c), used by index version 4.
func varint(b []byte) (uint64, int, error) {
	if len(b) == 0 {
		return 0, 0, errors.New("empty")
	}
	c := b[0]
	v := uint64(c & 0x7f)
	n := 1
	for c&0x80 != 0 {
		if n >= len(b) || n > 9 {
			return 0, 0, errors.New("too long")
		}
		v++
		c = b[n]
		v = v<<7 | uint64(c&0x7f)
		n++
	}
	return v, n, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// clean reports a path Git itself would write: relative, no empty, . or ..
// component, no .git component (Git refuses those; a gitlink whose path
// ends in .git would name a Git dir).
func clean(p string) bool {
	if p == "" || p[0] == '/' || path.Clean(p) != p {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if c == "." || c == ".." || strings.EqualFold(c, ".git") {
			return false
		}
	}
	return true
}
