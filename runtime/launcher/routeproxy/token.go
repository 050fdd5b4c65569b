package routeproxy

import (
	"errors"
	"sync/atomic"
)

// Token is the daemon's current MCP bearer, held outside the sandbox. The
// daemon's token lives for one daemon run while a sandbox outlives the
// daemon (the supervisor's holders keep it), so the token cannot be
// written into the sandbox once: whoever starts the sandbox hands the
// proxy each new token and every request after Set carries it. Swapping
// is one atomic pointer store, so a request reads the old or the new
// token whole, never a mix. The value is never printed: Token has no
// String and errors never carry it.
type Token struct {
	v atomic.Pointer[string]
}

// MaxTokenBytes bounds a token; Paseo's is a UUID.
const MaxTokenBytes = 4096

// ErrBadToken refuses an empty, oversized or non-printable token: it goes
// into an HTTP header, where a control character would split the request.
var ErrBadToken = errors.New("the MCP token (or model key) must be 1-4096 printable ASCII characters without spaces")

// Set makes v the token every request from now on carries.
func (t *Token) Set(v []byte) error {
	if !ValidToken(v) {
		return ErrBadToken
	}
	s := string(v)
	t.v.Store(&s)
	return nil
}

// Clear forgets the value: requests are refused (503) until the next Set,
// and a launch that needs it is refused.
func (t *Token) Clear() { t.v.Store(nil) }

// ValidToken reports whether v may be a bearer.
func ValidToken(v []byte) bool {
	if len(v) == 0 || len(v) > MaxTokenBytes {
		return false
	}
	for _, c := range v {
		if c <= 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

// current is the token now, if any was set.
func (t *Token) current() (string, bool) {
	if t == nil {
		return "", false
	}
	p := t.v.Load()
	if p == nil {
		return "", false
	}
	return *p, true
}

// ErrNoToken: nothing was Set yet.
var ErrNoToken = errors.New("no value was handed over yet")

// Source is t as a model route's key source: a fresh copy of the
// current value at every call.
func (t *Token) Source() func() ([]byte, error) {
	return func() ([]byte, error) {
		v, ok := t.current()
		if !ok {
			return nil, ErrNoToken
		}
		return []byte(v), nil
	}
}
