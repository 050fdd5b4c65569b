package kubernetes_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/apis/apps"
	k8sappsv1 "k8s.io/kubernetes/pkg/apis/apps/v1"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/core"
	k8scorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/networking"
	k8snetworkingv1 "k8s.io/kubernetes/pkg/apis/networking/v1"
	networkingvalidation "k8s.io/kubernetes/pkg/apis/networking/validation"
	psapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// gatewayObjects are the gateway's objects of a golden rendering
// (render --gateway-image --gateway-secret): told from the agent's by the
// gateway role label, which no agent object carries.
type gatewayObjects struct {
	np         *networkingv1.NetworkPolicy
	cilium     *kubernetes.CiliumNetworkPolicy
	cm         *corev1.ConfigMap
	deployment *appsv1.Deployment
	service    *corev1.Service
}

// slot is where doc decodes if it is one of the gateway's objects, nil if
// it is the agent's.
func (g *gatewayObjects) slot(t *testing.T, path string, doc []byte, kind string) any {
	t.Helper()
	var head struct {
		Metadata struct{ Labels map[string]string }
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatal(err)
	}
	switch kind {
	case "Deployment":
		g.deployment = &appsv1.Deployment{}
		return g.deployment
	case "Service":
		g.service = &corev1.Service{}
		return g.service
	}
	if head.Metadata.Labels[kubernetes.LabelRole] != kubernetes.RoleGateway {
		return nil
	}
	switch kind {
	case "NetworkPolicy":
		g.np = &networkingv1.NetworkPolicy{}
		return g.np
	case "CiliumNetworkPolicy":
		g.cilium = &kubernetes.CiliumNetworkPolicy{}
		return g.cilium
	case "ConfigMap":
		g.cm = &corev1.ConfigMap{}
		return g.cm
	}
	t.Fatalf("%s: a gateway object of kind %q", path, kind)
	return nil
}

// gatewayCase is the golden case rendered with the gateway.
var gatewayCase = filepath.Join("..", "..", "testdata", "host-cluster-gateway", "golden", "kubernetes.yaml")

// validateGateway runs the apiserver's create validation on the gateway's
// objects, the Pod Security restricted checks on its Pod, and the checks of
// what ties them together (checkGateway).
func validateGateway(t *testing.T, o objects) {
	t.Helper()
	g := o.gw
	if g.np == nil || g.cm == nil || g.service == nil {
		t.Fatal("a gateway Deployment without its NetworkPolicy, ConfigMap or Service")
	}
	for _, e := range deploymentErrs(t, g.deployment) {
		t.Errorf("gateway Deployment: %v", e)
	}
	for _, e := range serviceErrs(t, g.service) {
		t.Errorf("gateway Service: %v", e)
	}
	np := g.np.DeepCopy()
	np.Namespace = "paseo"
	k8snetworkingv1.SetObjectDefaults_NetworkPolicy(np)
	var inp networking.NetworkPolicy
	if err := k8snetworkingv1.Convert_v1_NetworkPolicy_To_networking_NetworkPolicy(np, &inp, nil); err != nil {
		t.Fatal(err)
	}
	report(t, "gateway NetworkPolicy", networkingvalidation.ValidateNetworkPolicy(&inp, networkingvalidation.NetworkPolicyValidationOptions{}))
	cm := g.cm.DeepCopy()
	cm.Namespace = "paseo"
	var icm core.ConfigMap
	if err := k8scorev1.Convert_v1_ConfigMap_To_core_ConfigMap(cm, &icm, nil); err != nil {
		t.Fatal(err)
	}
	report(t, "gateway ConfigMap", corevalidation.ValidateConfigMap(&icm))
	for _, f := range restrictedFailures(g.deployment) {
		t.Errorf("gateway Pod, restricted: %s", f)
	}
	if err := checkGateway(o); err != nil {
		t.Error(err)
	}
}

func deploymentErrs(t *testing.T, d *appsv1.Deployment) []error {
	t.Helper()
	d = d.DeepCopy()
	d.Namespace = "paseo"
	k8sappsv1.SetObjectDefaults_Deployment(d)
	var id apps.Deployment
	if err := k8sappsv1.Convert_v1_Deployment_To_apps_Deployment(d, &id, nil); err != nil {
		t.Fatal(err)
	}
	return toErrs(appsvalidation.ValidateDeployment(&id, corevalidation.PodValidationOptions{}))
}

