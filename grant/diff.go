package grant

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Change classifies one difference between two plans.
type Change struct {
	Key    string `json:"key"`
	Change string `json:"change"` // added | removed | widened | narrowed | changed
	Widens bool   `json:"widens"` // needs review: grants more, or cannot be shown to grant less
	Old    *Grant `json:"old,omitempty"`
	New    *Grant `json:"new,omitempty"`
}

// restrictive kinds take authority away; adding one narrows the sandbox and
// removing one widens it. Every other kind grants authority.
func restrictive(g Grant) bool {
	switch g.Kind {
	case Namespace, Rlimit, Cgroup, Limit, Hostname, Runtime:
		return true
	case Process:
		return g.Subject != "argv" && g.Subject != "cwd"
	}
	return false
}

// Diff compares two grant lists grant by grant. Grants are matched by Key;
// repeated keys (argv words) are matched by occurrence.
func Diff(old, new []Grant) []Change {
	oldM, oldKeys := index(old)
	newM, newKeys := index(new)
	var out []Change
	for _, k := range oldKeys {
		o := oldM[k]
		n, ok := newM[k]
		if !ok {
			out = append(out, Change{Key: k, Change: "removed", Widens: restrictive(o), Old: &o})
			continue
		}
		if c, differs := compare(o, n); differs {
			c.Key, c.Old, c.New = k, &o, &n
			out = append(out, c)
		}
	}
	for _, k := range newKeys {
		if _, ok := oldM[k]; !ok {
			n := newM[k]
			out = append(out, Change{Key: k, Change: "added", Widens: !restrictive(n), New: &n})
		}
	}
	return out
}

func index(gs []Grant) (map[string]Grant, []string) {
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
	if equal(o, n) {
		return Change{}, false
	}
	// Reasons and fact paths are explanation, not authority.
	if equalAuthority(o, n) {
		return Change{Change: "changed", Widens: false}, true
	}
	switch o.Kind {
	case Mount:
		if o.Source == n.Source && o.Type == n.Type {
			switch {
			case o.Access == RO && n.Access == RW:
				return Change{Change: "widened", Widens: true}, true
			case o.Access == RW && n.Access == RO:
				return Change{Change: "narrowed"}, true
			}
		}
	case Rlimit, Cgroup, Limit:
		ov, err1 := strconv.ParseFloat(o.Value, 64)
		nv, err2 := strconv.ParseFloat(n.Value, 64)
		if err1 == nil && err2 == nil {
			if nv > ov {
				return Change{Change: "widened", Widens: true}, true
			}
			return Change{Change: "narrowed"}, true
		}
	case Runtime:
		if o.Subject == "network" && o.Value == "sandbox" && n.Value == "none" {
			return Change{Change: "narrowed"}, true
		}
	case Route:
		if c, ok := compareScope(o, n); ok {
			return c, true
		}
	}
	return Change{Change: "changed", Widens: true}, true
}

func equal(a, b Grant) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

func equalAuthority(a, b Grant) bool {
	a.Reason, b.Reason, a.Fact, b.Fact = "", "", "", ""
	return equal(a, b)
}

// compareScope classifies a route whose only change is its MCP scope (the
// method= and tool= options): fewer entries narrow it, more widen it, a
// swap widens it. Anything else changed is left to the caller.
func compareScope(o, n Grant) (Change, bool) {
	oScope, oRest := splitScope(o.Options)
	nScope, nRest := splitScope(n.Options)
	o.Options, n.Options = oRest, nRest
	if !equalAuthority(o, n) {
		return Change{}, false
	}
	added := slices.ContainsFunc(nScope, func(s string) bool { return !slices.Contains(oScope, s) })
	if added {
		return Change{Change: "widened", Widens: true}, true
	}
	return Change{Change: "narrowed"}, true
}

func splitScope(opts []string) (scope, rest []string) {
	for _, o := range opts {
		if strings.HasPrefix(o, "method=") || strings.HasPrefix(o, "tool=") {
			scope = append(scope, o)
		} else {
			rest = append(rest, o)
		}
	}
	return scope, rest
}
