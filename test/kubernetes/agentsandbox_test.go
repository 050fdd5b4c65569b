package kubernetes_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/kubernetes/pkg/apis/core"
	k8scorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	psapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/yaml"
)

// agentSandboxCRDs are the CustomResourceDefinitions of
// sigs.k8s.io/agent-sandbox (the version go.mod requires), read from the
// module cache where the Go command put the module (its zip verified
// against go.sum): the schemas the apiserver of a cluster with agent-sandbox
// installed holds these resources to. None is written here.
func agentSandboxCRDs(t *testing.T) map[string]*crdValidator {
	t.Helper()
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		goCmd = p
	}
	cmd := exec.Command(goCmd, "list", "-m", "-f", "{{.Dir}} {{.Version}}", "sigs.k8s.io/agent-sandbox")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list the agent-sandbox module: %v", err)
	}
	dir, version, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	if dir == "" || version != "v1.0.1" {
		t.Fatalf("the agent-sandbox module: %q", out)
	}
	files, err := filepath.Glob(filepath.Join(dir, "k8s", "crds", "*.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("agent-sandbox CRDs: %v %v", files, err)
	}
	vs := map[string]*crdValidator{}
	for _, f := range files {
		v := newCRDValidator(t, f)
		vs[v.kind.Kind] = v
	}
	return vs
}

// crdValidator is what the apiextensions apiserver builds from one CRD
// version to serve a create: the structural schema (defaults pruned as
// the server does), the OpenAPI schema validator, and the registry's
// create strategy (schema, embedded object meta, list types and the
// x-kubernetes-validations rules, by CEL).
type crdValidator struct {
	kind       schema.GroupVersionKind
	structural *structuralschema.Structural
	strategy   createStrategy
}

// createStrategy is the part of the registry's strategy a create runs.
type createStrategy interface {
	PrepareForCreate(context.Context, kruntime.Object)
	Validate(context.Context, kruntime.Object) field.ErrorList
}

func newCRDValidator(t *testing.T, path string) *crdValidator {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1beta1" || crd.Spec.PreserveUnknownFields {
		t.Fatalf("%s: versions %d, preserveUnknownFields %v", path, len(crd.Spec.Versions), crd.Spec.PreserveUnknownFields)
	}
	ver := crd.Spec.Versions[0]
	var internal apiextensionsinternal.CustomResourceValidation
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(ver.Schema, &internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		t.Fatalf("%s: not a structural schema: %v", path, err)
	}
	if errs := structuralschema.ValidateStructural(nil, s); len(errs) > 0 {
		t.Fatalf("%s: not a structural schema: %v", path, errs)
	}
	s = s.DeepCopy()
	if err := structuraldefaulting.PruneDefaults(s); err != nil {
		t.Fatal(err)
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	var statusSpec *apiextensionsinternal.CustomResourceSubresourceStatus
	var statusValidator apiservervalidation.SchemaValidator
	if ver.Subresources != nil && ver.Subresources.Status != nil {
		statusSpec = &apiextensionsinternal.CustomResourceSubresourceStatus{}
		if st, ok := internal.OpenAPIV3Schema.Properties["status"]; ok {
			if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&st); err != nil {
				t.Fatal(err)
			}
		}
	}
	kind := schema.GroupVersionKind{Group: crd.Spec.Group, Version: ver.Name, Kind: crd.Spec.Names.Kind}
	st := customresource.NewStrategy(nil, crd.Spec.Scope == apiextensionsv1.NamespaceScoped, kind, validator, statusValidator, s, statusSpec, nil, ver.SelectableFields)
	return &crdValidator{kind: kind, structural: s, strategy: st}
}

// validateCreate holds obj to the CRD as the apiserver does a create with
// field validation Strict (kubectl's default): a field the schema does not
// know is an error (the server would prune it), then the schema's
// defaults, then the create strategy's validation.
func (v *crdValidator) validateCreate(obj map[string]any) field.ErrorList {
	u := &unstructured.Unstructured{Object: obj}
	u.SetNamespace("paseo")
	var errs field.ErrorList
	for _, p := range structuralpruning.PruneWithOptions(u.Object, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, field.Invalid(field.NewPath(p), nil, "unknown field (strict field validation)"))
	}
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, v.structural)
	structuraldefaulting.Default(u.Object, v.structural)
	ctx := genericapirequest.WithNamespace(context.Background(), "paseo")
	v.strategy.PrepareForCreate(ctx, u)
	return append(errs, v.strategy.Validate(ctx, u)...)
}

// sandboxObjects is one golden agent-sandbox.yaml: each document as the
// apiserver receives it, and decoded strictly into agent-sandbox's types.
type sandboxObjects struct {
	raw      map[string]map[string]any // by kind
	template *extv1beta1.SandboxTemplate
	pool     *extv1beta1.SandboxWarmPool
	claim    *extv1beta1.SandboxClaim
}

