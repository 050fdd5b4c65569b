package gitadopt

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
)

const gitlinkMode = "160000"

// typeOf is the object type ls-tree prints for each mode git writes in a
// tree (canonical: git normalises any other mode bits when it reads one).
var typeOf = map[string]string{"100644": "blob", "100755": "blob", "120000": "blob", gitlinkMode: "commit"}

// listing is what one of git's listings holds, reduced to what adoption
// decides on: a digest of every entry in order (so the index and a tree
// compare without keeping either), the gitlinks, and what makes it unfit.
type listing struct {
	hexLen   int
	max      int
	entries  int
	sum      hash.Hash
	gitlinks map[string]string // path -> commit id
	unmerged int               // index entries at stage 1-3
	last     string
	disorder string // first path not strictly after the one before it (a duplicate or out of order)
}

// errTooMany stops a listing that passes its bound.
var errTooMany = errors.New("too many entries")

func newListing(hexLen, max int) *listing {
	return &listing{hexLen: hexLen, max: max, sum: sha256.New(), gitlinks: map[string]string{}}
}

// digest is the listing's digest, comparable between an index and a tree.
func (l *listing) digest() string { return fmt.Sprintf("%x", l.sum.Sum(nil)) }

// indexEntry reads one record of `git ls-files -s -z`:
// "<mode> <id> <stage>\t<path>".
func (l *listing) indexEntry(rec []byte) error {
	mode, rest, ok1 := bytes.Cut(rec, []byte(" "))
	id, rest, ok2 := bytes.Cut(rest, []byte(" "))
	stage, path, ok3 := bytes.Cut(rest, []byte("\t"))
	if !ok1 || !ok2 || !ok3 || len(stage) != 1 || stage[0] < '0' || stage[0] > '3' {
		return fmt.Errorf("%w: ls-files record %q", errFormat, rec)
	}
	if stage[0] != '0' {
		// Stages share a path; the listing is refused whole, so order
		// and digest no longer matter.
		l.unmerged++
		return l.count()
	}
	return l.add(string(mode), string(id), string(path), rec)
}

// treeEntry reads one record of `git ls-tree -r -z --full-tree`:
// "<mode> <type> <id>\t<path>".
func (l *listing) treeEntry(rec []byte) error {
	mode, rest, ok1 := bytes.Cut(rec, []byte(" "))
	typ, rest, ok2 := bytes.Cut(rest, []byte(" "))
	id, path, ok3 := bytes.Cut(rest, []byte("\t"))
	if !ok1 || !ok2 || !ok3 || typeOf[string(mode)] != string(typ) {
		return fmt.Errorf("%w: ls-tree record %q", errFormat, rec)
	}
	return l.add(string(mode), string(id), string(path), rec)
}

func (l *listing) add(mode, id, path string, rec []byte) error {
	if _, ok := typeOf[mode]; !ok || !isHex(id, l.hexLen) || path == "" {
		return fmt.Errorf("%w: record %q", errFormat, rec)
	}
	if err := l.count(); err != nil {
		return err
	}
	// The index is sorted by path bytes, and a well-formed tree listed
	// recursively comes out in the same order; anything else is a tree
	// git would not write, and read-tree's result would be its own guess.
	if l.entries > 1 && path <= l.last && l.disorder == "" {
		l.disorder = path
	}
	l.last = path
	if mode == gitlinkMode {
		l.gitlinks[path] = id
	}
	// One canonical record per entry: the same bytes from either listing.
	fmt.Fprintf(l.sum, "%s %s\t%s\x00", mode, id, path)
	return nil
}

func (l *listing) count() error {
	l.entries++
	if l.entries > l.max {
		return errTooMany
	}
	return nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// change is one gitlink that differs between the index and a tree; an
// empty side is a gitlink that side does not have.
type change struct {
	Path, Index, Tree string
}

// gitlinkChanges lists every path whose gitlink differs, by path.
func gitlinkChanges(index, tree map[string]string) []change {
	var out []change
	for p, id := range index {
		if tree[p] != id {
			out = append(out, change{Path: p, Index: id, Tree: tree[p]})
		}
	}
	for p, id := range tree {
		if _, ok := index[p]; !ok {
			out = append(out, change{Path: p, Tree: id})
		}
	}
	slices.SortFunc(out, func(a, b change) int { return strings.Compare(a.Path, b.Path) })
	return out
}
