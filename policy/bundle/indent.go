package bundle

// indentCompact appends src, compact JSON as encoding/json writes it (no
// whitespace outside strings but the Encoder's final newline), indented
// with two spaces as json.Indent(dst, src, "", "  ") would: a newline and
// indent after an opening bracket and each comma, ": " after a key, empty
// objects and arrays kept as {} and []. It does not validate: src comes
// from the encoder, which only writes valid JSON. Strings, most of a
// bundle's bytes, are copied a run at a time.
func indentCompact(dst, src []byte) []byte {
	depth := 0
	open := false // after { or [: the newline waits to see if it is empty
	for i := 0; i < len(src); i++ {
		c := src[i]
		if open && c != '}' && c != ']' {
			open = false
			depth++
			dst = newline(dst, depth)
		}
		switch c {
		case '"':
			end := stringEnd(src, i)
			dst = append(dst, src[i:end]...)
			i = end - 1
		case '{', '[':
			open = true
			dst = append(dst, c)
		case ',':
			dst = append(dst, c)
			dst = newline(dst, depth)
		case ':':
			dst = append(dst, c, ' ')
		case '}', ']':
			if open {
				open = false
			} else {
				depth--
				dst = newline(dst, depth)
			}
			dst = append(dst, c)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// stringEnd returns the index just past the string literal opening at
// src[start]: past the first quote not escaped by a backslash.
func stringEnd(src []byte, start int) int {
	for j := start + 1; j < len(src); j++ {
		switch src[j] {
		case '\\':
			j++ // the escaped byte, whatever it is
		case '"':
			return j + 1
		}
	}
	return len(src)
}

func newline(dst []byte, depth int) []byte {
	dst = append(dst, '\n')
	for range depth {
		dst = append(dst, ' ', ' ')
	}
	return dst
}