func decodeSandbox(t *testing.T, path string) sandboxObjects {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	o := sandboxObjects{raw: map[string]map[string]any{}}
	for _, doc := range bytes.Split(data, []byte("\n---\n"))[1:] {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		kind, _ := m["kind"].(string)
		var v any
		switch kind {
		case "SandboxTemplate":
			o.template = &extv1beta1.SandboxTemplate{}
			v = o.template
		case "SandboxWarmPool":
			o.pool = &extv1beta1.SandboxWarmPool{}
			v = o.pool
		case "SandboxClaim":
			o.claim = &extv1beta1.SandboxClaim{}
			v = o.claim
		case "ConfigMap", "CiliumNetworkPolicy", "NetworkPolicy", "Deployment", "Service":
			continue // the Kubernetes goldens' objects (the gateway's too), validated there
		default:
			t.Fatalf("%s: an object of kind %q", path, kind)
		}
		if err := yaml.UnmarshalStrict(doc, v); err != nil {
			t.Fatalf("%s: %s does not decode strictly into agent-sandbox's type: %v", path, kind, err)
		}
		o.raw[kind] = m
	}
	if o.template == nil || o.pool == nil || o.claim == nil {
		t.Fatalf("%s: no SandboxTemplate, SandboxWarmPool or SandboxClaim", path)
	}
	return o
}

func sandboxGoldens(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", "testdata", "*", "golden", "agent-sandbox.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden agent-sandbox.yaml found (%v)", err)
	}
	return paths
}

// sandboxFromTemplate is the Sandbox the claim controller creates from a
// template on a cold start (its blueprint, as SandboxSpec inlines it), in
// the operating mode given: the object a suspend or resume patches.
func sandboxFromTemplate(t *testing.T, raw map[string]any, mode string) map[string]any {
	t.Helper()
	spec := raw["spec"].(map[string]any)
	sb := map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1",
		"kind":       "Sandbox",
		"metadata":   map[string]any{"name": raw["metadata"].(map[string]any)["name"]},
		"spec": map[string]any{
			"podTemplate":   runtimeDeepCopy(spec["podTemplate"]),
			"service":       spec["service"],
			"operatingMode": mode,
		},
	}
	return sb
}

func runtimeDeepCopy(v any) any {
	return (&unstructured.Unstructured{Object: map[string]any{"v": v}}).DeepCopy().Object["v"]
}

// TestGoldensPassAgentSandboxSchemas validates every golden agent-sandbox
// rendering against agent-sandbox's own CRDs, as the apiserver validates a
// create, and holds the template's Pod to the same Pod validation and Pod
// Security checks as the Kubernetes goldens' Pod. It also validates the
// Sandbox the claim controller would make of the template, Running and
// Suspended (the operating modes a suspend and resume switch between).
func TestGoldensPassAgentSandboxSchemas(t *testing.T) {
	crds := agentSandboxCRDs(t)
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range sandboxGoldens(t) {
		t.Run(filepath.Base(filepath.Dir(filepath.Dir(path))), func(t *testing.T) {
			o := decodeSandbox(t, path)
			for kind, raw := range o.raw {
				report(t, kind, crds[kind].validateCreate(runtimeDeepCopy(raw).(map[string]any)))
			}
			for _, mode := range []string{"Running", "Suspended"} {
				sb := sandboxFromTemplate(t, o.raw["SandboxTemplate"], mode)
				data, err := yaml.Marshal(sb)
				if err != nil {
					t.Fatal(err)
				}
				var typed sandboxv1beta1.Sandbox
				if err := yaml.UnmarshalStrict(data, &typed); err != nil || string(typed.Spec.OperatingMode) != mode {
					t.Errorf("the Sandbox does not decode into agent-sandbox's type: %v", err)
				}
				report(t, "Sandbox "+mode, crds["Sandbox"].validateCreate(sb))
			}
			// The claim names the pool, the pool the template.
			if o.claim.Spec.WarmPoolRef.Name != o.pool.Name || o.pool.Spec.TemplateRef.Name != o.template.Name {
				t.Error("the claim, pool and template do not name each other")
			}
			// A present networkPolicy under Managed: the plan's rules, not
			// the controller's default (which allows the public internet).
			if o.template.Spec.NetworkPolicy == nil || o.template.Spec.NetworkPolicyManagement != extv1beta1.NetworkPolicyManagementManaged {
				t.Error("the template leaves its NetworkPolicy to the controller's default")
			}

			// The Pod the template runs: the apiserver's Pod validation.
			pt := o.template.Spec.PodTemplate
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: o.template.Name, Namespace: "paseo", Labels: pt.ObjectMeta.Labels, Annotations: pt.ObjectMeta.Annotations},
				Spec:       *pt.Spec.DeepCopy(),
			}
			k8scorev1.SetObjectDefaults_Pod(pod)
			var ipod core.Pod
			if err := k8scorev1.Convert_v1_Pod_To_core_Pod(pod, &ipod, nil); err != nil {
				t.Fatal(err)
			}
			report(t, "podTemplate", corevalidation.ValidatePodCreate(&ipod, corevalidation.PodValidationOptions{}))
			// And the same Pod as the Kubernetes golden's, field for field.
			k := decode(t, filepath.Join(filepath.Dir(path), "kubernetes.yaml"))
			if got, want := yamlOf(t, pt.Spec), yamlOf(t, k.pod.Spec); !bytes.Equal(got, want) {
				t.Error("the template's Pod spec is not the Kubernetes rendering's")
			}
			if got, want := yamlOf(t, o.template.Spec.NetworkPolicy.Egress), yamlOf(t, k.np.Spec.Egress); !bytes.Equal(got, want) {
				t.Error("the template's egress rules are not the Kubernetes rendering's NetworkPolicy's")
			}
			// Pod Security restricted, as TestGoldensPodSecurityRestricted.
			hostPath := slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil })
			for _, r := range eval.EvaluatePod(psapi.LevelVersion{Level: psapi.LevelRestricted, Version: psapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
				if !r.Allowed && !(hostPath && slices.Contains([]string{"hostPath volumes", "restricted volume types"}, r.ForbiddenReason)) {
					t.Errorf("restricted: %s: %s", r.ForbiddenReason, r.ForbiddenDetail)
				}
			}
		})
	}
}

