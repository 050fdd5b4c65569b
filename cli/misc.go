package cli

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/ocicheck"
	"paseo.dev/paseo-policy/policy/profiles"
	"paseo.dev/paseo-policy/policy/schema"
)

func newValidate(g *globals) *cobra.Command {
	var schemaDir string
	cmd := &cobra.Command{
		Use:   "validate DIR",
		Short: "Check a bundle: digests, OCI runtime-tools checks, runsc invariants",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			r, err := ocicheck.Dir(args[0], ocicheck.Options{SchemaDir: schemaDir})
			if err != nil {
				return exitWith(ExitInternal, err)
			}
			if g.json() {
				if r.Findings == nil {
					r.Findings = []ocicheck.Finding{}
				}
				if err := g.printJSON(map[string]any{"ok": r.OK(), "ran": r.Ran, "findings": r.Findings}); err != nil {
					return err
				}
			} else {
				for _, f := range r.Findings {
					fmt.Fprintf(g.stdout, "FAIL %s: %s\n", f.Check, f.Detail)
				}
				schemaNote := ""
				if schemaDir == "" {
					schemaNote = " (JSON schema not checked: give --schema-dir)"
				}
				fmt.Fprintf(g.stdout, "%d checks, %d findings%s\n", len(r.Ran), len(r.Findings), schemaNote)
			}
			if !r.OK() {
				return exitWith(ExitRefused, nil)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&schemaDir, "schema-dir", "", "the runtime-spec module's schema/ directory, to also validate config.json against its JSON schema")
	return cmd
}

func newProfiles(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "profiles",
		Short: "List the embedded launch profiles",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			names, err := profileNames()
			if err != nil {
				return exitWith(ExitInternal, err)
			}
			type row struct {
				Name    string   `json:"name"`
				Summary string   `json:"summary"`
				Egress  []string `json:"egress"`
			}
			var rows []row
			for _, n := range names {
				p, diags := schema.LoadProfile(profiles.FS, n)
				if len(diags) > 0 {
					return exitWith(ExitInternal, diags)
				}
				rows = append(rows, row{p.Name, p.Summary, p.Egress})
			}
			if g.json() {
				return g.printJSON(rows)
			}
			for _, r := range rows {
				egress := strings.Join(r.Egress, ",")
				if egress == "" {
					egress = "none"
				}
				fmt.Fprintf(g.stdout, "%-18s egress=%-28s %s\n", r.Name, egress, r.Summary)
			}
			return nil
		},
	}
}

func profileNames() ([]string, error) {
	entries, err := profiles.FS.ReadDir(".")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".cue"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}

func newVersion(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the compiler version and the contract version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if g.json() {
				return g.printJSON(map[string]string{"compiler": compiler.Version, "apiVersion": "paseo.dev/policy/v1alpha1"})
			}
			fmt.Fprintf(g.stdout, "paseo-policy %s (contract paseo.dev/policy/v1alpha1)\n", compiler.Version)
			return nil
		},
	}
}
