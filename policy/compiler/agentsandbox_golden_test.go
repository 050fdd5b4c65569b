package compiler

import (
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/agentsandbox"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// TestGoldenAgentSandbox renders every case that compiles as agent-sandbox
// resources, with the Kubernetes goldens' options, and compares them with
// testdata/<case>/golden/agent-sandbox.yaml; test/kubernetes validates those
// goldens against agent-sandbox's own CRD schemas.
func TestGoldenAgentSandbox(t *testing.T) {
	testGoldenRendering(t, "agent-sandbox.yaml", func(files bundle.Files, opt kubernetes.Options) (clusterRendering, error) {
		a, err := agentsandbox.Render(files, opt)
		if err != nil {
			return clusterRendering{}, err
		}
		y, err := a.YAML()
		return clusterRendering{yaml: y, trace: a.Trace, gaps: a.Gaps}, err
	})
}
