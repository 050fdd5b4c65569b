package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/agentsandbox"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// targetFlags are the flags of a rendering for another engine: the target
// and the cluster facts a plan does not hold. render and explain share them.
type targetFlags struct {
	target    string
	image     string
	gatewayIP string
	gwImage   string
	gwSecret  string
}

func (f *targetFlags) add(cmd *cobra.Command, required bool) {
	help := "the engine to render for: kubernetes (a Pod) or agent-sandbox (kubernetes-sigs/agent-sandbox resources)"
	if !required {
		help = "explain a rendering for another engine (kubernetes, agent-sandbox) instead of the grants"
	}
	cmd.Flags().StringVar(&f.target, "target", "", help)
	cmd.Flags().StringVar(&f.image, "image", "", "kubernetes: the OCI image holding the plan's rootfs, by digest (name@sha256:<hex>)")
	cmd.Flags().StringVar(&f.gatewayIP, "gateway-ip", "", "kubernetes: the cluster IP of the gateway Service serving the plan's routes")
	cmd.Flags().StringVar(&f.gwImage, "gateway-image", "", "kubernetes: render the gateway too (Deployment, bundle ConfigMap, Service, policies), running this paseo-policy image, by digest")
	cmd.Flags().StringVar(&f.gwSecret, "gateway-secret", "", "kubernetes: with --gateway-image, the name of the Secret holding the routes' credentials (keys model-key, mcp-token); never a value")
}

// targetRendering is a rendering for another engine, whichever target made
// it: its objects, their YAML stream, the trace of every field and the
// grants it has no field for.
type targetRendering struct {
	objects []any
	yaml    func() ([]byte, error)
	trace   []kubernetes.Trace
	gaps    []kubernetes.Gap
}

// render renders the verified bundle in dir. The rendering is a function of
// the manifest and the files it digests, so verifying the digests first
// covers the rendering too; a bundle edited after its compile is refused.
func (f *targetFlags) render(g *globals, dir string) (*targetRendering, error) {
	if f.target != "kubernetes" && f.target != "agent-sandbox" {
		return nil, usageError{fmt.Errorf("--target must be kubernetes or agent-sandbox")}
	}
	files, err := bundle.Read(dir)
	if err != nil {
		return nil, exitWith(ExitInternal, err)
	}
	if err := files.Verify(); err != nil {
		return nil, exitWith(ExitRefused, err)
	}
	opt := kubernetes.Options{Image: f.image, GatewayIP: f.gatewayIP, GatewayImage: f.gwImage, GatewaySecret: f.gwSecret}
	var r *targetRendering
	if f.target == "kubernetes" {
		var k *kubernetes.Rendering
		if k, err = kubernetes.Render(files, opt); err == nil {
			r = &targetRendering{objects: k.Objects(), yaml: k.YAML, trace: k.Trace, gaps: k.Gaps}
		}
	} else {
		var a *agentsandbox.Rendering
		if a, err = agentsandbox.Render(files, opt); err == nil {
			r = &targetRendering{objects: a.Objects(), yaml: a.YAML, trace: a.Trace, gaps: a.Gaps}
		}
	}
	var dl diag.List
	switch {
	case errors.As(err, &dl):
		return nil, g.refuseWith(dl, "; nothing was rendered")
	case err != nil:
		return nil, exitWith(ExitRefused, err)
	}
	return r, nil
}

func newRender(g *globals) *cobra.Command {
	var f targetFlags
	var out string
	cmd := &cobra.Command{
		Use:   "render --target kubernetes|agent-sandbox --image REF [--gateway-ip IP [--gateway-image REF --gateway-secret NAME]] DIR",
		Short: "Render a bundle's plan for another engine: Kubernetes objects or agent-sandbox resources",
		Long: `Render writes the bundle's plan of grants as Kubernetes objects, one
YAML stream: the ConfigMap of the bundle files the Pod mounts, the Pod (on
RuntimeClass gvisor), its default-deny NetworkPolicy and, when the plan names
egress hosts, a CiliumNetworkPolicy. With --gateway-image and --gateway-secret
it renders the gateway serving the plan's routes as well: its policies, the
bundle in a ConfigMap of its own, its Deployment and its Service at
--gateway-ip. The bundle's digests are verified first.
-o json prints the objects, the trace of every field to its grant, and the
grants Kubernetes cannot carry with what stands in for them. explain --target
kubernetes prints the same trace as a table (docs/kubernetes.md).

--target agent-sandbox renders the same Pod and rules as
kubernetes-sigs/agent-sandbox resources: the ConfigMap, a SandboxTemplate
holding the Pod and the NetworkPolicy's rules, a SandboxWarmPool of no warm
pods and the SandboxClaim that starts the agent's Sandbox, and the
CiliumNetworkPolicy when the plan names hosts.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			r, err := f.render(g, args[0])
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(map[string]any{"objects": r.objects, "trace": r.trace, "gaps": r.gaps})
			}
			data, err := r.yaml()
			if err != nil {
				return exitWith(ExitInternal, err)
			}
			if out == "" {
				_, err = g.stdout.Write(data)
				return err
			}
			if err := os.WriteFile(out, data, 0o644); err != nil {
				return exitWith(ExitInternal, err)
			}
			return nil
		},
	}
	f.add(cmd, true)
	cmd.Flags().StringVar(&out, "out", "", "write the YAML to this file instead of stdout")
	return cmd
}

// explainTarget prints, object by object, which grant made which field of
// the rendering, then the grants with no field and what stands in for them.
func explainTarget(w io.Writer, r *targetRendering, width int) error {
	var objects []string
	byObject := map[string]*table{}
	for _, tr := range r.trace {
		t, ok := byObject[tr.Object]
		if !ok {
			t = &table{
				cols:       []column{{header: "FIELD", narrow: true, floor: 32}, {header: "VALUE", narrow: true, floor: 24}},
				headNote:   "GRANT (FACT): WHY",
				noteIndent: 4,
			}
			byObject[tr.Object] = t
			objects = append(objects, tr.Object)
		}
		note := "rendering: " + tr.Reason
		if tr.Grant != "" {
			note = tr.Grant + " (" + tr.Fact + "): " + tr.Reason
		}
		t.add([]string{tr.Field, tr.Value}, note)
	}
	for i, o := range objects {
		if i > 0 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return err
			}
		}
		if _, err := io.WriteString(w, o+"\n"); err != nil {
			return err
		}
		if err := byObject[o].render(w, width); err != nil {
			return err
		}
	}
	if len(r.gaps) == 0 {
		return nil
	}
	if _, err := io.WriteString(w, "\nno Kubernetes field; what stands in:\n"); err != nil {
		return err
	}
	for _, gp := range r.gaps {
		lines := append(hang(gp.Grant+" ("+gp.Fact+")", width, 2), hang("  "+gp.StandIn, width, 4)...)
		if _, err := io.WriteString(w, strings.Join(lines, "\n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}
