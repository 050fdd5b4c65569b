package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"paseo.dev/paseo-policy/diag"
)

// MaxInputBytes bounds a facts or registry input. Real ones are a few KiB;
// the bound keeps a wrong path (/dev/zero, a log file) from hanging or
// exhausting a compile, and keeps what reviewers read small.
const MaxInputBytes = 1 << 20

// maxInputDepth bounds nesting: the contract is a few levels deep, so
// anything deeper is not facts and only costs recursion.
const maxInputDepth = 32

// ReadInput reads one facts or registry file for a compile: it must be a
// regular file (symlinks are followed: /etc is often a tree of them) of at
// most MaxInputBytes. path is the diagnostic path of the whole input, ""
// for facts and "registry" for the registry. A refusal is a diag.List; any
// other error is I/O.
func ReadInput(file, path string) (Input, error) {
	// O_NONBLOCK so that opening a FIFO does not wait for a writer; it
	// does not change reads of a regular file.
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return Input{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Input{}, err
	}
	var l diag.List
	if !st.Mode().IsRegular() {
		l.Addf(diag.InputNotRegular, path, "%s is a %s, not a regular file", file, fileKind(st.Mode()))
		return Input{}, l
	}
	if st.Size() > MaxInputBytes {
		l.Addf(diag.InputTooLarge, path, "%s is %d bytes; inputs are at most %d", file, st.Size(), MaxInputBytes)
		return Input{}, l
	}
	// Read through a limit as well: the file may grow after the stat.
	data, err := io.ReadAll(io.LimitReader(f, MaxInputBytes+1))
	if err != nil {
		return Input{}, err
	}
	if len(data) > MaxInputBytes {
		l.Addf(diag.InputTooLarge, path, "%s grew past %d bytes while being read", file, MaxInputBytes)
		return Input{}, l
	}
	return Input{Name: filepath.Base(file), Data: data}, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// checkSize refuses in-memory input over the bound, for callers that did
// not read through ReadInput (the supervisor's request frames are smaller
// still).
func checkSize(in Input, l *diag.List) bool {
	if len(in.Data) > MaxInputBytes {
		l.Addf(diag.InputTooLarge, "", "%s is %d bytes; inputs are at most %d", in.Name, len(in.Data), MaxInputBytes)
		return false
	}
	return true
}

// jsonShape walks JSON tokens before CUE sees them and refuses duplicate
// object keys and deep nesting. encoding/json and CUE would both keep one
// of two duplicates silently, and not necessarily the one a reviewer reads
// first; so a duplicate is an error, at the path of the second.
func jsonShape(data []byte, l *diag.List) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	ok := true
	var walk func(path string, depth int) error
	walk = func(path string, depth int) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		delim, isDelim := tok.(json.Delim)
		if !isDelim {
			return nil
		}
		if depth >= maxInputDepth {
			l.Addf(diag.InputSyntax, path, "nested deeper than %d levels", maxInputDepth)
			return errStop
		}
		switch delim {
		case '{':
			seen := map[string]bool{}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return err
				}
				key, _ := tok.(string)
				child := joinPath(path, key)
				if seen[key] {
					l.Addf(diag.InputDuplicateKey, child, "key appears twice in one object; give each field once")
					ok = false
				}
				seen[key] = true
				if err := walk(child, depth+1); err != nil {
					return err
				}
			}
		case '[':
			for i := 0; dec.More(); i++ {
				if err := walk(path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
					return err
				}
			}
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	err := walk("", 0)
	if errors.Is(err, errStop) {
		return false
	}
	// Syntax errors are left to the JSON parser, which reports a position.
	return ok
}

var errStop = fmt.Errorf("stop")
