package agentsandbox

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

var opts = kubernetes.Options{Image: "paseo.test/pi@sha256:" + strings.Repeat("a", 64), GatewayIP: "192.0.2.80"}

func why(fact string) grant.Provenance { return grant.Provenance{Reason: "test", Fact: fact} }

// bundleOf is a bundle of these grants, as a compile would write it.
func bundleOf(t *testing.T, grants grant.List) bundle.Files {
	t.Helper()
	m := &bundle.Manifest{APIVersion: bundle.ManifestAPIVersion, Kind: bundle.ManifestKind, Profile: "pi-session", Deployment: "dep-1",
		Topology: "host", Agent: "Agent_1", Inputs: map[string]string{}, Outputs: map[string]string{}, Grants: grants}
	data, err := bundle.MarshalManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	files := bundle.Files{bundle.ManifestFile: data}
	if files[bundle.PinsFile], err = bundle.Marshal(&bundle.Pins{APIVersion: bundle.APIVersion, Kind: bundle.PinsKind, Manifest: bundle.Digest(data), Pins: []bundle.Pin{}}); err != nil {
		t.Fatal(err)
	}
	return files
}

func base() grant.List {
	return grant.List{
		grant.Rootfs{Path: "/img", ReadOnly: true, Version: "v1", Digest: "sha256:" + strings.Repeat("0", 64), Provenance: why("registry.image")},
		grant.Identity{Field: "uid", ID: 1000, Provenance: why("registry.image.uid")},
		grant.NetworkMode{Mode: "none", Provenance: why("registry.network")},
	}
}

// TestRefusalsPassThrough: what the Kubernetes rendering refuses, this one
// refuses with the same diagnostics (it renders nothing of its own).
func TestRefusalsPassThrough(t *testing.T) {
	_, err := Render(bundleOf(t, base()), kubernetes.Options{Image: "paseo.test/pi:latest"})
	var dl diag.List
	if !errors.As(err, &dl) || len(dl) != 1 || dl[0].Code != diag.KubeRender || dl[0].Path != "options.image" {
		t.Fatalf("want PP-KUBE-RENDER at options.image, got %v", err)
	}
}

// TestNoEgressIsDenyAll: a plan with no egress renders an empty, present
// networkPolicy (the controller denies both directions), never an absent
// one, which the controller would fill with its default that allows the
// public internet.
func TestNoEgressIsDenyAll(t *testing.T) {
	r, err := Render(bundleOf(t, base()), opts)
	if err != nil {
		t.Fatal(err)
	}
	np := r.Template.Spec.NetworkPolicy
	if np == nil || len(np.Egress) != 0 || len(np.Ingress) != 0 || r.Template.Spec.NetworkPolicyManagement != "Managed" {
		t.Fatalf("networkPolicy %+v, management %q", np, r.Template.Spec.NetworkPolicyManagement)
	}
	out, err := r.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte("\n  networkPolicy: {}\n")) {
		t.Errorf("no empty networkPolicy in\n%s", out)
	}
	for _, tr := range r.Trace {
		if strings.HasPrefix(tr.Object, "Pod/") || strings.HasPrefix(tr.Object, "NetworkPolicy/") {
			t.Errorf("a trace of an object not rendered: %s %s", tr.Object, tr.Field)
		}
	}
}

// TestUnplacedFieldRefused: a traced field the wrapping cannot place is an
// error, not a field dropped from the trace.
func TestUnplacedFieldRefused(t *testing.T) {
	k, err := kubernetes.Render(bundleOf(t, base()), opts)
	if err != nil {
		t.Fatal(err)
	}
	k.Trace = append(k.Trace, kubernetes.Trace{Object: "Service/x", Field: "spec", Reason: "test"})
	if _, err := wrap(k); err == nil {
		t.Error("a trace of an unknown object was accepted")
	}
	k.Trace[len(k.Trace)-1] = kubernetes.Trace{Object: "Pod/" + k.Pod.Name, Field: "metadata.name", Reason: "test"}
	if _, err := wrap(k); err == nil {
		t.Error("a Pod field with no place in the template was accepted")
	}
}
