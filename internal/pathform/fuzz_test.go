package pathform

import (
	"path"
	"strings"
	"testing"
)

// FuzzCheck: every path Check accepts is absolute, canonical, free of ..
// and control characters, and beneath itself.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "a", "/a/../b", "/a//b", "/a/", "/a\n", "/a\x00b", "/./a", "/..", "/a/.../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if code, _ := Check(p); code != "" {
			return
		}
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.Contains("/"+p+"/", "/../") {
			t.Fatalf("accepted non-canonical %q", p)
		}
		for _, r := range p {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("accepted control character in %q", p)
			}
		}
		if !Beneath(p, p) || Rel(p, p) != "." {
			t.Fatalf("%q is not beneath itself", p)
		}
		if p != "/" && Beneath(p, p+"x") {
			t.Fatalf("%q treats a sibling prefix as beneath", p)
		}
	})
}
