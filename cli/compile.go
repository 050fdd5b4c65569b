package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
)

type compileOptions struct {
	*globals
	facts, registry string
	out, check      string
	resolveRoot     string
}

func newCompile(g *globals) *cobra.Command {
	o := &compileOptions{globals: g}
	cmd := &cobra.Command{
		Use:   "compile --facts F --registry R (--out DIR | --check DIR)",
		Short: "Compile facts into a bundle: config.json, egress.json, manifest.json",
		Long: `Compile checks the facts against the registry and the embedded profile the
facts name, and writes the bundle. Refused input is reported as diagnostics
with stable codes (exit 1) and nothing is written. With --check, the bundle
is compiled in memory and compared with DIR (exit 5 on drift).`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return o.run() },
	}
	f := cmd.Flags()
	f.StringVar(&o.facts, "facts", "", "facts file (.json or .cue)")
	f.StringVar(&o.registry, "registry", "", "registry file (.json or .cue)")
	f.StringVar(&o.out, "out", "", "directory to write the bundle into")
	f.StringVar(&o.check, "check", "", "compare against the bundle in this directory instead of writing")
	f.StringVar(&o.resolveRoot, "resolve-root", "", "resolve bind sources beneath this directory instead of / (a host image or a test tree)")
	return cmd
}

func (o *compileOptions) run() error {
	if o.facts == "" || o.registry == "" {
		return usageError{fmt.Errorf("--facts and --registry are required")}
	}
	if (o.out == "") == (o.check == "") {
		return usageError{fmt.Errorf("give exactly one of --out and --check")}
	}
	in, diags, err := readInputs(o.facts, o.registry)
	if err != nil {
		return err
	}
	if len(diags) > 0 {
		return o.refuse(diags)
	}
	res, diags := compiler.Compile(in, compiler.Options{Resolver: pathsafe.Resolver{Base: o.resolveRoot}})
	if len(diags) > 0 {
		return o.refuse(diags)
	}
	if o.check != "" {
		return o.compare(res.Files)
	}
	if err := res.Files.Write(o.out); err != nil {
		return exitWith(ExitInternal, err)
	}
	if o.json() {
		return o.printJSON(map[string]any{"ok": true, "out": o.out, "outputs": res.Manifest.Outputs, "grants": len(res.Plan.Grants)})
	}
	fmt.Fprintf(o.stdout, "compiled %s for agent %s (%d grants) into %s\n", res.Manifest.Profile, res.Manifest.Agent, len(res.Plan.Grants), o.out)
	return nil
}

// readInputs reads facts and registry through the one bounded reader
// (schema.ReadInput); refusals of either are returned together.
func readInputs(facts, registry string) (compiler.Inputs, diag.List, error) {
	var in compiler.Inputs
	var diags diag.List
	for _, r := range []struct {
		file, path string
		into       *schema.Input
	}{{facts, "", &in.Facts}, {registry, "registry", &in.Registry}} {
		got, err := schema.ReadInput(r.file, r.path)
		var l diag.List
		switch {
		case errors.As(err, &l):
			diags = append(diags, l...)
		case err != nil:
			return in, nil, exitWith(ExitInternal, err)
		}
		*r.into = got
	}
	return in, diags, nil
}

// refuse prints diagnostics once, in the chosen format.
func (g *globals) refuse(diags diag.List) error {
	return g.refuseWith(diags, "; nothing was written")
}

// refuseWith is refuse with its own closing note.
func (g *globals) refuseWith(diags diag.List, note string) error {
	if g.json() {
		if err := g.printJSON(map[string]any{"ok": false, "diagnostics": diags}); err != nil {
			return err
		}
	} else {
		for _, d := range diags {
			fmt.Fprintln(g.stderr, d.String())
		}
		fmt.Fprintf(g.stderr, "paseo-policy: refused: %d problem(s)%s\n", len(diags), note)
	}
	return exitWith(ExitRefused, nil)
}

// compare reports drift between a fresh compile and a committed bundle.
// pins.json records host identity, not policy, and is not compared.
func (o *compileOptions) compare(fresh bundle.Files) error {
	var drift []string
	var report strings.Builder
	for _, name := range fresh.Names() {
		if name == bundle.PinsFile {
			continue
		}
		old, err := os.ReadFile(filepath.Join(o.check, filepath.FromSlash(name)))
		if err != nil {
			drift = append(drift, name)
			fmt.Fprintf(&report, "%s: missing from %s\n", name, o.check)
			continue
		}
		if !bytes.Equal(old, fresh[name]) {
			drift = append(drift, name)
			fmt.Fprintf(&report, "%s differs (-committed +compiled):\n%s", name, cmp.Diff(strings.Split(string(old), "\n"), strings.Split(string(fresh[name]), "\n")))
		}
	}
	if o.json() {
		if err := o.printJSON(map[string]any{"ok": len(drift) == 0, "drift": drift}); err != nil {
			return err
		}
	} else if len(drift) == 0 {
		fmt.Fprintf(o.stdout, "%s is up to date\n", o.check)
	} else {
		fmt.Fprint(o.stdout, report.String())
	}
	if len(drift) > 0 {
		return exitWith(ExitDrift, fmt.Errorf("%s drifted from the compiled bundle: %s", o.check, strings.Join(drift, ", ")))
	}
	return nil
}
