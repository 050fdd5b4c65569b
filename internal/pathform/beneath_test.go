package pathform

import "testing"

// Beneath at the edges: the root itself, a child, a sibling sharing the
// root as a prefix, a parent, and the filesystem root.
func TestBeneath(t *testing.T) {
	for _, c := range []struct {
		root, p string
		want    bool
	}{
		{"/srv/ws", "/srv/ws", true},
		{"/srv/ws", "/srv/ws/a", true},
		{"/srv/ws", "/srv/ws/a/b", true},
		{"/srv/ws", "/srv/wsx", false},
		{"/srv/ws", "/srv/ws-other/a", false},
		{"/srv/ws", "/srv", false},
		{"/srv/ws", "/srv/w", false},
		{"/srv/ws", "/other/srv/ws", false},
		{"/", "/", true},
		{"/", "/a", true},
		{"/a", "/", false},
	} {
		if got := Beneath(c.root, c.p); got != c.want {
			t.Errorf("Beneath(%q, %q) = %v, want %v", c.root, c.p, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Beneath("/srv/paseo/workspace", "/srv/paseo/workspace/proj") }); n != 0 {
		t.Errorf("Beneath allocates %.0f times a call", n)
	}
}
