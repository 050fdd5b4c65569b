package grant

import (
	"reflect"
	"strconv"
)

// Change classifies one difference between two plans.
type Change struct {
	Key    string `json:"key"`
	Change string `json:"change"` // added | removed | widened | narrowed | changed
	Widens bool   `json:"widens"` // needs review: grants more, or cannot be shown to grant less
	Old    Grant  `json:"old,omitempty"`
	New    Grant  `json:"new,omitempty"`
}

// MarshalJSON writes Old and New as tagged unions, like the manifest.
func (c Change) MarshalJSON() ([]byte, error) {
	type plain struct {
		Key    string   `json:"key"`
		Change string   `json:"change"`
		Widens bool     `json:"widens"`
		Old    *Encoded `json:"old,omitempty"`
		New    *Encoded `json:"new,omitempty"`
	}
	p := plain{Key: c.Key, Change: c.Change, Widens: c.Widens}
	if c.Old != nil {
		p.Old = ptr(c.Old.encode())
	}
	if c.New != nil {
		p.New = ptr(c.New.encode())
	}
	return marshal(p)
}

// Diff compares two grant lists grant by grant. Grants are matched by Key;
// repeated keys (argv words) are matched by occurrence.
func Diff(old, new List) []Change {
	oldM, oldKeys := index(old)
	newM, newKeys := index(new)
	var out []Change
	for _, k := range oldKeys {
		o := oldM[k]
		n, ok := newM[k]
		if !ok {
			out = append(out, Change{Key: k, Change: "removed", Widens: o.Restricts(), Old: o})
			continue
		}
		if c, differs := compare(o, n); differs {
			c.Key, c.Old, c.New = k, o, n
			out = append(out, c)
		}
	}
	for _, k := range newKeys {
		if _, ok := oldM[k]; !ok {
			n := newM[k]
			out = append(out, Change{Key: k, Change: "added", Widens: !n.Restricts(), New: n})
		}
	}
	return out
}

func index(gs List) (map[string]Grant, []string) {
	m := map[string]Grant{}
	seen := map[string]int{}
	var keys []string
	for _, g := range gs {
		k := g.Key()
		seen[k]++
		if seen[k] > 1 {
			k = k + " #" + strconv.Itoa(seen[k])
		}
		m[k] = g
		keys = append(keys, k)
	}
	return m, keys
}

// compare decides the direction of a change to one grant.
func compare(o, n Grant) (Change, bool) {
	if reflect.TypeOf(o) == reflect.TypeOf(n) && sameEncoding(o.encode(), n.encode()) {
		return Change{}, false
	}
	if sameAuthority(o, n) {
		return Change{Change: "changed", Widens: false}, true
	}
	if reflect.TypeOf(o) == reflect.TypeOf(n) {
		switch n.Against(o) {
		case Widened:
			return Change{Change: "widened", Widens: true}, true
		case Narrowed:
			return Change{Change: "narrowed"}, true
		}
	}
	return Change{Change: "changed", Widens: true}, true
}
