package pathsafe

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/diag"
)

// ReadSmall returns a file whole up to max bytes and refuses one larger,
// at every size around the bound.
func TestReadSmallSizes(t *testing.T) {
	base := tree(t)
	r := Resolver{Base: base}
	const max = 64
	for _, size := range []int{0, 1, max - 1, max, max + 1, 4 * max} {
		content := bytes.Repeat([]byte{'x'}, size)
		if err := os.WriteFile(filepath.Join(base, "srv/ws/file"), content, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadSmall("/srv/ws", "/srv/ws/file", max)
		switch {
		case size > max && codeOf(err) != diag.PathType:
			t.Errorf("%d bytes against max %d: got %d bytes, err %v; want %s", size, max, len(got), err, diag.PathType)
		case size <= max && (err != nil || !bytes.Equal(got, content)):
			t.Errorf("%d bytes: got %d bytes, err %v", size, len(got), err)
		}
	}
}

// A file whose stat says less than it holds (as a file that grew since
// the stat does) is still read whole up to max and refused past it:
// procfs files stat as 0 bytes and read as their content.
func TestReadSmallMoreThanStat(t *testing.T) {
	want, err := os.ReadFile("/proc/sys/kernel/ostype")
	if err != nil || len(want) < 2 {
		t.Fatalf("this test reads /proc/sys/kernel/ostype (a 0-byte stat with content); got %q, %v", want, err)
	}
	var st os.FileInfo
	if st, err = os.Stat("/proc/sys/kernel/ostype"); err != nil || st.Size() != 0 {
		t.Fatalf("/proc/sys/kernel/ostype should stat as 0 bytes: %v, %v", st, err)
	}
	r := Resolver{Base: "/proc/sys"}
	got, err := r.ReadSmall("/kernel", "/kernel/ostype", 64)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
	if got, err := r.ReadSmall("/kernel", "/kernel/ostype", len(want)-1); codeOf(err) != diag.PathType {
		t.Fatalf("max %d of a %d-byte file: got %q, %v; want %s", len(want)-1, len(want), got, err, diag.PathType)
	}
}
