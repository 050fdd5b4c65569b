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

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/policy/compiler"
)

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
	// Runnable, so that its Args check (usageArgs) refuses an unknown
	// command as a usage error; with no command it prints the help as a
	// bare root would.
	root.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	root.AddCommand(newCompile(g), newExplain(g), newRender(g), newDiff(g), newValidate(g), newCheckRegistry(g), newProfiles(g), newVersion(g), newLaunch(g), newDoctor(g), newPS(g), newKill(g), newGC(g), newSupervise(g), newGateway(g), newGit(g), newPi(g))
	usageArgs(root)
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
		var pe printedError
		if !(errors.As(err, &ee) && ee.err == nil) && !errors.As(err, &pe) {
			fmt.Fprintln(stderr, "paseo-policy:", err)
		}
	}
	return code
}

// QuietLibraryLogs keeps logrus's standard logger to errors for the whole
// program (the CLI, the supervisor and each holder, which main starts
// before the CLI): runtime-tools, behind the bundle validator
// (policy/ocicheck), warns through it on every validation, and the
// validator reports findings instead. It is the program's choice, made
// once at its entry, not a side effect of importing the validator.
func QuietLibraryLogs() { logrus.SetLevel(logrus.ErrorLevel) }

// Run is the process entry point.
func Run() int { return Main(os.Args[1:], os.Stdout, os.Stderr) }
