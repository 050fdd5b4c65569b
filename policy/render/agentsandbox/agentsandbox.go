// Package agentsandbox renders a bundle's plan of grants as
// kubernetes-sigs/agent-sandbox resources (API group agents.x-k8s.io,
// v1beta1): a SandboxTemplate carrying the Pod and the NetworkPolicy's
// rules, a SandboxWarmPool of no warm pods over it, and the SandboxClaim
// that starts the agent's Sandbox from it, beside the ConfigMap and
// CiliumNetworkPolicy the Kubernetes rendering makes.
//
// It is a wrapping of policy/render/kubernetes, not a second renderer: the
// Pod spec, the egress rules, the ConfigMap and the Cilium policy are that
// rendering's objects, and its trace and gaps are carried over with each
// field's path moved to where the template holds it. So every grant the
// Kubernetes rendering refuses (an unknown grant kind among them) is
// refused here too, with the same PP-KUBE-RENDER diagnostics.
//
// The types below are our own small ones, not the agent-sandbox module's
// (its go.mod would move the product's dependencies): the fields and JSON
// spellings are those of sigs.k8s.io/agent-sandbox v1.0.1's api/v1beta1 and
// extensions/api/v1beta1, and test/kubernetes decodes every golden strictly
// into that module's types and validates it against its CRDs' schemas.
package agentsandbox

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// API versions of the agent-sandbox resources (v1.0.1).
const (
	CoreAPIVersion       = "agents.x-k8s.io/v1beta1"
	ExtensionsAPIVersion = "extensions.agents.x-k8s.io/v1beta1"
)

// SandboxTemplate is agent-sandbox's extensions SandboxTemplate.
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateSpec is the blueprint (podTemplate, service) and the
// template's policies. NetworkPolicy is never nil here: a nil one makes the
// controller apply its own default, which allows the public internet.
type SandboxTemplateSpec struct {
	PodTemplate                PodTemplate        `json:"podTemplate"`
	Service                    *bool              `json:"service,omitempty"`
	NetworkPolicy              *NetworkPolicySpec `json:"networkPolicy"`
	NetworkPolicyManagement    string             `json:"networkPolicyManagement"`
	EnvVarsInjectionPolicy     string             `json:"envVarsInjectionPolicy"`
	VolumeClaimTemplatesPolicy string             `json:"volumeClaimTemplatesPolicy"`
}

// PodTemplate is the Pod a Sandbox runs: its labels and annotations, and
// its spec.
type PodTemplate struct {
	Metadata PodMetadata    `json:"metadata"`
	Spec     corev1.PodSpec `json:"spec"`
}

// PodMetadata is the part of a Pod's metadata a template carries.
type PodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// NetworkPolicySpec is the template's restricted NetworkPolicy: the
// controller adds the pod selector (the template's pods) and policyTypes
// Ingress and Egress; an empty list denies that direction.
type NetworkPolicySpec struct {
	Ingress []networkingv1.NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress  []networkingv1.NetworkPolicyEgressRule  `json:"egress,omitempty"`
}

// SandboxWarmPool keeps Replicas sandboxes of a template started ahead of
// their claims.
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              SandboxWarmPoolSpec `json:"spec"`
}

// SandboxWarmPoolSpec names the template and how many warm sandboxes.
type SandboxWarmPoolSpec struct {
	Replicas    *int32 `json:"replicas"`
	TemplateRef Ref    `json:"sandboxTemplateRef"`
}

// SandboxClaim asks for a Sandbox from a warm pool (or, when the pool is
// empty, a new one from its template).
type SandboxClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              SandboxClaimSpec `json:"spec"`
}

// SandboxClaimSpec names the warm pool.
type SandboxClaimSpec struct {
	WarmPoolRef Ref `json:"warmPoolRef"`
}

// Ref names an object of the same namespace.
type Ref struct {
	Name string `json:"name"`
}

// Rendering is the plan as agent-sandbox resources, with the trace of
// every field and the grants they cannot carry.
type Rendering struct {
	ConfigMap *corev1.ConfigMap // nil when the Pod mounts no bundle file
	Template  *SandboxTemplate
	WarmPool  *SandboxWarmPool
	Claim     *SandboxClaim
	Cilium    *kubernetes.CiliumNetworkPolicy // nil when the plan names no host
	Gateway   *kubernetes.Gateway             // the Kubernetes rendering's, nil unless asked for
	Trace     []kubernetes.Trace
	Gaps      []kubernetes.Gap
}

// Render renders files, a bundle the caller has verified, for
// agent-sandbox. The options are the Kubernetes rendering's.
func Render(files bundle.Files, opt kubernetes.Options) (*Rendering, error) {
	k, err := kubernetes.Render(files, opt)
	if err != nil {
		return nil, err
	}
	return wrap(k)
}

