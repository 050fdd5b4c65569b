// Package chunks is test support shared by the fakes: the fake model and
// the fake Pi both stream a reply as deltas, cut the same way, so a test
// of either sees pieces of predictable number and size.
package chunks

import "unicode/utf8"

// Split cuts s into at most n pieces of about equal length on rune
// boundaries (at least one piece for a non-empty s); an empty s gives no
// pieces. The pieces joined are s.
func Split(s string, n int) []string {
	runes := utf8.RuneCountInString(s)
	if runes == 0 {
		return nil
	}
	n = min(max(n, 1), runes)
	out := make([]string, 0, n)
	per, extra := runes/n, runes%n
	for i := 0; i < n; i++ {
		k := per
		if i < extra {
			k++
		}
		cut := 0
		for j := 0; j < k; j++ {
			_, size := utf8.DecodeRuneInString(s[cut:])
			cut += size
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}
