package respell

import (
	"slices"
	"testing"
)

func TestUTF7(t *testing.T) {
	// RFC 2152's and RFC 3501's examples.
	for _, c := range []struct {
		in   string
		imap bool
		want string
	}{{"\u263a", false, "+Jjo-"}, {"\u53f0\u5317", true, "&U,BTFw-"}, {`"`, false, "+ACI-"}} {
		if got := UTF7(c.in, c.imap); got != c.want {
			t.Errorf("UTF7(%q, %v) = %q, want %q", c.in, c.imap, got, c.want)
		}
	}
}

func TestCorpusNamesAndFamilies(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range All() {
		if !slices.Contains(Families, s.Family) {
			t.Errorf("%s: family %q is not in Families", s.Name, s.Family)
		}
		if id := s.Family + "/" + s.Name; seen[id] {
			t.Errorf("%s named twice", id)
		} else {
			seen[id] = true
		}
		if len(s.Body) == 0 || s.ContentType == "" {
			t.Errorf("%s/%s: an empty body or Content-Type", s.Family, s.Name)
		}
	}
	for _, f := range Attacking {
		if !slices.Contains(Families, f) {
			t.Errorf("attacking family %q is not in Families", f)
		}
	}
}
