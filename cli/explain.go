package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

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
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", gr.Kind(), gr.Access(), gr.Subject(), detail(gr), gr.Why().Fact, gr.Why().Reason)
			}
			return w.Flush()
		},
	}
}

// detail is the one-line rendering of a grant's kind-specific fields.
func detail(g grant.Grant) string {
	switch g := g.(type) {
	case grant.Argv:
		return strings.Join(g.Words, " ")
	case grant.Cwd:
		return g.Dir
	case grant.NoNewPrivileges:
		return strconv.FormatBool(g.On)
	case grant.Terminal:
		return strconv.FormatBool(g.On)
	case grant.Capabilities:
		return "none"
	case grant.Identity:
		return strconv.FormatUint(uint64(g.ID), 10)
	case grant.Env:
		return g.Value
	case grant.Hostname:
		return g.Name
	case grant.Mount:
		switch g.Type {
		case "bind":
			return "<- " + g.Source
		case "erofs":
			return "erofs <- " + g.Source + " " + g.Digest
		}
		return g.Type + " " + strings.Join(g.Options, ",")
	case grant.Egress:
		return g.Proto + "/" + strconv.Itoa(g.Port) + " " + g.Purpose
	case grant.Route:
		d := "gateway:" + strconv.Itoa(g.Port) + " " + g.Method + " " + g.Path + " -> " + g.Upstream
		if g.Purpose == "mcp" {
			// The scope is authority: shown even when empty.
			d += " methods [" + strings.Join(g.Methods, " ") + "] tools [" + strings.Join(g.Tools, " ") + "]"
		}
		return d
	case grant.Rootfs:
		return g.Path + " " + g.Version + " " + g.Digest
	case grant.Rlimit:
		return strconv.FormatUint(g.Max, 10)
	case grant.CgroupMax:
		return strconv.FormatInt(g.Max, 10)
	case grant.CPUQuota:
		return strconv.FormatFloat(g.CPUs, 'f', -1, 64)
	case grant.OutputLimit:
		return strconv.FormatInt(g.Bytes, 10)
	case grant.WallLimit:
		return strconv.FormatInt(int64(g.Wall/time.Second), 10)
	case grant.NetworkMode:
		return g.Mode
	case grant.DirectFS:
		return strconv.FormatBool(g.On)
	}
	return ""
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
