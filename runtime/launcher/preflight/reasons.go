package preflight

import (
	"errors"
	"fmt"
	"strings"
)

// Why a check failed, beneath its code: the code (diag.Preflight*) says
// which check, these say which of its reasons, for callers and tests that
// must tell them apart (errors.Is(err, ErrWritable)). The messages say more
// and may change; these do not.
var (
	ErrNotRoot       = errors.New("not running as root")
	ErrKernelRelease = errors.New("the kernel release cannot be read")
	ErrKernelTooOld  = errors.New("the kernel is older than 5.6")
	ErrNotGiven      = errors.New("no path given")                            // no runsc path, no digest file
	ErrNotRegular    = errors.New("not a regular file")                       // runsc
	ErrNotExecutable = errors.New("not executable")                           // runsc
	ErrWritable      = errors.New("not root's alone")                         // runsc, an EROFS file or its directory: another user could change it
	ErrNotELF        = errors.New("not an executable ELF")                    // runsc
	ErrDynamic       = errors.New("dynamically linked")                       // runsc: PT_INTERP or DT_NEEDED
	ErrDigestFile    = errors.New("the digest file has no usable digest")     // runsc.sha256: no entry, no digest, not hex
	ErrDigestDiffers = errors.New("the digest differs from the one recorded") // runsc, an EROFS file
	ErrNoCgroup      = errors.New("neither cgroup2 nor cgroup v1 with the controllers")
	ErrControllers   = errors.New("cgroup2 lacks a required controller")
	ErrNoDigestGrant = errors.New("an EROFS mount has no digest grant")
	ErrNotChecked    = errors.New("not checked: the bundle could not be read or decoded")
)

// reasonError is a check's error with its reason: the message is err's,
// errors.Is finds the reason and whatever err wraps (fs.ErrNotExist).
type reasonError struct{ reason, err error }

func (e *reasonError) Error() string   { return e.err.Error() }
func (e *reasonError) Unwrap() []error { return []error{e.reason, e.err} }

// because is fmt.Errorf(format, a...) with reason.
func because(reason error, format string, a ...any) error {
	return &reasonError{reason, fmt.Errorf(format, a...)}
}

// joined is every problem a check found, each kept whole (Unwrap), told
// in one line.
type joined []error

func (j joined) Error() string {
	msgs := make([]string, len(j))
	for i, e := range j {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

func (j joined) Unwrap() []error { return j }
