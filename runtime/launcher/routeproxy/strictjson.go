package routeproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// The route decides on a JSON value and forwards that value, re-encoded,
// never the agent's bytes: whatever the daemon's parser (express.json(),
// then the MCP SDK's zod schemas) reads from the forwarded body is then
// exactly what the scope judged. The decoding is stricter than Go's
// encoding/json and JavaScript's JSON.parse where the two could disagree:
// the body must be UTF-8 (no BOM, no invalid bytes), an object may name a
// key only once (JavaScript keeps the last, and case-differing keys are
// different keys to it but one to encoding/json's struct matching), and
// nothing may follow the value. Keys are compared exactly as written,
// after unescaping, as JavaScript compares them. A lone surrogate escape
// (\ud800), which encoding/json reads as U+FFFD, is forwarded as U+FFFD:
// the daemon reads the repaired value, the one that was judged.

// node is one JSON value as the route judged it.
type node struct {
	kind    kind
	lit     string // a number's literal as written, or true/false
	str     string // a string's value
	elems   []*node
	members []member
}

type member struct {
	key string
	val *node
}

type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// maxDepth bounds nesting: a JSON-RPC message is a few levels deep, and
// the tool arguments an agent sends a few more.
const maxDepth = 64

var (
	errNotJSON   = errors.New("the body is not JSON in UTF-8")
	errNotStrict = errors.New("the body is not strict JSON")
)

// decodeStrict reads data as exactly one JSON value.
func decodeStrict(data []byte) (*node, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: it holds bytes that are not UTF-8", errNotJSON)
	}
	if bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		return nil, fmt.Errorf("%w: it starts with a byte order mark", errNotJSON)
	}
	if !json.Valid(data) {
		return nil, errNotJSON
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	n, err := readNode(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: something follows the value", errNotStrict)
	}
	return n, nil
}

func readNode(dec *json.Decoder, depth int) (*node, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d", errNotStrict, maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotStrict, err)
	}
	switch t := tok.(type) {
	case nil:
		return &node{kind: kindNull}, nil
	case bool:
		return &node{kind: kindBool, lit: strconv.FormatBool(t)}, nil
	case json.Number:
		return &node{kind: kindNumber, lit: string(t)}, nil
	case string:
		return &node{kind: kindString, str: t}, nil
	case json.Delim:
		switch t {
		case '[':
			n := &node{kind: kindArray}
			for dec.More() {
				e, err := readNode(dec, depth+1)
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, e)
			}
			_, err := dec.Token()
			return n, err
		case '{':
			n := &node{kind: kindObject}
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("%w: %v", errNotStrict, err)
				}
				key, _ := k.(string)
				if seen[key] {
					return nil, fmt.Errorf("%w: an object names the key %q twice", errNotStrict, key)
				}
				seen[key] = true
				v, err := readNode(dec, depth+1)
				if err != nil {
					return nil, err
				}
				n.members = append(n.members, member{key, v})
			}
			_, err := dec.Token()
			return n, err
		}
	}
	return nil, errNotStrict
}

// get is an object's member by its exact key.
func (n *node) get(key string) (*node, bool) {
	if n == nil || n.kind != kindObject {
		return nil, false
	}
	for _, m := range n.members {
		if m.key == key {
			return m.val, true
		}
	}
	return nil, false
}

// encode writes n compactly, members in the order they came. Strings are
// escaped the one way encode chooses, whatever escapes the agent used.
func (n *node) encode(b *bytes.Buffer) {
	switch n.kind {
	case kindNull:
		b.WriteString("null")
	case kindBool, kindNumber:
		b.WriteString(n.lit)
	case kindString:
		writeString(b, n.str)
	case kindArray:
		b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			e.encode(b)
		}
		b.WriteByte(']')
	case kindObject:
		b.WriteByte('{')
		for i, m := range n.members {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, m.key)
			b.WriteByte(':')
			m.val.encode(b)
		}
		b.WriteByte('}')
	}
}

func (n *node) bytes() []byte {
	var b bytes.Buffer
	n.encode(&b)
	return b.Bytes()
}

const hexDigits = "0123456789abcdef"

// writeString escapes what JSON requires (the quote, the backslash and
// control characters) and U+2028/U+2029, and nothing else.
func writeString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x2028 || r == 0x2029:
			b.WriteString(`\u`)
			for shift := 12; shift >= 0; shift -= 4 {
				b.WriteByte(hexDigits[(r>>shift)&0xf])
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
