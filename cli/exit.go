package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
)

// Exit codes. Stable: scripts and the supervisor rely on them. exitTable
// says what each means; docs/launcher.md ("Exit codes") prints the same
// table, and TestExitTable holds the two together.
const (
	ExitOK          = 0
	ExitRefused     = 1 // input refused: diagnostics, or a bundle that fails validation
	ExitUsage       = 2 // bad flags or arguments
	ExitWidened     = 3 // diff: something widened or needs review
	ExitUnavailable = 4 // the sandbox cannot run here (launcher preflight)
	ExitDrift       = 5 // compile --check: the committed bundle differs
	ExitInternal    = 6 // I/O or a bug
	ExitAgent       = 7 // launch: the sandbox ran and the agent exited non-zero (its code on stderr)
)

// exitTable is the one exit-code map of the command line: a code, its
// name and when a command exits with it.
var exitTable = []struct {
	Code int
	Name string
	When string
}{
	{ExitOK, "ok", "done; for `launch`, the agent exited 0"},
	{ExitRefused, "refused", "input refused with diagnostics (`CODE path: message`), or a bundle that fails validation; nothing was written or run"},
	{ExitUsage, "usage", "bad flags or arguments, an unknown command"},
	{ExitWidened, "widened", "`diff`: something widened or needs review"},
	{ExitUnavailable, "unavailable", "the sandbox cannot run here (preflight, runsc, the network, the supervisor): nothing started, or `pi` lost its sandbox"},
	{ExitDrift, "drift", "`compile --check`: the committed bundle differs"},
	{ExitInternal, "internal", "I/O or a bug"},
	{ExitAgent, "agent-exited", "`launch`: the sandbox ran and the agent exited non-zero; the agent's code is on stderr (`paseo-policy: sandbox ID: the agent exited N`; with `-o json` also `exitCode` in the result line)"},
}

// exitError carries an exit code and an optional message; a nil Err means
// the command already printed what it had to say.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code, err} }

type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// printedError is an error the command has already reported (doctor's
// report): Main prints nothing more, exitCode maps what it wraps.
type printedError struct{ error }

func (e printedError) Unwrap() error { return e.error }

// exitCode maps a command's error to its exit code: the one place. The
// launcher's refusal (*launcher.UnavailableError) and a failed preflight
// (*preflight.Error, doctor's) are unavailable, whoever returns them.
func exitCode(err error) int {
	var ee *exitError
	var dl diag.List
	var ue usageError
	var unavailable *launcher.UnavailableError
	var pre *preflight.Error
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &unavailable), errors.As(err, &pre):
		return ExitUnavailable
	case errors.As(err, &dl):
		return ExitRefused
	case errors.As(err, &ue):
		return ExitUsage
	}
	return ExitInternal
}

// usageArgs makes cobra's own argument errors usage errors by type: each
// command's Args validator is wrapped, and a command with subcommands and
// no validator of its own refuses a word that names none (cobra would
// otherwise return these as plain errors, told apart only by their text).
func usageArgs(c *cobra.Command) {
	args := c.Args
	switch {
	case args != nil:
	case c.HasSubCommands() && !c.HasParent():
		// cobra's own check for the root (legacyArgs), suggestions and all.
		args = func(c *cobra.Command, a []string) error {
			if len(a) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for %q", a[0], c.CommandPath())
			if s := c.SuggestionsFor(a[0]); len(s) > 0 {
				msg += "\n\nDid you mean this?\n"
				for _, n := range s {
					msg += "\t" + n + "\n"
				}
			}
			return errors.New(msg)
		}
	default:
		args = cobra.ArbitraryArgs
	}
	c.Args = func(c *cobra.Command, a []string) error {
		if err := args(c, a); err != nil {
			return usageError{err}
		}
		return nil
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}
