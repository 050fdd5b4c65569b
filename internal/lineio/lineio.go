// Package lineio reads the bounded JSON-lines requests the supervisor and
// the holders serve: one reader, so both refuse an overlong or half line
// the same way.
package lineio

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// Read reads one line from br, without its line ending (LF or CR LF). A
// last line without LF is returned at EOF unless it is blank. check sees
// the line as it grows, after every chunk, and refuses it by returning an
// error (which Read returns): a line is bounded before it is buffered
// whole.
func Read(br *bufio.Reader, check func(sofar []byte) error) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if cerr := check(line); cerr != nil {
			return nil, cerr
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if len(bytes.TrimSpace(line)) > 0 && errors.Is(err, io.EOF) {
				return line, nil
			}
			return nil, err
		}
		return bytes.TrimRight(line, "\r\n"), nil
	}
}
