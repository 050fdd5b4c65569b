// Package cli is the paseo-policy command line: each command is a
// constructor with an options struct and a run function; errors are mapped
// to exit codes in one place (exitCode) and printed once (Main).
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/compiler"
)

// Exit codes. Stable: scripts and the supervisor rely on them.
const (
	ExitOK          = 0
	ExitRefused     = 1 // input refused: diagnostics, or a bundle that fails validation
	ExitUsage       = 2 // bad flags or arguments
	ExitWidened     = 3 // diff: something widened or needs review
	ExitUnavailable = 4 // the sandbox cannot run here (launcher preflight)
	ExitDrift       = 5 // compile --check: the committed bundle differs
	ExitInternal    = 6 // I/O or a bug
)

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

func exitWith(code int, err error) error { return &exitError{code, err} }

type usageError struct{ error }

func exitCode(err error) int {
	var ee *exitError
	var dl diag.List
	var ue usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &dl):
		return ExitRefused
	case errors.As(err, &ue):
		return ExitUsage
	}
	return ExitInternal
}

// globals are flags every command shares.
type globals struct {
	output string // text | json
	stdout io.Writer
	stderr io.Writer
}

func (g *globals) json() bool { return g.output == "json" }

func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// NewRoot builds the command tree.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "paseo-policy",
		Short:         "Compile trusted Paseo launch facts into auditable gVisor sandbox bundles",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	// Paseo's provider diagnostic runs the Pi command's binary alone with
	// --version (diagnostic-utils.ts resolveBinaryVersion): with
	// `paseo-policy pi` as the Pi command that is `paseo-policy --version`.
	root.Version = compiler.Version
	root.SetVersionTemplate("paseo-policy {{.Version}} (contract paseo.dev/policy/v1alpha1)\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "text", "output format: text or json")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if g.output != "text" && g.output != "json" {
			return usageError{fmt.Errorf("--output must be text or json")}
		}
		return nil
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newCompile(g), newExplain(g), newRender(g), newDiff(g), newValidate(g), newCheckRegistry(g), newProfiles(g), newVersion(g), newLaunch(g), newDoctor(g), newPS(g), newKill(g), newGC(g), newSupervise(g), newGit(g), newPi(g))
	return root
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	code := exitCode(err)
	if err != nil {
		var ee *exitError
		if !(errors.As(err, &ee) && ee.err == nil) {
			fmt.Fprintln(stderr, "paseo-policy:", err)
		}
		if code == ExitInternal && !errors.As(err, &ee) && isUsage(err) {
			code = ExitUsage
		}
	}
	return code
}

// isUsage recognises cobra's own argument errors (unknown command, wrong
// number of arguments), which it returns as plain errors.
func isUsage(err error) bool {
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "unknown flag", "required flag"} {
		if strings.Contains(err.Error(), p) {
			return true
		}
	}
	return false
}

// Run is the process entry point.
func Run() int { return Main(os.Args[1:], os.Stdout, os.Stderr) }
