package lineserve

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

var errLong = errors.New("too long")

func atMost(n int) func([]byte) error {
	return func(b []byte) error {
		if len(b) > n {
			return errLong
		}
		return nil
	}
}

func TestReadLine(t *testing.T) {
	// A reader buffer smaller than the lines makes readLine take several chunks.
	br := bufio.NewReaderSize(strings.NewReader("first line\r\nsecond line, longer\n"+strings.Repeat("x", 40)+"\nlast"), 16)
	for _, want := range []string{"first line", "second line, longer"} {
		got, err := readLine(br, atMost(32))
		if err != nil || string(got) != want {
			t.Fatalf("readLine = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := readLine(br, atMost(32)); !errors.Is(err, errLong) {
		t.Fatalf("a 40-byte line under a 32-byte bound: %v", err)
	}
	// The rest of the overlong line, then the unterminated last line.
	br = bufio.NewReader(strings.NewReader("last"))
	if got, err := readLine(br, atMost(32)); err != nil || string(got) != "last" {
		t.Fatalf("last line without LF: %q, %v", got, err)
	}
	if _, err := readLine(br, atMost(32)); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last line: %v, want EOF", err)
	}
	if _, err := readLine(bufio.NewReader(strings.NewReader("  \t")), atMost(32)); !errors.Is(err, io.EOF) {
		t.Fatalf("a blank half line: %v, want EOF", err)
	}
}
