package schema

import "sync"

// checkedRegistries remembers registry inputs that passed every check,
// keyed by their name and bytes, with the canonical JSON their check
// produced. A check is a pure function of those two (the prechecks, the
// unknown-field walk and the schema read nothing else), so a hit stands
// for a check that would pass again with the same JSON. Refused inputs
// are never remembered: their diagnostics are always computed afresh.
//
// The cache is shared by every Loader and goroutine. It holds only
// strings and byte slices that are never written after they are stored,
// behind a mutex; callers decode their own Registry from the bytes, so
// no compile sees another's values.
var checkedRegistries = checkedInputs{max: 8}

type checkedInputs struct {
	mu  sync.Mutex
	max int // entries kept; a ninth registry empties the cache
	m   map[string][]byte
}

// checkedKey copies the input: a caller may reuse its buffer.
func checkedKey(in Input) string { return in.Name + "\x00" + string(in.Data) }

func (c *checkedInputs) get(in Input) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	data, ok := c.m[checkedKey(in)]
	return data, ok
}

func (c *checkedInputs) put(in Input, canonical []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= c.max {
		// A process sees one registry, or a few in tests; dropping all
		// bounds memory without bookkeeping.
		c.m = make(map[string][]byte, c.max)
	}
	c.m[checkedKey(in)] = canonical
}
