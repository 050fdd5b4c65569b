package kubernetes

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// env renders one variable. A secret placeholder becomes a secretKeyRef to
// the deployment's Secret, so no value is ever in the rendering; the marker
// anywhere else is refused, as the launcher refuses it.
func (r *renderer) env(g grant.Env) {
	field := fmt.Sprintf("spec.containers[0].env[%d]", len(r.ctr.Env))
	if ref, ok := bundle.PlaceholderRef(g.Value); ok {
		key, ok := secretKey(ref)
		if !ok {
			r.refuse(g.Why().Fact, "the secret reference of %s has no name a Secret key can be (letters, digits, '-', '_' and '/' only)", g.Name)
			return
		}
		sel := &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: SecretName(r.m.Deployment)}, Key: key}
		r.ctr.Env = append(r.ctr.Env, corev1.EnvVar{Name: g.Name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: sel}})
		r.trace(r.podRef(), field, g.Name+" <- secret "+sel.Name+" key "+key, g)
		return
	}
	if strings.Contains(g.Value, bundle.SecretMarker) {
		r.refuse(g.Why().Fact, "%s holds a secret placeholder where the compiler puts none", g.Name)
		return
	}
	r.ctr.Env = append(r.ctr.Env, corev1.EnvVar{Name: g.Name, Value: g.Value})
	r.trace(r.podRef(), field, g.Name+"="+g.Value, g)
}

// SecretName is the Secret holding a deployment's secrets, the cluster's
// counterpart of the launcher's <secrets-dir>/<deployment>/.
func SecretName(deployment string) string { return "paseo-" + labelValue(deployment) + "-secrets" }

var secretRefChars = regexp.MustCompile(`^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$`)

// secretKey is a secret reference as a Secret key: '/' becomes '.', which
// no reference may hold, so two references never share a key.
func secretKey(ref string) (string, bool) {
	if !secretRefChars.MatchString(ref) {
		return "", false
	}
	return strings.ReplaceAll(ref, "/", "."), true
}

// cgroup renders the memory bound as the container's memory request and
// limit; the pids bound has no Pod field.
func (r *renderer) cgroup(g grant.CgroupMax) {
	if g.Resource != "memory" {
		r.gap(g, "none in a Pod: the kubelet's node-wide podPidsLimit bounds the Pod's tasks")
		return
	}
	q := resource.NewQuantity(g.Max, resource.BinarySI)
	r.setResource(corev1.ResourceMemory, *q, g)
}

// cpu renders the CPU quota as the container's CPU request and limit, in
// millicores (the kubelet's CFS quota over its 100ms period).
func (r *renderer) cpu(g grant.CPUQuota) {
	q := resource.NewMilliQuantity(int64(g.CPUs*1000), resource.DecimalSI)
	r.setResource(corev1.ResourceCPU, *q, g)
}

// setResource sets the limit and an equal request: the scheduler places
// the Pod where its limits fit, and its QoS class is Guaranteed.
func (r *renderer) setResource(name corev1.ResourceName, q resource.Quantity, g grant.Grant) {
	res := &r.ctr.Resources
	if res.Limits == nil {
		res.Limits, res.Requests = corev1.ResourceList{}, corev1.ResourceList{}
	}
	res.Limits[name], res.Requests[name] = q, q
	r.trace(r.podRef(), "spec.containers[0].resources.limits."+string(name), q.String(), g)
	r.trace(r.podRef(), "spec.containers[0].resources.requests."+string(name), q.String(), g)
}
