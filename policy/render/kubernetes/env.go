package kubernetes

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// env renders one variable. A secret placeholder is refused, as the
// launcher refuses it: no one fills it (the compiler writes none; a slot
// of an older compile would put the provider key in the Pod's
// environment, which the model route keeps outside).
func (r *renderer) env(g grant.Env) {
	field := fmt.Sprintf("spec.containers[0].env[%d]", len(r.ctr.Env))
	if strings.Contains(g.Value, bundle.SecretMarker) {
		r.refuse(g.Why().Fact, "%s holds a secret placeholder, which no one fills: compile the facts again", g.Name)
		return
	}
	v := g.Value
	if strings.HasPrefix(g.Name, "GIT_CONFIG_VALUE_") && v == bundle.FSMonitorHookPath {
		// The workspace monitor's hook: no launcher serves it in a Pod, and
		// a hook left out (or one that waited on the gateway) would cost
		// every git command an error or a timeout; false is Git's own
		// "no monitor", a full scan as with the monitor off.
		v = "false"
	}
	if g.Name == "PATH" {
		// The native search's client: no launcher serves it in a Pod, and
		// its directory is not mounted there; the image's tools answer.
		v = strings.TrimPrefix(v, bundle.SearchDir+":")
	}
	r.ctr.Env = append(r.ctr.Env, corev1.EnvVar{Name: g.Name, Value: v})
	r.trace(r.podRef(), field, g.Name+"="+v, g)
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
