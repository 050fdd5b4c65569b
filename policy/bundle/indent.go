package bundle

// indentCompact appends src, compact JSON as encoding/json writes it (no
// whitespace outside strings but the Encoder's final newline), indented
// with two spaces as json.Indent(dst, src, "", "  ") would: a newline and
// indent after an opening bracket and each comma, ": " after a key, empty
// objects and arrays kept as {} and []. It does not validate: src comes
// from the encoder, which only writes valid JSON.
func indentCompact(dst, src []byte) []byte {
	depth := 0
	open := false // after { or [: the newline waits to see if it is empty
	inString, escaped := false, false
	for _, c := range src {
		if inString {
			dst = append(dst, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		if open && c != '}' && c != ']' {
			open = false
			depth++
			dst = newline(dst, depth)
		}
		switch c {
		case '"':
			inString = true
			dst = append(dst, c)
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

func newline(dst []byte, depth int) []byte {
	dst = append(dst, '\n')
	for range depth {
		dst = append(dst, ' ', ' ')
	}
	return dst
}
