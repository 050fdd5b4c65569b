package probe

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxRead bounds how much of a canary or environ file is read: enough for
// any planted marker, small enough that a huge or endless file (a device
// that slipped through) cannot stall or bloat the probe.
const maxRead = 1 << 20

// errText turns an error into short evidence: the errno name when there
// is one (ENOENT, EACCES...), since that is what tells a mount boundary
// from a permission check, and never a path or content.
func errText(err error) string {
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
		return errno.Error()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	var timeout interface{ Timeout() bool }
	if errors.As(err, &timeout) && timeout.Timeout() {
		return "timeout"
	}
	return err.Error()
}

// uniqueName returns prefix plus pid and random hex, so that concurrent
// runs and leftovers of a killed run never collide and a probe never
// clobbers an existing file.
func uniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail on Linux
	return fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), hex.EncodeToString(b))
}

// notConfigured is the outcome of a probe whose input was not given: the
// harness sees it rather than a silent gap.
func notConfigured(flag string) outcome {
	return outcome{Inconclusive, "not configured (-" + flag + " unset)"}
}

// readHead reads at most maxRead bytes of a file. O_NONBLOCK keeps a FIFO
// planted at a canary path from hanging the probe.
func readHead(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxRead))
}

// canaryOutcome judges one attempt to read a canary. Only content with the
// marker is an escape: a readable file without it is the sandbox's own
// file at that path, not the host's.
func canaryOutcome(data []byte, err error, marker string) outcome {
	switch {
	case err != nil:
		return outcome{Blocked, errText(err)}
	case marker == "":
		return outcome{Inconclusive, fmt.Sprintf("read %d bytes; no -canary-marker to compare", len(data))}
	case bytes.Contains(data, []byte(marker)):
		return outcome{Escaped, fmt.Sprintf("read %d bytes matching canary marker", len(data))}
	default:
		return outcome{Blocked, fmt.Sprintf("read %d bytes without the canary marker", len(data))}
	}
}

// combine folds per-target outcomes (one per canary, one per device) into
// one: any escape wins, then any inconclusive, else blocked. The evidence
// keeps every part so the harness can see which target did what.
func combine(labels []string, outs []outcome) outcome {
	verdict := Blocked
	parts := make([]string, len(outs))
	for i, o := range outs {
		parts[i] = labels[i] + ": " + o.evidence
		switch {
		case o.verdict == Escaped:
			verdict = Escaped
		case o.verdict == Inconclusive && verdict == Blocked:
			verdict = Inconclusive
		}
	}
	return outcome{verdict, strings.Join(parts, "; ")}
}

// probeLine is what createFile writes.
const probeLine = "paseo-probe was here\n"

// createFile makes a new file with O_EXCL (never overwriting anything)
// and writes a short line to it. created reports whether the file came
// into existence at all: that alone is the escape, a failed write after it
// does not undo it.
func createFile(path string) (created bool, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	_, err = f.WriteString(probeLine)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return true, err
}

// writeEscape judges an attempt to create a file where the sandbox must not
// write, cleaning up after a success so the control run leaves no trace.
func writeEscape(path, what string) outcome {
	created, err := createFile(path)
	if !created {
		return outcome{Blocked, errText(err)}
	}
	evidence := "created a file " + what
	if err != nil {
		evidence += " (writing to it failed: " + errText(err) + ")"
	}
	if rerr := os.Remove(path); rerr != nil {
		return outcome{Escaped, evidence + "; could not remove it: " + errText(rerr)}
	}
	return outcome{Escaped, evidence + "; removed again"}
}
