package respell

import (
	"fmt"
	"strings"
)

// Generated combines the mutations: the cover's key spelling and its place
// next to the attack, the body's encoding trick, the batch around it, the
// whitespace and the id, cycling through the attacks.
func Generated() []Spelling {
	var out []Spelling
	keys := []string{"name", "Name", "NAME", "nAmE", `N\u0061me`, `\u004eAME`}
	wraps := []string{"single", "cover-first", "cover-after"}
	smuggles := []string{"plain", "utf-7", "utf-7-imap"}
	i := 0
	for _, key := range keys {
		for _, coverLast := range []bool{true, false} {
			for _, sm := range smuggles {
				if sm != "plain" && !coverLast {
					continue // a smuggled attack has no place next to the cover
				}
				for _, wrap := range wraps {
					for _, sp := range []string{"", " \n"} {
						for _, id := range []string{"7", "7.0"} {
							a := Attacks[i%len(Attacks)]
							i++
							var msg string
							ct := jsonType
							switch sm {
							case "plain":
								msg = respelled(sp, id, key, coverLast, a)
							case "utf-7":
								msg, ct = smuggled(sp, id, key, a, false), "application/json; charset=utf-7"
							case "utf-7-imap":
								msg, ct = smuggled(sp, id, key, a, true), "application/json; charset=utf-7-imap"
							}
							body := msg
							switch wrap {
							case "cover-first":
								body = batch(sp, coverCall(sp, "1"), msg)
							case "cover-after":
								body = batch(sp, msg, coverCall(sp, "1"))
							}
							name := fmt.Sprintf("%s/last=%v/%s/%s/ws=%q/id=%s/%s", key, coverLast, sm, wrap, sp, id, a.Tool)
							out = append(out, Spelling{"generated", name, ct, []byte(body)})
						}
					}
				}
			}
		}
	}
	return out
}

// All is the listed corpus then the generated one.
func All() []Spelling { return append(Listed(), Generated()...) }

// Representative is a few spellings of each family, for the acceptance
// proof, which sends them from inside a sandbox's network namespace.
func Representative() []Spelling {
	var out []Spelling
	seen := map[string]int{}
	for _, s := range Listed() {
		if seen[s.Family] < 4 || strings.Contains(s.Name, "smuggled") {
			out = append(out, s)
			seen[s.Family]++
		}
	}
	return out
}
