package lineserve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Frame sizes: every request line is bounded by MaxFrame, and an op
// named in Frames may grow to its own larger bound. A frame is read into
// memory whole, so the small bound is what a connection costs while it
// sends anything but those ops.

// limit is the largest frame op may send.
func (p *Protocol[R, E]) limit(op string) int { return max(p.MaxFrame, p.Frames[op]) }

// readFrame reads one request line: at most MaxFrame bytes or, for an op
// of Frames (found in the first MaxFrame bytes), that op's bound.
func (p *Protocol[R, E]) readFrame(br *bufio.Reader) ([]byte, error) {
	limit, op := p.MaxFrame, ""
	return readLine(br, func(line []byte) error {
		if len(line) > limit && op == "" {
			if op = opOf(line[:p.MaxFrame]); p.Frames[op] <= p.MaxFrame {
				if len(p.Frames) == 0 {
					return fmt.Errorf("request longer than %d bytes", p.MaxFrame)
				}
				return fmt.Errorf("request longer than %d bytes (only %s)", p.MaxFrame, p.larger())
			}
			limit = p.Frames[op]
		}
		if len(line) > limit {
			return fmt.Errorf("%s request longer than %d bytes", op, limit)
		}
		return nil
	})
}

// tooLong refuses a frame whose decoded op may not be as long as the op
// readFrame found: a duplicate "op" key can get a large frame past opOf.
func (p *Protocol[R, E]) tooLong(op string) string {
	if p.Frames[op] > p.MaxFrame {
		return fmt.Sprintf("%s request longer than %d bytes", op, p.Frames[op])
	}
	return fmt.Sprintf("only %s may be longer than %d bytes", strings.Join(p.largeOps(), ", "), p.MaxFrame)
}

// larger says which ops may be longer than MaxFrame, and how long.
func (p *Protocol[R, E]) larger() string {
	var each []string
	for _, op := range p.largeOps() {
		each = append(each, fmt.Sprintf("%s may be longer, up to %d", op, p.Frames[op]))
	}
	return strings.Join(each, "; ")
}

func (p *Protocol[R, E]) largeOps() []string {
	var ops []string
	for op, n := range p.Frames {
		if n > p.MaxFrame {
			ops = append(ops, op)
		}
	}
	slices.Sort(ops)
	return ops
}

// opOf finds the op of a frame from its first bytes (a top-level "op" key
// anywhere before the cut), so that only an op of Frames may grow past
// MaxFrame without the server buffering a large frame of any other op.
func opOf(prefix []byte) string {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return ""
		}
		if key == "op" {
			op, _ := dec.Token()
			s, _ := op.(string)
			return s
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}
