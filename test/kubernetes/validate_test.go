package kubernetes_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/apis/core"
	k8scorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/networking"
	k8snetworkingv1 "k8s.io/kubernetes/pkg/apis/networking/v1"
	networkingvalidation "k8s.io/kubernetes/pkg/apis/networking/validation"
	"sigs.k8s.io/yaml"

	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// objects is one golden kubernetes.yaml decoded strictly, by kind.
type objects struct {
	pod    *corev1.Pod
	cm     *corev1.ConfigMap
	np     *networkingv1.NetworkPolicy
	cilium *kubernetes.CiliumNetworkPolicy
	gw     gatewayObjects // the gateway's, when the case renders it
}

func decode(t *testing.T, path string) objects {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var o objects
	for _, doc := range bytes.Split(data, []byte("\n---\n"))[1:] {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		var v any
		if gw := o.gw.slot(t, path, doc, head.Kind); gw != nil {
			v = gw
		} else {
			switch head.Kind {
			case "Pod":
				o.pod = &corev1.Pod{}
				v = o.pod
			case "ConfigMap":
				o.cm = &corev1.ConfigMap{}
				v = o.cm
			case "NetworkPolicy":
				o.np = &networkingv1.NetworkPolicy{}
				v = o.np
			case "CiliumNetworkPolicy":
				o.cilium = &kubernetes.CiliumNetworkPolicy{}
				v = o.cilium
			default:
				t.Fatalf("%s: an object of kind %q", path, head.Kind)
			}
		}
		if err := yaml.UnmarshalStrict(doc, v); err != nil {
			t.Fatalf("%s: %s: %v", path, head.Kind, err)
		}
	}
	if o.pod == nil || o.np == nil {
		t.Fatalf("%s: no Pod or no NetworkPolicy", path)
	}
	return o
}

// goldens are the committed renderings (policy/compiler TestGoldenKubernetes
// holds them equal to what the renderer makes of each case).
func goldens(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", "testdata", "*", "golden", "kubernetes.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden kubernetes.yaml found (%v)", err)
	}
	return paths
}

// TestGoldensPassKubernetesValidation runs the apiserver's own create
// validation on every golden rendering, as the apiserver does it: the v1
// object defaulted, converted to the internal type, then validated.
func TestGoldensPassKubernetesValidation(t *testing.T) {
	for _, path := range goldens(t) {
		name := filepath.Base(filepath.Dir(filepath.Dir(path)))
		t.Run(name, func(t *testing.T) {
			o := decode(t, path)

			pod := o.pod.DeepCopy()
			k8scorev1.SetObjectDefaults_Pod(pod)
			pod.Namespace = "paseo" // kubectl apply -n gives it one
			var ipod core.Pod
			if err := k8scorev1.Convert_v1_Pod_To_core_Pod(pod, &ipod, nil); err != nil {
				t.Fatal(err)
			}
			report(t, "Pod", corevalidation.ValidatePodCreate(&ipod, corevalidation.PodValidationOptions{}))

			np := o.np.DeepCopy()
			np.Namespace = "paseo"
			k8snetworkingv1.SetObjectDefaults_NetworkPolicy(np)
			var inp networking.NetworkPolicy
			if err := k8snetworkingv1.Convert_v1_NetworkPolicy_To_networking_NetworkPolicy(np, &inp, nil); err != nil {
				t.Fatal(err)
			}
			report(t, "NetworkPolicy", networkingvalidation.ValidateNetworkPolicy(&inp, networkingvalidation.NetworkPolicyValidationOptions{}))

			if o.cm != nil {
				cm := o.cm.DeepCopy()
				cm.Namespace = "paseo"
				var icm core.ConfigMap
				if err := k8scorev1.Convert_v1_ConfigMap_To_core_ConfigMap(cm, &icm, nil); err != nil {
					t.Fatal(err)
				}
				report(t, "ConfigMap", corevalidation.ValidateConfigMap(&icm))
				mountsConfigMap(t, o)
			}
			checkCilium(t, o)
			if o.gw.deployment != nil {
				validateGateway(t, o)
			}
		})
	}
}

func report(t *testing.T, kind string, errs field.ErrorList) {
	t.Helper()
	for _, e := range errs {
		t.Errorf("%s: %v", kind, e)
	}
}

// mountsConfigMap: every subPath the Pod mounts is a key of the ConfigMap.
func mountsConfigMap(t *testing.T, o objects) {
	t.Helper()
	for _, m := range o.pod.Spec.Containers[0].VolumeMounts {
		if m.SubPath == "" {
			continue
		}
		if _, ok := o.cm.Data[m.SubPath]; !ok {
			t.Errorf("the Pod mounts %s from key %s, which the ConfigMap lacks", m.MountPath, m.SubPath)
		}
	}
}

// checkCilium holds the CiliumNetworkPolicy to what Cilium's CRD requires
// of the fields it has (no Cilium module here: its schema is its agent's).
func checkCilium(t *testing.T, o objects) {
	t.Helper()
	c := o.cilium
	if c == nil {
		return
	}
	if c.APIVersion != "cilium.io/v2" || c.Kind != "CiliumNetworkPolicy" || c.Name == "" {
		t.Errorf("cilium policy head %s %s %q", c.APIVersion, c.Kind, c.Name)
	}
	if c.Spec.EndpointSelector.MatchLabels[kubernetes.LabelSandbox] != o.pod.Labels[kubernetes.LabelSandbox] {
		t.Error("the cilium policy does not select the Pod")
	}
	for _, r := range c.Spec.Egress {
		for _, p := range r.ToPorts {
			for _, pp := range p.Ports {
				if !strings.Contains(" TCP UDP ANY ", " "+pp.Protocol+" ") || pp.Port == "" {
					t.Errorf("cilium port %q/%q", pp.Port, pp.Protocol)
				}
			}
		}
	}
}

// TestValidationRefusesControls shows the validation above can fail: the
// same golden Pod, broken one way at a time, is refused.
func TestValidationRefusesControls(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "host-pi-session-api-key", "golden", "kubernetes.yaml")
	breaks := map[string]func(*corev1.Pod){
		"two mounts at one path": func(p *corev1.Pod) {
			c := &p.Spec.Containers[0]
			c.VolumeMounts = append(c.VolumeMounts, c.VolumeMounts[0])
		},
		"a mount of no volume": func(p *corev1.Pod) { p.Spec.Containers[0].VolumeMounts[0].Name = "nothing" },
		"a subPath with ..":    func(p *corev1.Pod) { p.Spec.Containers[0].VolumeMounts[4].SubPath = "../x" },
		"a hostPath made relative": func(p *corev1.Pod) {
			for i := range p.Spec.Volumes {
				if hp := p.Spec.Volumes[i].HostPath; hp != nil {
					hp.Path = "srv/relative/../x"
					return
				}
			}
		},
		"uid negative": func(p *corev1.Pod) { *p.Spec.Containers[0].SecurityContext.RunAsUser = -1 },
	}
	for name, brk := range breaks {
		t.Run(name, func(t *testing.T) {
			pod := decode(t, path).pod
			brk(pod)
			k8scorev1.SetObjectDefaults_Pod(pod)
			pod.Namespace = "paseo"
			var ipod core.Pod
			if err := k8scorev1.Convert_v1_Pod_To_core_Pod(pod, &ipod, nil); err != nil {
				t.Fatal(err)
			}
			if errs := corevalidation.ValidatePodCreate(&ipod, corevalidation.PodValidationOptions{}); len(errs) == 0 {
				t.Error("the broken Pod passed validation")
			}
		})
	}
}
