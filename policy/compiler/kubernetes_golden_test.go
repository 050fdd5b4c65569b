package compiler

import (
	"bytes"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// KubernetesGoldenOptions are the cluster facts every golden Kubernetes
// rendering uses: an image by digest and a gateway Service address (a
// documentation address; nothing connects to it).
var kubernetesGoldenOptions = kubernetes.Options{
	Image:     "paseo.test/pi-image@sha256:1111111111111111111111111111111111111111111111111111111111111111",
	GatewayIP: "192.0.2.80",
}

// kubernetesGatewayOptions are those and the gateway's, for the cases that
// ask for it (case.json kubernetesGateway): the paseo-policy image by
// digest and the name of the Secret of the route credentials.
var kubernetesGatewayOptions = func() kubernetes.Options {
	o := kubernetesGoldenOptions
	o.GatewayImage = "paseo.test/paseo-policy@sha256:2222222222222222222222222222222222222222222222222222222222222222"
	o.GatewaySecret = "paseo-gateway-credentials"
	return o
}()

// TestGoldenKubernetes renders every case that compiles for Kubernetes and
// compares the objects with testdata/<case>/golden/kubernetes.yaml. It is its own
// test over the same cases as TestGolden so it moves with them as a whole.
func TestGoldenKubernetes(t *testing.T) {
	testGoldenRendering(t, "kubernetes.yaml", func(files bundle.Files, opt kubernetes.Options) (clusterRendering, error) {
		k, err := kubernetes.Render(files, opt)
		if err != nil {
			return clusterRendering{}, err
		}
		y, err := k.YAML()
		return clusterRendering{yaml: y, trace: k.Trace, gaps: k.Gaps}, err
	})
}

// clusterRendering is what the golden tests read of a cluster rendering
// (Kubernetes or agent-sandbox): its bytes and its account of the grants.
type clusterRendering struct {
	yaml  []byte
	trace []kubernetes.Trace
	gaps  []kubernetes.Gap
}

// testGoldenRendering renders every case that compiles with render and
// compares the bytes with testdata/<case>/golden/<file>: no secret of the
// case input in them, every grant rendered or listed with its stand-in,
// and the same bytes from a second rendering.
func testGoldenRendering(t *testing.T, file string, render func(bundle.Files, kubernetes.Options) (clusterRendering, error)) {
	for _, name := range caseNames(t) {
		t.Run(name, func(t *testing.T) {
			gc, in, res := caseInputs(t, name)
			if len(gc.Expect) > 0 {
				return // a refused case has no bundle to render
			}
			r, diags := Compile(in, Options{Resolver: res})
			if r == nil {
				t.Fatalf("compile: %v", diags)
			}
			opt := kubernetesGoldenOptions
			if gc.KubernetesGateway {
				opt = kubernetesGatewayOptions
			}
			k, err := render(r.Files, opt)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			got := k.yaml
			for _, s := range gc.Secrets {
				if bytes.Contains(got, []byte(s)) {
					t.Errorf("%s contains a secret from the case input", file)
				}
			}
			// Every grant is rendered (a field traces to it) or listed with
			// what stands in for it: nothing of the plan is dropped unsaid.
			accounted := map[string]bool{}
			for _, tr := range k.trace {
				accounted[tr.Grant] = true
			}
			for _, g := range k.gaps {
				accounted[g.Grant] = true
			}
			for _, g := range r.Manifest.Grants {
				if !accounted[g.Key()] {
					t.Errorf("grant %s is neither rendered nor listed as a gap", g.Key())
				}
			}
			compareGolden(t, filepath.Join(goldenDir(name), file), got)
			// Determinism: the same bundle renders to the same bytes.
			again, err := render(r.Files, opt)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, again.yaml) {
				t.Error("a second rendering of the same bundle gave other bytes")
			}
		})
	}
}
