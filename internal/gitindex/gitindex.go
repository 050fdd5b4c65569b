// Package gitindex reads a Git index whole: its entries (name, mode,
// stage, flags and the stat data Git recorded) and where its extensions
// lie, for the compiler (the gitlinks, the paths host git recurses into
// as submodules) and the launcher (the workspace monitor's vouch,
// runtime/launcher/fsmonitor/vouch). It reads index versions 2 to 4 with
// SHA-1 or SHA-256 object names and refuses what it cannot read whole (a
// split index keeps its entries in another file), so nothing is missed by
// a guess.
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

// Stat is the stat data an entry records, as the index stores it (each
// field 32 bits: seconds, sizes and inode numbers are truncated).
type Stat struct {
	CtimeSec, CtimeNsec uint32
	MtimeSec, MtimeNsec uint32
	Dev, Ino            uint32
	UID, GID            uint32
	Size                uint32
}

// Entry is one index entry.
type Entry struct {
	Name string // relative to the worktree root, slash-separated
	Mode uint32 // 100644, 100755, 120000 or 160000 (octal)
	Stat Stat
	// OID is the object name's raw bytes (20 or 32).
	OID string
	// Off is where the entry starts in the index's bytes: its stat data
	// and mode, StatBytes long, then the object name and the flags.
	Off int
	// Stage is 0, or 1 to 3 for an unmerged entry.
	Stage int
	// AssumeValid is Git's CE_VALID (update-index --assume-unchanged).
	AssumeValid bool
	// SkipWorktree and IntentToAdd are the extended flags (version 3 and 4).
	SkipWorktree, IntentToAdd bool
}

// Extension is one extension's place in the index's bytes.
type Extension struct {
	Sig string
	// Off is where its 8-byte header starts; Size is its payload's length.
	Off, Size int
}

// Index is a parsed index. Its bytes are the caller's, unchanged.
type Index struct {
	Version uint32
	// NewHash is the index's hash (SHA-1 or SHA-256), the one its
	// trailing checksum and object names use.
	NewHash    func() hash.Hash
	Entries    []Entry
	EntriesEnd int // offset of the first extension (or of the checksum)
	Extensions []Extension
}

const (
	modeMask          = 0o170000
	modeGitlink       = 0o160000
	flagValid         = 0x8000
	flagExtend        = 0x4000
	nameMask          = 0x0fff
	extSkipWorktree   = 0x4000
	extIntentToAdd    = 0x2000
	extUnknownFlags   = 0x1fff
	defaultStageShift = 12
)

// StatBytes is an entry's stat data and mode as the index stores them:
// ctime and mtime (seconds and nanoseconds), dev, ino, mode, uid, gid and
// size, 32 bits each.
const StatBytes = 40

// ErrSplit is a split index (core.splitIndex): its entries are in a
// shared index file this reader does not follow.
var ErrSplit = errors.New("a split index (core.splitIndex): its entries are in a shared index file")

