package mounts

import (
	"slices"
	"testing"
)

// mountinfo escapes space, tab, newline and backslash in octal; a mount
// point is compared decoded, or a run dir with a space in its path would
// look unmounted and be removed through its mounts.
func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/run/a\040b`:    "/run/a b",
		`/x\011y\012z`:   "/x\ty\nz",
		`/back\134slash`: `/back\slash`,
		`/plain`:         "/plain",
		`/short\04`:      `/short\04`,
		`/not\999octal`:  `/not\999octal`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// The one parser finds / and, among the filesystem types, this
// namespace's proc.
func TestList(t *testing.T) {
	ms, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ms, func(m Mount) bool { return m.Point == "/" }) {
		t.Errorf("no mount at /: %v", ms)
	}
	if !slices.ContainsFunc(ms, func(m Mount) bool { return m.FSType == "proc" }) {
		t.Errorf("no proc among %v", ms)
	}
	if got := Beneath("/nonexistent-paseo-dir"); len(got) != 0 {
		t.Errorf("mounts beneath a dir that does not exist: %v", got)
	}
}
