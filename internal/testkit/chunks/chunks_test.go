package chunks

import (
	"strings"
	"testing"
)

// The cases the fake model's and the fake Pi's tests had for their copies.
func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want int
	}{{"", 3, 0}, {"ab", 5, 2}, {"abcdef", 3, 3}, {"abcdef", 4, 4}, {"héllo✓", 2, 2}, {"héllo ✓ wörld", 3, 3}, {"x", 0, 1}} {
		got := Split(tc.s, tc.n)
		if len(got) != tc.want || strings.Join(got, "") != tc.s || len(got) > max(tc.n, 1) {
			t.Errorf("Split(%q, %d) = %q, want %d pieces", tc.s, tc.n, got, tc.want)
		}
	}
}
