package lineserve

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// readLine reads one line from br, without its line ending (LF or CR LF). A
// last line without LF is returned at EOF unless it is blank. check sees
// the line as it grows, after every chunk, and refuses it by returning an
// error (which readLine returns): a line is bounded before it is buffered
// whole.
func readLine(br *bufio.Reader, check func(sofar []byte) error) ([]byte, error) {
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
