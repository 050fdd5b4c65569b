package compiler

import (
	"bytes"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// KubernetesGoldenOptions are the cluster facts every golden Kubernetes
// rendering uses: an image by digest and a gateway Service address (a
// documentation address; nothing connects to it).
var kubernetesGoldenOptions = kubernetes.Options{
	Image:     "paseo.test/pi-image@sha256:1111111111111111111111111111111111111111111111111111111111111111",
	GatewayIP: "192.0.2.80",
}

// TestGoldenKubernetes renders every case that compiles for Kubernetes and
// compares the objects with testdata/<case>/golden/kubernetes.yaml. It is its own
// test over the same cases as TestGolden so it moves with them as a whole.
func TestGoldenKubernetes(t *testing.T) {
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
			k, err := kubernetes.Render(r.Files, kubernetesGoldenOptions)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			got, err := k.YAML()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range gc.Secrets {
				if bytes.Contains(got, []byte(s)) {
					t.Errorf("kubernetes.yaml contains a secret from the case input")
				}
			}
			// Every grant is rendered (a field traces to it) or listed with
			// what stands in for it: nothing of the plan is dropped unsaid.
			accounted := map[string]bool{}
			for _, tr := range k.Trace {
				accounted[tr.Grant] = true
			}
			for _, g := range k.Gaps {
				accounted[g.Grant] = true
			}
			for _, g := range r.Manifest.Grants {
				if !accounted[g.Key()] {
					t.Errorf("grant %s is neither rendered nor listed as a gap", g.Key())
				}
			}
			compareGolden(t, filepath.Join(goldenDir(name), "kubernetes.yaml"), got)
			// Determinism: the same bundle renders to the same bytes.
			k2, err := kubernetes.Render(r.Files, kubernetesGoldenOptions)
			if err != nil {
				t.Fatal(err)
			}
			if again, _ := k2.YAML(); !bytes.Equal(got, again) {
				t.Error("a second rendering of the same bundle gave other bytes")
			}
		})
	}
}
