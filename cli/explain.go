package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

func newExplain(g *globals) *cobra.Command {
	var wide bool
	var target targetFlags
	cmd := &cobra.Command{
		Use:   "explain [--target kubernetes|agent-sandbox --image REF ...] DIR",
		Short: "List every grant in a bundle: what, how much, why, and from which fact",
		Long: `Explain lists every grant: its kind, access, subject and detail, then the
fact that caused it and why it exists. The text fits the terminal (COLUMNS,
else the terminal's width, else 100 columns): long values wrap. --wide prints
one line per grant with every value in full; -o json prints the manifest.

With --target kubernetes or agent-sandbox (and render's flags) it explains that rendering
instead: each field of each object with the grant that made it, then the
grants Kubernetes has no field for and what stands in for them.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if target.target != "" {
				r, err := target.render(g, args[0])
				if err != nil {
					return err
				}
				if g.json() {
					return g.printJSON(map[string]any{"trace": r.trace, "gaps": r.gaps})
				}
				return explainTarget(g.stdout, r, outputWidth(g.stdout))
			}
			m, err := loadManifest(args[0])
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(m)
			}
			if wide {
				return explainWide(g.stdout, m)
			}
			return explainFit(g.stdout, m, outputWidth(g.stdout))
		},
	}
	cmd.Flags().BoolVar(&wide, "wide", false, "one line per grant, every value in full")
	target.add(cmd, false)
	return cmd
}

// explainWide is one line per grant, padded to the longest value: for
// grep, and for terminals wide enough.
func explainWide(w io.Writer, m *bundle.Manifest) error {
	fmt.Fprintf(w, "profile %s  agent %s  deployment %s (%s)\nimage %s %s at %s\n\n",
		m.Profile, m.Agent, m.Deployment, m.Topology, m.Image.Version, m.Image.Digest, m.Image.Rootfs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tACCESS\tSUBJECT\tDETAIL\tFACT\tWHY")
	for _, gr := range m.Grants {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", gr.Kind(), gr.Access(), gr.Subject(), detail(gr), gr.Why().Fact, gr.Why().Reason)
	}
	return tw.Flush()
}

// explainFit fits width: each grant's kind, access, subject and detail in
// columns whose long values wrap, and beneath them "fact: why", wrapped.
func explainFit(w io.Writer, m *bundle.Manifest, width int) error {
	var head []string
	head = append(head, hang(fmt.Sprintf("profile %s  agent %s  deployment %s (%s)", m.Profile, m.Agent, m.Deployment, m.Topology), width, 2)...)
	head = append(head, hang(fmt.Sprintf("image %s %s", m.Image.Version, m.Image.Digest), width, 2)...)
	head = append(head, hang("  at "+m.Image.Rootfs, width, 5)...)
	if _, err := io.WriteString(w, strings.Join(head, "\n")+"\n\n"); err != nil {
		return err
	}
	t := &table{
		cols: []column{
			{header: "KIND"}, {header: "ACCESS"},
			{header: "SUBJECT", narrow: true, floor: 32}, {header: "DETAIL", narrow: true, floor: 24},
		},
		headNote: "FACT: WHY",
		// Under ACCESS: left of the subject and detail, whose wrapped
		// lines start further right.
		noteFrom: 1,
	}
	for _, gr := range m.Grants {
		why := gr.Why()
		note := why.Fact
		if why.Reason != "" {
			note += ": " + why.Reason
		}
		t.add([]string{string(gr.Kind()), string(gr.Access()), gr.Subject(), detail(gr)}, note)
	}
	return t.render(w, width)
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
		if g.Purpose == "model" {
			// The requests and the header the key goes in are authority.
			cred := " key " + g.TokenRef + " in " + g.Credential
			if g.Login() {
				cred = " login " + g.LoginEntry + " of " + g.LoginFile + " refreshed at " + g.LoginRefresh + " in " + g.Credential
			}
			return "gateway:" + strconv.Itoa(g.Port) + " " + g.Path + " -> " + g.Upstream + " api " + g.API +
				cred + " requests [" + strings.Join(g.Requests, ", ") + "]" +
				" model " + g.Model + headersNote(g.Headers) + hostedNote(g.HostedTools)
		}
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
	case grant.FSMonitor:
		if !g.On {
			return "off"
		}
		return "gateway:" + strconv.Itoa(g.Port) + " watches " + g.Path
	case grant.Search:
		if !g.On {
			return "off"
		}
		return "gateway:" + strconv.Itoa(g.Port) + " searches " + g.Path + " from the host, client " + bundle.SearchDir + "/{" + strings.Join(bundle.SearchClientNames, ",") + "}"
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

// headersNote lists a model route's feature headers, when it has any.
func hostedNote(h []string) string {
	if len(h) == 0 {
		return ""
	}
	return " hosted tools [" + strings.Join(h, ", ") + "]"
}

func headersNote(h []string) string {
	if len(h) == 0 {
		return ""
	}
	return " headers [" + strings.Join(h, ", ") + "]"
}
