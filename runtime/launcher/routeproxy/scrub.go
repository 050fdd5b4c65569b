package routeproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
)

// The provider key never reaches the sandbox in an answer (issue 31): a
// provider or a private gateway (supervise --model-ca) may echo the
// credential it got in an error body or a header. The route replaces the
// key's spellings (its bytes, base64 in both alphabets at each of the 3
// alignments, padded or not, URL-escaped, JSON-escaped) in every answer
// header and, while streaming, in the body: byte for byte with '*', so
// lengths (Content-Length, JSON string boundaries) stay as they were. A
// stream is never buffered whole: only a tail that could still begin a
// spelling is held back until the next bytes show whether it does, and an
// SSE event's end ("\n\n") never can, so events pass as they come.

// minSpelling: an encoded spelling shorter than this is not replaced (it
// would match ordinary text); keys are far longer.
const minSpelling = 8

// keySpellings are the byte strings the route replaces for key.
func keySpellings(key []byte) [][]byte {
	var out [][]byte
	add := func(b []byte) {
		if len(b) >= minSpelling || bytes.Equal(b, key) {
			if !slices.ContainsFunc(out, func(o []byte) bool { return bytes.Equal(o, b) }) && len(b) > 0 {
				out = append(out, slices.Clone(b))
			}
		}
	}
	add(key)
	// Base64: of the key after 0, 1 or 2 other bytes, the characters that
	// only the key's bits decide (neither the bytes before it nor what
	// follows or the padding): whatever surrounds the key in an encoded
	// text, these characters are in it.
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for a := range 3 {
			buf := append(make([]byte, a), key...)
			s := enc.EncodeToString(buf)
			start := (8*a + 5) / 6
			end := 8 * len(buf) / 6
			if start < end {
				add([]byte(s[start:end]))
			}
		}
	}
	add([]byte(url.QueryEscape(string(key))))
	add([]byte(url.PathEscape(string(key))))
	// JSON: Go's escaping (<, >, & as \u003c ...), the minimal one (only "
	// and \), and with / escaped as some encoders do.
	if j, err := json.Marshal(string(key)); err == nil {
		add(j[1 : len(j)-1])
	}
	minimal := strings.ReplaceAll(strings.ReplaceAll(string(key), `\`, `\\`), `"`, `\"`)
	add([]byte(minimal))
	add([]byte(strings.ReplaceAll(minimal, "/", `\/`)))
	return out
}

// scrubber replaces spellings in place, same length.
type scrubber struct {
	spellings [][]byte
	count     *atomic.Int64
}

func newScrubber(key []byte, count *atomic.Int64) *scrubber {
	return &scrubber{spellings: keySpellings(key), count: count}
}

// replace masks every spelling in b.
func (s *scrubber) replace(b []byte) {
	for _, sp := range s.spellings {
		for from := 0; ; {
			i := bytes.Index(b[from:], sp)
			if i < 0 {
				break
			}
			i += from
			for j := range sp {
				b[i+j] = '*'
			}
			s.count.Add(1)
			from = i + len(sp)
		}
	}
}

// hold is how many bytes at b's end could begin a spelling: for each
// spelling, the earliest place in its reach from the end where its first
// byte starts a prefix of it.
func (s *scrubber) hold(b []byte) int {
	best := 0
	for _, sp := range s.spellings {
		win := b[len(b)-min(len(sp)-1, len(b)):]
		for off := 0; len(win)-off > best; {
			i := bytes.IndexByte(win[off:], sp[0])
			if i < 0 {
				break
			}
			i += off
			if len(win)-i > best && bytes.HasPrefix(sp, win[i:]) {
				best = len(win) - i
				break
			}
			off = i + 1
		}
	}
	return best
}

func (s *scrubber) header(h http.Header) {
	for name, vals := range h {
		for i, v := range vals {
			b := []byte(v)
			s.replace(b)
			vals[i] = string(b)
		}
		nb := []byte(name)
		s.replace(nb)
		if string(nb) != name {
			delete(h, name) // a header named by the key carries it: dropped
		}
	}
}

// clear forgets the spellings (they are the key).
func (s *scrubber) clear() {
	for _, sp := range s.spellings {
		clear(sp)
	}
	s.spellings = nil
}

// scrubBody streams src with every spelling replaced.
type scrubBody struct {
	s       *scrubber
	src     io.ReadCloser
	buf     []byte // read, scrubbed, not yet handed out: ready, then held
	ready   int    // how much of buf may be handed out
	err     error
	readBuf []byte
}

func (b *scrubBody) Read(p []byte) (int, error) {
	for b.ready == 0 {
		if b.err != nil {
			if len(b.buf) > 0 {
				// The stream ended: what was held cannot be continued.
				b.ready = len(b.buf)
				break
			}
			return 0, b.err
		}
		n, err := b.src.Read(b.readBuf)
		b.err = err
		if n == 0 && err == nil {
			continue
		}
		b.buf = append(b.buf, b.readBuf[:n]...)
		b.s.replace(b.buf)
		if err != nil {
			b.ready = len(b.buf)
		} else {
			b.ready = len(b.buf) - b.s.hold(b.buf)
		}
	}
	n := copy(p, b.buf[:b.ready])
	b.buf = b.buf[n:]
	b.ready -= n
	if len(b.buf) == 0 {
		b.buf = b.buf[:0:0]
	}
	return n, nil
}

func (b *scrubBody) Close() error {
	b.s.clear()
	return b.src.Close()
}

// scrubResponse replaces key's spellings in resp's headers and body.
func scrubResponse(resp *http.Response, key []byte, count *atomic.Int64) {
	s := newScrubber(key, count)
	s.header(resp.Header)
	// Trailers arrive after the body, past any check here; providers send
	// none, so none are passed on.
	resp.Trailer = nil
	resp.Body = &scrubBody{s: s, src: resp.Body, readBuf: make([]byte, 8<<10)}
}