func wrap(k *kubernetes.Rendering) (*Rendering, error) {
	name := k.Pod.Name
	tmplObj := "SandboxTemplate/" + name
	out := &Rendering{ConfigMap: k.ConfigMap, Cilium: k.Cilium, Gateway: k.Gateway}
	meta := func() metav1.ObjectMeta {
		labels := map[string]string{}
		for key, v := range k.Pod.Labels {
			labels[key] = v
		}
		return metav1.ObjectMeta{Name: name, Labels: labels}
	}
	np := &NetworkPolicySpec{Ingress: k.NetworkPolicy.Spec.Ingress, Egress: k.NetworkPolicy.Spec.Egress}
	out.Template = &SandboxTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: ExtensionsAPIVersion, Kind: "SandboxTemplate"},
		ObjectMeta: meta(),
		Spec: SandboxTemplateSpec{
			PodTemplate: PodTemplate{
				Metadata: PodMetadata{Labels: k.Pod.Labels, Annotations: k.Pod.Annotations},
				Spec:     k.Pod.Spec,
			},
			Service:                    ptr(false),
			NetworkPolicy:              np,
			NetworkPolicyManagement:    "Managed",
			EnvVarsInjectionPolicy:     "Disallowed",
			VolumeClaimTemplatesPolicy: "Disallowed",
		},
	}
	out.WarmPool = &SandboxWarmPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: ExtensionsAPIVersion, Kind: "SandboxWarmPool"},
		ObjectMeta: meta(),
		Spec:       SandboxWarmPoolSpec{Replicas: ptr(int32(0)), TemplateRef: Ref{Name: name}},
	}
	out.Claim = &SandboxClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: ExtensionsAPIVersion, Kind: "SandboxClaim"},
		ObjectMeta: meta(),
		Spec:       SandboxClaimSpec{WarmPoolRef: Ref{Name: name}},
	}

	fixed := func(obj, field, value, reason string) {
		out.Trace = append(out.Trace, kubernetes.Trace{Object: obj, Field: field, Value: value, Reason: reason})
	}
	for _, tr := range k.Trace {
		obj, field := tr.Object, tr.Field
		switch {
		case k.Gateway.Owns(obj):
			// The gateway's objects are plain Kubernetes objects beside
			// the template: no controller makes them.
		case obj == "Pod/"+name:
			obj = tmplObj
			switch {
			case strings.HasPrefix(field, "spec"):
				field = "spec.podTemplate." + field
			case strings.HasPrefix(field, "metadata.annotations["), strings.HasPrefix(field, "metadata.labels["):
				field = "spec.podTemplate." + field
			default:
				return nil, fmt.Errorf("agentsandbox: the Pod's field %s has no place in the template", field)
			}
		case obj == "NetworkPolicy/"+name:
			obj = tmplObj
			switch {
			case field == "spec.policyTypes":
				// The controller sets policyTypes; the template says
				// Managed so that it does (below).
				continue
			case strings.HasPrefix(field, "spec.egress"), strings.HasPrefix(field, "spec.ingress"):
				field = "spec.networkPolicy." + strings.TrimPrefix(field, "spec.")
			default:
				return nil, fmt.Errorf("agentsandbox: the NetworkPolicy's field %s has no place in the template", field)
			}
		case strings.HasPrefix(obj, "ConfigMap/"), strings.HasPrefix(obj, "CiliumNetworkPolicy/"):
		default:
			return nil, fmt.Errorf("agentsandbox: a traced object %s the wrapping does not know", obj)
		}
		tr.Object, tr.Field = obj, field
		out.Trace = append(out.Trace, tr)
	}
	fixed(tmplObj, "spec.networkPolicyManagement", "Managed", "the controller makes one NetworkPolicy for the template's pods with policyTypes Ingress and Egress and the rules of spec.networkPolicy: deny by default in both directions, only the plan's rules pass (a nil networkPolicy would get the controller's default, which allows the public internet)")
	fixed(tmplObj, "spec.service", "false", "no grant admits a connection to the sandbox: no Service for it; the daemon speaks to it over stdio")
	fixed(tmplObj, "spec.envVarsInjectionPolicy", "Disallowed", "the environment is the plan's env grants: a claim may not add or change a variable")
	fixed(tmplObj, "spec.volumeClaimTemplatesPolicy", "Disallowed", "the mounts are the plan's mount grants: a claim may not add a volume")
	fixed("SandboxWarmPool/"+name, "spec.replicas", "0", "no sandbox is started before its claim: a warm Pod would run the plan's argv with no one attached and spend its activeDeadlineSeconds waiting; raise it only for a plan launched again and again")
	fixed("SandboxWarmPool/"+name, "spec.sandboxTemplateRef.name", name, "the template above")
	fixed("SandboxClaim/"+name, "spec.warmPoolRef.name", name, "the pool above; with no warm sandbox the controller creates one from its template, labelled so the template's NetworkPolicy selects it")
	out.Gaps = k.Gaps
	return out, nil
}

// Objects are the rendered objects in the order they apply: the ConfigMap
// before the template whose Pod mounts it, the template before the pool
// and the pool before the claim that name them, then the Cilium policy.
func (r *Rendering) Objects() []any {
	var out []any
	if r.Gateway != nil {
		out = append(out, r.Gateway.Objects()...)
	}
	if r.ConfigMap != nil {
		out = append(out, r.ConfigMap)
	}
	out = append(out, r.Template, r.WarmPool, r.Claim)
	if r.Cilium != nil {
		out = append(out, r.Cilium)
	}
	return out
}

// YAML is the objects as one multi-document YAML stream, keys sorted (the
// same rendering is always the same bytes).
func (r *Rendering) YAML() ([]byte, error) {
	return kubernetes.Stream("agent-sandbox", r.Objects())
}

func ptr[T any](v T) *T { return &v }