func serviceErrs(t *testing.T, s *corev1.Service) []error {
	t.Helper()
	s = s.DeepCopy()
	s.Namespace = "paseo"
	k8scorev1.SetObjectDefaults_Service(s)
	var is core.Service
	if err := k8scorev1.Convert_v1_Service_To_core_Service(s, &is, nil); err != nil {
		t.Fatal(err)
	}
	return toErrs(corevalidation.ValidateServiceCreate(&is))
}

func toErrs(l field.ErrorList) []error {
	var out []error
	for _, e := range l {
		out = append(out, e)
	}
	return out
}

// restrictedFailures are the Pod Security restricted checks the gateway's
// Pod fails (the admission plugin's own evaluator).
func restrictedFailures(d *appsv1.Deployment) []string {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, r := range eval.EvaluatePod(psapi.LevelVersion{Level: psapi.LevelRestricted, Version: psapi.LatestVersion()}, &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec) {
		if !r.Allowed {
			out = append(out, r.ForbiddenReason+": "+r.ForbiddenDetail)
		}
	}
	return out
}

// checkGateway holds the objects to what makes them one gateway for one
// agent: the Service at the address the agent's Pod names the gateway by,
// selecting the gateway's Pod, with the ports the agent's policy opens;
// the agent's policy reaching this gateway's pods; the gateway's policy
// admitting this agent's Pod only; every bundle file of the ConfigMap
// mounted by subPath at its path; the credentials from the Secret by
// subPath, never a value.
func checkGateway(o objects) error {
	g := o.gw
	d := g.deployment
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		return fmt.Errorf("the Deployment's selector does not select its own Pod (%v)", err)
	}
	spec := d.Spec.Template.Spec
	if spec.RuntimeClassName != nil || spec.HostNetwork || spec.HostPID || spec.HostIPC {
		return fmt.Errorf("the gateway's Pod names a RuntimeClass or shares a host namespace")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		return fmt.Errorf("the gateway's Pod mounts a service-account token")
	}
	if spec.SecurityContext == nil || spec.SecurityContext.FSGroup == nil {
		return fmt.Errorf("the gateway's Pod has no fsGroup: the Secret's 0440 files would not be its group's")
	}
	if len(spec.Containers) != 1 {
		return fmt.Errorf("the gateway's Pod has %d containers", len(spec.Containers))
	}
	ctr := spec.Containers[0]
	sc := ctr.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		return fmt.Errorf("the gateway's root filesystem is writable")
	}
	// The Service: the agent's hostAliases address, the gateway's Pod.
	s := g.service
	if len(o.pod.Spec.HostAliases) != 1 {
		return fmt.Errorf("the agent's Pod names no gateway")
	}
	if s.Spec.ClusterIP != o.pod.Spec.HostAliases[0].IP {
		return fmt.Errorf("the Service's cluster IP %q is not the address the agent's Pod names the gateway by (%s)", s.Spec.ClusterIP, o.pod.Spec.HostAliases[0].IP)
	}
	if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
		return fmt.Errorf("the Service does not select the gateway's Pod")
	}
	// The agent's policy: each of its egress rules to pods reaches the
	// gateway's Pod, and its ports are the Service's.
	var agentPorts, svcPorts []int32
	for _, e := range o.np.Spec.Egress {
		for _, to := range e.To {
			if to.PodSelector == nil {
				continue
			}
			ps, err := metav1.LabelSelectorAsSelector(to.PodSelector)
			if err != nil || !ps.Matches(podLabels) {
				return fmt.Errorf("the agent's policy allows pods %v, not the gateway's", to.PodSelector.MatchLabels)
			}
			for _, p := range e.Ports {
				agentPorts = append(agentPorts, p.Port.IntVal)
			}
		}
	}
	for _, p := range s.Spec.Ports {
		svcPorts = append(svcPorts, p.Port)
		if p.TargetPort.IntVal != p.Port || !slices.ContainsFunc(ctr.Ports, func(c corev1.ContainerPort) bool { return c.ContainerPort == p.Port }) {
			return fmt.Errorf("the Service's port %d is not the gateway container's", p.Port)
		}
	}
	slices.Sort(agentPorts)
	slices.Sort(svcPorts)
	if len(agentPorts) == 0 || !slices.Equal(agentPorts, svcPorts) {
		return fmt.Errorf("the agent's policy opens ports %v, the Service serves %v", agentPorts, svcPorts)
	}
	// The gateway's policy: it selects the gateway's Pod, and admits the
	// agent's Pod, on those ports, and nothing else.
	gs, err := metav1.LabelSelectorAsSelector(&g.np.Spec.PodSelector)
	if err != nil || !gs.Matches(podLabels) {
		return fmt.Errorf("the gateway's policy does not select the gateway's Pod")
	}
	if len(g.np.Spec.Ingress) != 1 || len(g.np.Spec.Ingress[0].From) != 1 || g.np.Spec.Ingress[0].From[0].PodSelector == nil ||
		g.np.Spec.Ingress[0].From[0].NamespaceSelector != nil || g.np.Spec.Ingress[0].From[0].IPBlock != nil {
		return fmt.Errorf("the gateway's policy admits more than one Pod selector")
	}
	in, _ := metav1.LabelSelectorAsSelector(g.np.Spec.Ingress[0].From[0].PodSelector)
	if !in.Matches(labels.Set(o.pod.Labels)) || in.Matches(podLabels) {
		return fmt.Errorf("the gateway's policy admits %v, not the agent's Pod alone", g.np.Spec.Ingress[0].From[0].PodSelector.MatchLabels)
	}
	var inPorts []int32
	for _, p := range g.np.Spec.Ingress[0].Ports {
		inPorts = append(inPorts, p.Port.IntVal)
	}
	slices.Sort(inPorts)
	if !slices.Equal(inPorts, svcPorts) {
		return fmt.Errorf("the gateway's policy admits ports %v, the Service serves %v", inPorts, svcPorts)
	}
	for _, e := range g.np.Spec.Egress {
		for _, to := range e.To {
			if to.IPBlock == nil || len(to.IPBlock.Except) > 0 {
				return fmt.Errorf("the gateway's policy allows egress to something but an address")
			}
			if p, err := netip.ParsePrefix(to.IPBlock.CIDR); err != nil || !p.IsSingleIP() {
				return fmt.Errorf("the gateway's policy allows egress to %s, more than one address", to.IPBlock.CIDR)
			}
		}
	}
	// The volumes: the bundle's ConfigMap by subPath, the Secret by name.
	var bundleVol, secretVol string
	for _, v := range spec.Volumes {
		switch {
		case v.ConfigMap != nil && v.ConfigMap.Name == g.cm.Name:
			bundleVol = v.Name
		case v.Secret != nil:
			secretVol = v.Name
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o027 != 0 {
				return fmt.Errorf("the Secret's files are open to others or writable by their group")
			}
		default:
			return fmt.Errorf("the gateway's Pod has a volume %s that is neither its bundle nor its Secret", v.Name)
		}
	}
	mounted := map[string]bool{}
	for _, m := range ctr.VolumeMounts {
		if m.SubPath == "" || !m.ReadOnly {
			return fmt.Errorf("the gateway mounts %s without subPath or writable", m.MountPath)
		}
		switch m.Name {
		case bundleVol:
			data, ok := g.cm.Data[m.SubPath]
			if !ok {
				return fmt.Errorf("the gateway mounts %s from key %s, which its ConfigMap lacks", m.MountPath, m.SubPath)
			}
			rel := strings.TrimPrefix(m.MountPath, kubernetes.GatewayBundleDir+"/")
			mounted[m.SubPath] = true
			// The golden bundle's own file, where the golden keeps it.
			if want, err := os.ReadFile(filepath.Join(filepath.Dir(gatewayCase), filepath.FromSlash(rel))); err == nil && string(want) != data {
				return fmt.Errorf("the gateway's %s is not the bundle's %s", m.MountPath, rel)
			}
		case secretVol:
			if !strings.HasPrefix(m.MountPath, kubernetes.GatewaySecretDir+"/") {
				return fmt.Errorf("a credential mounted at %s", m.MountPath)
			}
		default:
			return fmt.Errorf("a mount of no volume: %s", m.Name)
		}
	}
	if len(mounted) != len(g.cm.Data)+len(g.cm.BinaryData) {
		return fmt.Errorf("the gateway mounts %d of its ConfigMap's %d files", len(mounted), len(g.cm.Data)+len(g.cm.BinaryData))
	}
	if last := ctr.Args[len(ctr.Args)-1]; last != kubernetes.GatewayBundleDir {
		return fmt.Errorf("the gateway serves %s, not its bundle", last)
	}
	return nil
}