// Read parses data whole. The object format is not known here: the index
// is read with each hash length and kept only when it parses whole and its
// trailing checksum (or the zeros of index.skipHash) matches, which no
// index satisfies for both.
func Read(data []byte) (*Index, error) {
	var errs []error
	for _, h := range []func() hash.Hash{sha1.New, sha256.New} {
		ix, err := parse(data, h)
		if err == nil {
			return ix, nil
		}
		if errors.Is(err, ErrSplit) {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("not a Git index this reader can read: %w", errors.Join(errs...))
}

// EmptyBlob is the object name (raw bytes) of the empty blob in the
// index's object format: the one object an entry of size 0 can name
// without being racily smudged (read-cache.c ce_match_stat_basic).
func (ix *Index) EmptyBlob() string {
	h := ix.NewHash()
	h.Write([]byte("blob 0\x00"))
	return string(h.Sum(nil))
}

// Gitlinks returns the index's gitlinks in index order.
func Gitlinks(data []byte) ([]Gitlink, error) {
	ix, err := Read(data)
	if err != nil {
		return nil, err
	}
	var links []Gitlink
	for _, e := range ix.Entries {
		if e.Mode&modeMask == modeGitlink {
			links = append(links, Gitlink{Path: e.Name, Stage: e.Stage})
		}
	}
	return links, nil
}

func parse(data []byte, newHash func() hash.Hash) (*Index, error) {
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
	// An entry takes at least 62 bytes before its name: a count past what
	// the bytes could hold is refused before anything is allocated for it.
	if uint64(count) > uint64(len(body))/uint64(StatBytes+hashLen+2) {
		return nil, fmt.Errorf("%d entries cannot fit in %d bytes", count, len(body))
	}
	ix := &Index{Version: version, NewHash: newHash, Entries: make([]Entry, 0, count)}
	off := 12
	var prev string
	be := binary.BigEndian
	for i := uint32(0); i < count; i++ {
		start := off
		fixed := StatBytes + hashLen + 2
		if off+fixed > len(body) {
			return nil, fmt.Errorf("entry %d runs past the end", i)
		}
		s := body[off:]
		e := Entry{Stat: Stat{CtimeSec: be.Uint32(s[0:]), CtimeNsec: be.Uint32(s[4:]), MtimeSec: be.Uint32(s[8:]), MtimeNsec: be.Uint32(s[12:]),
			Dev: be.Uint32(s[16:]), Ino: be.Uint32(s[20:]), UID: be.Uint32(s[28:]), GID: be.Uint32(s[32:]), Size: be.Uint32(s[36:])},
			Mode: be.Uint32(s[24:]), OID: string(s[StatBytes : StatBytes+hashLen]), Off: off}
		flags := be.Uint16(body[off+StatBytes+hashLen:])
		e.Stage, e.AssumeValid = int(flags>>defaultStageShift)&3, flags&flagValid != 0
		off += fixed
		if flags&flagExtend != 0 {
			if version < 3 {
				return nil, fmt.Errorf("entry %d has extended flags in a version 2 index", i)
			}
			if off+2 > len(body) {
				return nil, fmt.Errorf("entry %d runs past the end", i)
			}
			ext := be.Uint16(body[off:])
			if ext&extUnknownFlags != 0 {
				return nil, fmt.Errorf("entry %d has extended flags %#x this reader does not know", i, ext)
			}
			e.SkipWorktree, e.IntentToAdd = ext&extSkipWorktree != 0, ext&extIntentToAdd != 0
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
		if name == "" {
			// Only a split index's entries replacing the shared index's
			// have no name of their own.
			return nil, fmt.Errorf("entry %d has no name: %w", i, ErrSplit)
		}
		// A sparse index's directory entries (a name ending in a slash)
		// are refused with the rest: a gitlink could be behind one.
		if !clean(name) {
			return nil, fmt.Errorf("entry %d: path %q is not a clean relative path", i, name)
		}
		e.Name = name
		ix.Entries = append(ix.Entries, e)
		prev = name
	}
	ix.EntriesEnd = off
	for off < len(body) {
		if off+8 > len(body) {
			return nil, errors.New("extension header runs past the end")
		}
		sig, size := string(body[off:off+4]), be.Uint32(body[off+4:off+8])
		if uint64(off)+8+uint64(size) > uint64(len(body)) {
			return nil, fmt.Errorf("extension %q runs past the end", sig)
		}
		if sig == "link" {
			return nil, ErrSplit
		}
		ix.Extensions = append(ix.Extensions, Extension{Sig: sig, Off: off, Size: int(size)})
		off += 8 + int(size)
	}
	return ix, nil
}

// Varint decodes Git's offset encoding (varint.c), used by index version
// 4 and the untracked cache extension: the value and the bytes it took.
func Varint(b []byte) (uint64, int, error) { return varint(b) }

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
