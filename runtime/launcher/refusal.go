package launcher

import (
	"errors"
	"io/fs"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// PhaseError is a launch step's refusal with its stable code (diag.Launch*)
// and the step that failed. Its text is Err's, unchanged; Err is kept
// whole (Unwrap), so errors.Is sees both the code
// (errors.Is(err, diag.LaunchSecret)) and the sentinels beneath it
// (ErrSecretUnknown, fs.ErrNotExist).
type PhaseError struct {
	Code diag.Code
	Step string // what failed; the diagnostic's path is launch.<Step>
	Err  error
}

func (e *PhaseError) Error() string { return e.Err.Error() }

func (e *PhaseError) Unwrap() error { return e.Err }

// Is matches the refusal's code.
func (e *PhaseError) Is(target error) bool { c, ok := target.(diag.Code); return ok && c == e.Code }

// refused gives err its code unless it has one already (nil stays nil):
// a PhaseError's, or the state root's (statedir.Error) as a PhaseError.
func refused(code diag.Code, step string, err error) error {
	var pe *PhaseError
	var se *statedir.Error
	switch {
	case err == nil, errors.As(err, &pe):
		return err
	case errors.As(err, &se):
		return &PhaseError{Code: se.Code, Step: se.Step, Err: err}
	}
	return &PhaseError{Code: code, Step: step, Err: err}
}

// coded is a phase's error with a code: a failed preflight and a
// PhaseError keep theirs; an error another layer marked (a name that did
// not resolve, a held auth.json, a pin staging refused) gets the code for
// it; anything else is a host-side fault, diag.LaunchHost.
func coded(err error) error {
	var pre *preflight.Error
	var pe *PhaseError
	var re *sandboxnet.ResolveError
	var pse *pathsafe.Error
	var se *statedir.Error
	switch {
	case errors.As(err, &pre), errors.As(err, &pe):
		return err
	case errors.As(err, &se):
		// The state root refused (a checkpoint dir not root's only).
		return &PhaseError{Code: se.Code, Step: se.Step, Err: err}
	case errors.As(err, &pse):
		// Staging refused a pin: pathsafe's code says how (PP-PATH-*).
		return &PhaseError{Code: pse.Code, Step: "bind", Err: err}
	case errors.As(err, &re):
		return &PhaseError{Code: diag.LaunchResolve, Step: "resolve", Err: err}
	case errors.Is(err, ErrAuthFileInUse):
		return &PhaseError{Code: diag.LaunchAuthFileInUse, Step: "authfile", Err: err}
	}
	return &PhaseError{Code: diag.LaunchHost, Step: "host", Err: err}
}

// Diagnostics are the refusal's codes as diagnostics: each failed
// preflight check (PP-PREFLIGHT-* at preflight.<check>), or the launch
// step's (PP-LAUNCH-* at launch.<step>). Messages are the errors' text,
// which names paths, ids and secret references, never a secret's value.
func (e *UnavailableError) Diagnostics() diag.List {
	var pre *preflight.Error
	if errors.As(e.Err, &pre) {
		return pre.Diagnostics()
	}
	var pe *PhaseError
	if errors.As(e.Err, &pe) {
		return diag.List{{Code: pe.Code, Path: "launch." + pe.Step, Message: pe.Err.Error()}}
	}
	return nil
}

// idRefused codes an error of claiming the id: an id already taken (its
// run dir or record exists) is diag.LaunchID, another failure a host
// fault.
func idRefused(err error) error {
	if errors.Is(err, fs.ErrExist) {
		return refused(diag.LaunchID, "id", err)
	}
	return err
}