func yamlOf(t *testing.T, v any) []byte {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestAgentSandboxSchemasRefuseControls shows the validation above can
// fail: one golden's objects, broken one way at a time, are refused by the
// same CRD schemas.
func TestAgentSandboxSchemasRefuseControls(t *testing.T) {
	crds := agentSandboxCRDs(t)
	path := filepath.Join("..", "..", "testdata", "host-pi-session-api-key", "golden", "agent-sandbox.yaml")
	spec := func(m map[string]any) map[string]any { return m["spec"].(map[string]any) }
	podSpec := func(m map[string]any) map[string]any {
		return spec(m)["podTemplate"].(map[string]any)["spec"].(map[string]any)
	}
	cases := []struct {
		name, kind string
		brk        func(o sandboxObjects) map[string]any
	}{
		{"a Sandbox in a wrong operatingMode", "Sandbox", func(o sandboxObjects) map[string]any {
			return sandboxFromTemplate(t, o.raw["SandboxTemplate"], "Hibernated")
		}},
		{"a Sandbox with no podTemplate", "Sandbox", func(o sandboxObjects) map[string]any {
			sb := sandboxFromTemplate(t, o.raw["SandboxTemplate"], "Running")
			delete(spec(sb), "podTemplate")
			return sb
		}},
		{"a template with no podTemplate", "SandboxTemplate", func(o sandboxObjects) map[string]any {
			delete(spec(o.raw["SandboxTemplate"]), "podTemplate")
			return o.raw["SandboxTemplate"]
		}},
		{"a template with operatingMode (a Sandbox's field)", "SandboxTemplate", func(o sandboxObjects) map[string]any {
			spec(o.raw["SandboxTemplate"])["operatingMode"] = "Running"
			return o.raw["SandboxTemplate"]
		}},
		{"an unknown field in the Pod's container", "SandboxTemplate", func(o sandboxObjects) map[string]any {
			c := podSpec(o.raw["SandboxTemplate"])["containers"].([]any)[0].(map[string]any)
			c["privilegedMode"] = true
			return o.raw["SandboxTemplate"]
		}},
		{"a network policy with a podSelector (the controller's)", "SandboxTemplate", func(o sandboxObjects) map[string]any {
			spec(o.raw["SandboxTemplate"])["networkPolicy"].(map[string]any)["podSelector"] = map[string]any{}
			return o.raw["SandboxTemplate"]
		}},
		{"an unknown networkPolicyManagement", "SandboxTemplate", func(o sandboxObjects) map[string]any {
			spec(o.raw["SandboxTemplate"])["networkPolicyManagement"] = "Open"
			return o.raw["SandboxTemplate"]
		}},
		{"an unknown envVarsInjectionPolicy", "SandboxTemplate", func(o sandboxObjects) map[string]any {
			spec(o.raw["SandboxTemplate"])["envVarsInjectionPolicy"] = "Always"
			return o.raw["SandboxTemplate"]
		}},
		{"a pool of -1 replicas", "SandboxWarmPool", func(o sandboxObjects) map[string]any {
			spec(o.raw["SandboxWarmPool"])["replicas"] = int64(-1)
			return o.raw["SandboxWarmPool"]
		}},
		{"a claim with no warmPoolRef", "SandboxClaim", func(o sandboxObjects) map[string]any {
			delete(spec(o.raw["SandboxClaim"]), "warmPoolRef")
			return o.raw["SandboxClaim"]
		}},
		{"a claim named not as a DNS subdomain", "SandboxClaim", func(o sandboxObjects) map[string]any {
			o.raw["SandboxClaim"]["metadata"].(map[string]any)["name"] = "Paseo_Agent"
			return o.raw["SandboxClaim"]
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := decodeSandbox(t, path)
			if errs := crds[c.kind].validateCreate(c.brk(o)); len(errs) == 0 {
				t.Errorf("the broken %s passed validation", c.kind)
			} else {
				t.Logf("refused: %v", errs.ToAggregate())
			}
		})
	}
	// The control of the controls: the unbroken objects pass.
	o := decodeSandbox(t, path)
	for kind, raw := range o.raw {
		report(t, kind, crds[kind].validateCreate(raw))
	}
}
