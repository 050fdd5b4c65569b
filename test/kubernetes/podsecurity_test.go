package kubernetes_test

import (
	"path/filepath"
	"slices"
	"testing"

	psapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// TestGoldensPodSecurityRestricted evaluates every golden Pod against the
// Pod Security Standard "restricted" with the admission plugin's own
// checks. The rendering meets every check but the volume types: the plan's
// binds are hostPath volumes, which baseline and restricted forbid, so the
// Pod's namespace must be labelled privileged for volumes
// (docs/kubernetes.md, "Pod Security").
func TestGoldensPodSecurityRestricted(t *testing.T) {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	allowedFailures := []string{"hostPath volumes", "restricted volume types"}
	for _, path := range goldens(t) {
		t.Run(filepath.Base(filepath.Dir(filepath.Dir(path))), func(t *testing.T) {
			pod := decode(t, path).pod
			hostPath := false
			for _, v := range pod.Spec.Volumes {
				hostPath = hostPath || v.HostPath != nil
			}
			results := eval.EvaluatePod(psapi.LevelVersion{Level: psapi.LevelRestricted, Version: psapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec)
			flagged := false
			for _, r := range results {
				if r.Allowed {
					continue
				}
				if hostPath && slices.Contains(allowedFailures, r.ForbiddenReason) {
					flagged = true
					continue
				}
				t.Errorf("restricted: %s: %s", r.ForbiddenReason, r.ForbiddenDetail)
			}
			// The control: the evaluator does refuse the hostPath volumes.
			if hostPath && !flagged {
				t.Error("the restricted checks passed a Pod with hostPath volumes")
			}
		})
	}
}