// TestGatewayRenderingRefusesControls shows the gateway's checks can fail:
// the golden gateway broken one way at a time is refused, by the
// apiserver's validation, by Pod Security restricted, or by checkGateway.
func TestGatewayRenderingRefusesControls(t *testing.T) {
	type breaker struct {
		brk   func(*objects)
		check func(*testing.T, objects) []string
	}
	tie := func(_ *testing.T, o objects) []string {
		if err := checkGateway(o); err != nil {
			return []string{err.Error()}
		}
		return nil
	}
	api := func(t *testing.T, o objects) []string {
		var out []string
		for _, e := range append(deploymentErrs(t, o.gw.deployment), serviceErrs(t, o.gw.service)...) {
			out = append(out, e.Error())
		}
		return out
	}
	restricted := func(_ *testing.T, o objects) []string { return restrictedFailures(o.gw.deployment) }
	breaks := map[string]breaker{
		"a Service without the IP": {func(o *objects) { o.gw.service.Spec.ClusterIP, o.gw.service.Spec.ClusterIPs = "", nil }, tie},
		"a Service selecting another gateway": {func(o *objects) {
			o.gw.service.Spec.Selector[kubernetes.LabelGatewayFor] = "paseo-other-00000000"
		}, tie},
		"a Deployment with a hostPath": {func(o *objects) {
			s := &o.gw.deployment.Spec.Template.Spec
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run"}}})
		}, restricted},
		"a Deployment whose gateway runs as root": {func(o *objects) {
			s := o.gw.deployment.Spec.Template.Spec.SecurityContext
			s.RunAsNonRoot, s.RunAsUser = nil, new(int64)
		}, restricted},
		"a Deployment that may escalate": {func(o *objects) {
			o.gw.deployment.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		}, restricted},
		"a Deployment whose selector misses its Pod": {func(o *objects) {
			o.gw.deployment.Spec.Selector.MatchLabels[kubernetes.LabelGatewayFor] = "paseo-other-00000000"
		}, api},
		"a Service port of two names": {func(o *objects) {
			o.gw.service.Spec.Ports[1].Name = o.gw.service.Spec.Ports[0].Name
		}, api},
		"a bundle file mounted without subPath": {func(o *objects) {
			o.gw.deployment.Spec.Template.Spec.Containers[0].VolumeMounts[2].SubPath = ""
		}, tie},
		"a bundle file left out": {func(o *objects) {
			c := &o.gw.deployment.Spec.Template.Spec.Containers[0]
			c.VolumeMounts = c.VolumeMounts[:len(c.VolumeMounts)-1]
		}, tie},
		"a Secret open to others": {func(o *objects) {
			*o.gw.deployment.Spec.Template.Spec.Volumes[1].Secret.DefaultMode = 0o444
		}, tie},
		"the gateway admitting every pod": {func(o *objects) {
			o.gw.np.Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{}
		}, tie},
		"the agent reaching every gateway of its deployment": {func(o *objects) {
			for _, e := range o.np.Spec.Egress {
				for _, to := range e.To {
					if to.PodSelector != nil {
						delete(to.PodSelector.MatchLabels, kubernetes.LabelGatewayFor)
						to.PodSelector.MatchLabels[kubernetes.LabelGatewayFor] = "paseo-other-00000000"
					}
				}
			}
		}, tie},
	}
	// The unbroken golden passes every check (the control of the controls).
	o := decode(t, gatewayCase)
	if o.gw.deployment == nil {
		t.Fatal("the gateway case renders no gateway")
	}
	for _, check := range []func(*testing.T, objects) []string{tie, api, restricted} {
		if f := check(t, o); len(f) > 0 {
			t.Fatalf("the golden gateway fails: %v", f)
		}
	}
	for name, b := range breaks {
		t.Run(name, func(t *testing.T) {
			o := decode(t, gatewayCase)
			b.brk(&o)
			if f := b.check(t, o); len(f) == 0 {
				t.Error("the broken gateway passed")
			} else {
				t.Logf("refused: %s", f[0])
			}
		})
	}
}
