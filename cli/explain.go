package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/grant"
)

func newExplain(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "explain DIR",
		Short: "List every grant in a bundle: what, how much, why, and from which fact",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			m, err := loadManifest(args[0])
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(m)
			}
			fmt.Fprintf(g.stdout, "profile %s  agent %s  deployment %s (%s)\nimage %s %s at %s\n\n",
				m.Profile, m.Agent, m.Deployment, m.Topology, m.Image.Version, m.Image.Digest, m.Image.Rootfs)
			w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tACCESS\tSUBJECT\tDETAIL\tFACT\tWHY")
			for _, gr := range m.Grants {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", gr.Kind, gr.Access, gr.Subject, detail(gr), gr.Fact, gr.Reason)
			}
			return w.Flush()
		},
	}
}

// detail is the one-line rendering of a grant's kind-specific fields.
func detail(g grant.Grant) string {
	switch g.Kind {
	case grant.Process:
		if len(g.Args) > 0 {
			return strings.Join(g.Args, " ")
		}
		return g.Value
	case grant.Mount:
		switch g.Type {
		case "bind":
			return "<- " + g.Source
		case "erofs":
			return "erofs <- " + g.Source + " " + g.Value
		}
		return g.Type + " " + strings.Join(g.Options, ",")
	case grant.Egress:
		return g.Proto + "/" + strconv.Itoa(g.Port) + " " + g.Value
	case grant.Route:
		d := "gateway:" + strconv.Itoa(g.Port) + " " + g.Value + " -> " + g.Source
		var methods, tools []string
		for _, o := range g.Options {
			if v, ok := strings.CutPrefix(o, "method="); ok {
				methods = append(methods, v)
			} else if v, ok := strings.CutPrefix(o, "tool="); ok {
				tools = append(tools, v)
			}
		}
		if g.Subject == "mcp" {
			// The scope is authority: shown even when empty.
			d += " methods [" + strings.Join(methods, " ") + "] tools [" + strings.Join(tools, " ") + "]"
		}
		return d
	case grant.Rootfs:
		return g.Source + " " + g.Value
	}
	return g.Value
}

func loadManifest(dir string) (*bundle.Manifest, error) {
	files, err := bundle.Read(dir)
	if err != nil {
		return nil, exitWith(ExitInternal, err)
	}
	m, err := files.Manifest()
	if err != nil {
		return nil, exitWith(ExitRefused, err)
	}
	return m, nil
}
