package cli

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
)

type checkRegistryOptions struct {
	*globals
	file string
}

func newCheckRegistry(g *globals) *cobra.Command {
	o := &checkRegistryOptions{globals: g}
	return &cobra.Command{
		Use:   "check-registry FILE",
		Short: "Check an operator registry on its own: every deployment, the image, the network",
		Long: `check-registry runs the checks every compile and the supervisor's start run
on the whole registry, without facts: the schema, every deployment's roots
and mappings against the never-grant list of all deployments, the image
rootfs against every root and forbidden path, and the resolver as an egress
destination. A registry with one bad entry is refused whole (exit 1), so
check it before installing it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			o.file = args[0]
			return o.run()
		},
	}
}

func (o *checkRegistryOptions) run() error {
	in, err := schema.ReadInput(o.file, "registry")
	var l diag.List
	switch {
	case errors.As(err, &l):
		return o.refuseWith(l, "")
	case err != nil:
		return exitWith(ExitInternal, err)
	}
	reg, diags := compiler.LoadRegistry(in)
	if len(diags) > 0 {
		return o.refuseWith(diags, "")
	}
	ids := slices.Sorted(maps.Keys(reg.Deployments))
	if o.json() {
		return o.printJSON(map[string]any{"ok": true, "deployments": ids})
	}
	fmt.Fprintf(o.stdout, "registry %s is valid: %d deployment(s): %v\n", o.file, len(ids), ids)
	return nil
}
