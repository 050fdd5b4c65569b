package compiler

import (
	"bytes"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/policy/render/agentsandbox"
)

// TestGoldenAgentSandbox renders every case that compiles as agent-sandbox
// resources, with the Kubernetes goldens' options, and compares them with
// testdata/<case>/golden/agent-sandbox.yaml; test/kubernetes validates those
// goldens against agent-sandbox's own CRD schemas.
func TestGoldenAgentSandbox(t *testing.T) {
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
			a, err := agentsandbox.Render(r.Files, kubernetesGoldenOptions)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			got, err := a.YAML()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range gc.Secrets {
				if bytes.Contains(got, []byte(s)) {
					t.Errorf("agent-sandbox.yaml contains a secret from the case input")
				}
			}
			// Every grant is rendered or listed with its stand-in.
			accounted := map[string]bool{}
			for _, tr := range a.Trace {
				accounted[tr.Grant] = true
			}
			for _, g := range a.Gaps {
				accounted[g.Grant] = true
			}
			for _, g := range r.Manifest.Grants {
				if !accounted[g.Key()] {
					t.Errorf("grant %s is neither rendered nor listed as a gap", g.Key())
				}
			}
			compareGolden(t, filepath.Join(goldenDir(name), "agent-sandbox.yaml"), got)
			a2, err := agentsandbox.Render(r.Files, kubernetesGoldenOptions)
			if err != nil {
				t.Fatal(err)
			}
			if again, _ := a2.YAML(); !bytes.Equal(got, again) {
				t.Error("a second rendering of the same bundle gave other bytes")
			}
		})
	}
}
