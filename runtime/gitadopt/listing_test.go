package gitadopt

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	idA = "78981922613b2afb6025042ff6bd878ac1994e85"
	idB = "61780798228d17af2d34fce4cfbdf35556832472"
)

// The listings are read strictly: anything but the exact record shapes
// git prints is an error, never a guess.
func TestListingRecords(t *testing.T) {
	cases := []struct {
		name  string
		tree  bool
		rec   string
		valid bool
	}{
		{"index file", false, "100644 " + idA + " 0\ta", true},
		{"index gitlink", false, "160000 " + idA + " 0\tsub/x", true},
		{"index path with tab and newline", false, "100644 " + idA + " 0\ta\tb\nc", true},
		{"index unmerged", false, "100644 " + idA + " 2\ta", true},
		{"index stage 4", false, "100644 " + idA + " 4\ta", false},
		{"index tree mode", false, "040000 " + idA + " 0\ta", false},
		{"index uppercase id", false, "100644 " + strings.ToUpper(idA) + " 0\ta", false},
		{"index short id", false, "100644 " + idA[:39] + " 0\ta", false},
		{"index empty path", false, "100644 " + idA + " 0\t", false},
		{"index no tab", false, "100644 " + idA + " 0 a", false},
		{"tree blob", true, "100755 blob " + idA + "\tbin/x", true},
		{"tree symlink", true, "120000 blob " + idA + "\tl", true},
		{"tree gitlink", true, "160000 commit " + idA + "\tsub", true},
		{"tree gitlink typed blob", true, "160000 blob " + idA + "\tsub", false},
		{"tree blob typed commit", true, "100644 commit " + idA + "\ta", false},
		{"tree subtree shown", true, "040000 tree " + idA + "\td", false},
		{"tree extra field", true, "100644 blob " + idA + " 12\ta", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newListing(40, 10)
			read := l.indexEntry
			if c.tree {
				read = l.treeEntry
			}
			err := read([]byte(c.rec))
			if c.valid && err != nil {
				t.Errorf("refused: %v", err)
			}
			if !c.valid && !errors.Is(err, errFormat) {
				t.Errorf("got %v, want errFormat", err)
			}
		})
	}
}

// The index and a tree with the same entries have the same digest; order
// and duplicates are noted, and the bound stops the listing.
func TestListingCompare(t *testing.T) {
	index, tree := newListing(40, 10), newListing(40, 10)
	for _, rec := range []string{"100644 " + idA + " 0\ta", "160000 " + idB + " 0\tsub"} {
		if err := index.indexEntry([]byte(rec)); err != nil {
			t.Fatal(err)
		}
	}
	for _, rec := range []string{"100644 blob " + idA + "\ta", "160000 commit " + idB + "\tsub"} {
		if err := tree.treeEntry([]byte(rec)); err != nil {
			t.Fatal(err)
		}
	}
	if index.digest() != tree.digest() || index.entries != 2 || tree.disorder != "" {
		t.Errorf("same entries: digests %s and %s, %d entries, disorder %q", index.digest(), tree.digest(), index.entries, tree.disorder)
	}
	if diff := cmp.Diff(map[string]string{"sub": idB}, tree.gitlinks); diff != "" {
		t.Errorf("gitlinks (-want +got):\n%s", diff)
	}
	if err := tree.treeEntry([]byte("100644 blob " + idA + "\tsub")); err != nil || tree.disorder != "sub" {
		t.Errorf("a path twice: %v, disorder %q", err, tree.disorder)
	}
	small := newListing(40, 1)
	small.treeEntry([]byte("100644 blob " + idA + "\ta"))
	if err := small.treeEntry([]byte("100644 blob " + idA + "\tb")); !errors.Is(err, errTooMany) {
		t.Errorf("over the bound: %v", err)
	}
}

func TestGitlinkChanges(t *testing.T) {
	got := gitlinkChanges(
		map[string]string{"same": idA, "moved": idA, "dropped": idA},
		map[string]string{"same": idA, "moved": idB, "added": idB},
	)
	want := []change{{Path: "added", Tree: idB}, {Path: "dropped", Index: idA}, {Path: "moved", Index: idA, Tree: idB}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestReadRecords(t *testing.T) {
	var got []string
	each := func(b []byte) error { got = append(got, string(b)); return nil }
	if err := readRecords(bufio.NewReaderSize(strings.NewReader("a\x00b c\x00"), 16), each); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b c"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if err := readRecords(bufio.NewReaderSize(strings.NewReader("a\x00b"), 16), each); !errors.Is(err, errFormat) {
		t.Errorf("no final NUL: %v", err)
	}
	if err := readRecords(bufio.NewReaderSize(strings.NewReader(strings.Repeat("x", 40)+"\x00"), 16), each); !errors.Is(err, errFormat) {
		t.Errorf("a record over the buffer: %v", err)
	}
}
