package kubernetes

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"paseo.dev/paseo-policy/policy/grant"
)

// kubeDNS selects the cluster's DNS pods as Cilium labels them (the
// k8s: source prefix and the kube-dns app label of a standard cluster).
var kubeDNS = map[string]string{"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}

// network renders the egress and route grants: a NetworkPolicy that
// denies everything but them, the gateway's name, the DNS the Pod gets and,
// for host names (which networking/v1 cannot say), a CiliumNetworkPolicy.
func (r *renderer) network() {
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: r.name, Labels: r.labels()},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandbox: r.name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	r.out.NetworkPolicy = np
	obj := "NetworkPolicy/" + r.name
	r.fixed(obj, "spec.policyTypes", "Ingress, Egress", "deny by default in both directions: only the rules below pass")
	r.fixed(obj, "spec.ingress", "none", "no grant admits a connection to the sandbox; the daemon speaks to it over stdio")
	if r.mode != nil && r.mode.Mode == "none" {
		r.trace(obj, "spec.egress", "none", *r.mode)
	}

	if len(r.routes) > 0 {
		r.gatewayRoutes(np, obj)
	} else if r.hosts != nil {
		r.trace(r.podRef(), "spec.hostAliases", "none: the kubelet's /etc/hosts (localhost and the Pod's own name)", *r.hosts)
	}
	var named []grant.Egress
	var resolvers []grant.Egress
	for _, e := range r.egress {
		a, err := netip.ParseAddr(e.Host)
		if err != nil {
			named = append(named, e)
			r.gap(e, "networking/v1 names no hosts: only the CiliumNetworkPolicy's toFQDNs allows "+e.Host)
			continue
		}
		if e.Purpose == "dns" {
			resolvers = append(resolvers, e)
		}
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}}},
			Ports: []networkingv1.NetworkPolicyPort{port(e.Proto, e.Port)},
		})
		r.trace(obj, "spec.egress["+strconv.Itoa(len(np.Spec.Egress)-1)+"]", e.Proto+"/"+strconv.Itoa(e.Port)+" to "+e.Host, e)
	}
	r.dns(named, resolvers)
	if len(named) > 0 {
		r.cilium(named, resolvers)
	}
}

// gatewayRoutes allows each route's port on the deployment's gateway pods
// and names the gateway in the Pod's /etc/hosts. What a route forwards
// (the MCP methods and tools, the model requests, the key it adds) is the
// gateway's to enforce: no Kubernetes object can say it.
func (r *renderer) gatewayRoutes(np *networkingv1.NetworkPolicy, obj string) {
	if r.gateway == "" {
		r.refuse("registry.network", "the plan has routes but its egress.json names no gateway")
	}
	a, err := gatewayAddr(r.opt.GatewayIP)
	if err != nil {
		r.refuse("options.gatewayIP", "%v", err)
	} else if r.gateway != "" {
		r.pod.Spec.HostAliases = []corev1.HostAlias{{IP: a.String(), Hostnames: []string{r.gateway}}}
		for _, rt := range r.routes {
			r.trace(r.podRef(), "spec.hostAliases[0]", r.gateway+" -> "+a.String(), rt)
		}
		if r.hosts != nil {
			r.trace(r.podRef(), "spec.hostAliases[0]", "the kubelet's /etc/hosts, with the gateway's name", *r.hosts)
		}
	}
	// This agent's gateway pods only: the rendered gateway carries the
	// label, and an operator's gateway must (docs/kubernetes.md).
	gw := metav1.LabelSelector{MatchLabels: map[string]string{LabelRole: RoleGateway, LabelDeployment: labelValue(r.m.Deployment), LabelGatewayFor: r.name}}
	for _, rt := range r.routes {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &gw}},
			Ports: []networkingv1.NetworkPolicyPort{port(rt.Proto, rt.Port)},
		})
		r.trace(obj, "spec.egress["+strconv.Itoa(len(np.Spec.Egress)-1)+"]", "tcp/"+strconv.Itoa(rt.Port)+" to this agent's gateway pods ("+string(rt.Purpose)+" route)", rt)
		cred := "adds its credential " + rt.TokenRef
		if rt.Login() {
			cred = "holds and refreshes the subscription login " + rt.LoginEntry + " (" + rt.LoginFile + " on the host)"
		}
		if r.withGateway {
			r.gap(rt, "the gateway's route proxy (Deployment/"+gatewayName(r.m.Agent)+", `paseo-policy gateway` on this bundle): it alone holds the route's scope ("+routeScope(rt)+") and "+cred+", from the Secret "+r.opt.GatewaySecret)
		} else {
			r.gap(rt, "the gateway's route proxy, which the rendering does not deploy (give --gateway-image and --gateway-secret): it alone holds the route's scope ("+routeScope(rt)+") and "+cred)
		}
	}
}

func routeScope(rt grant.Route) string {
	if rt.Purpose == grant.RouteModel {
		return "requests " + strings.Join(rt.Requests, ", ")
	}
	return "methods " + strings.Join(rt.Methods, " ") + "; tools " + strings.Join(rt.Tools, " ")
}

// dns decides the Pod's resolver. The plan's resolv.conf is mounted as it
// is, unless the plan names egress hosts and no resolver: the launcher
// pins those names on the trusted side, and the stand-in here is the
// cluster's DNS, which only the CiliumNetworkPolicy opens, and only for
// those names.
func (r *renderer) dns(named, resolvers []grant.Egress) {
	if r.resolv == nil {
		return
	}
	if len(named) > 0 && len(resolvers) == 0 {
		r.pod.Spec.DNSPolicy = corev1.DNSClusterFirst
		r.pod.Spec.DNSConfig = &corev1.PodDNSConfig{Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}}}
		r.trace(r.podRef(), "spec.dnsPolicy", "ClusterFirst, ndots 1: the cluster's DNS for "+hostList(named)+" only", *r.resolv)
		r.gap(*r.resolv, "the launcher's trusted-side pins of "+hostList(named)+": the cluster's DNS, which the CiliumNetworkPolicy opens for these names alone")
		return
	}
	r.fileMount(*r.resolv)
}

// cilium allows the named hosts by name, and the DNS lookups of exactly
// those names, through Cilium's DNS proxy (which learns their addresses).
func (r *renderer) cilium(named, resolvers []grant.Egress) {
	c := &CiliumNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: ciliumAPIVersion, Kind: ciliumKind},
		ObjectMeta: metav1.ObjectMeta{Name: r.name, Labels: r.labels()},
		Spec:       CiliumRule{EndpointSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandbox: r.name}}},
	}
	r.out.Cilium = c
	obj := "CiliumNetworkPolicy/" + r.name
	var names []FQDNSelector
	for _, e := range named {
		c.Spec.Egress = append(c.Spec.Egress, CiliumEgressRule{
			ToFQDNs: []FQDNSelector{{MatchName: e.Host}},
			ToPorts: []CiliumPortRule{{Ports: []CiliumPort{{Port: strconv.Itoa(e.Port), Protocol: strings.ToUpper(e.Proto)}}}},
		})
		r.trace(obj, "spec.egress["+strconv.Itoa(len(c.Spec.Egress)-1)+"]", e.Proto+"/"+strconv.Itoa(e.Port)+" to "+e.Host, e)
		if !slices.Contains(names, FQDNSelector{MatchName: e.Host}) {
			names = append(names, FQDNSelector{MatchName: e.Host})
		}
	}
	slices.SortFunc(names, func(a, b FQDNSelector) int { return strings.Compare(a.MatchName, b.MatchName) })
	rules := &CiliumL7Rules{DNS: names}
	if len(resolvers) == 0 {
		c.Spec.Egress = append(c.Spec.Egress, CiliumEgressRule{
			ToEndpoints: []metav1.LabelSelector{{MatchLabels: kubeDNS}},
			ToPorts:     []CiliumPortRule{{Ports: []CiliumPort{{Port: "53", Protocol: "ANY"}}, Rules: rules}},
		})
		for _, e := range named {
			r.trace(obj, "spec.egress["+strconv.Itoa(len(c.Spec.Egress)-1)+"]", "kube-dns, lookups of "+e.Host, e)
		}
		return
	}
	for _, d := range resolvers {
		a, _ := netip.ParseAddr(d.Host) // resolvers are addresses (network)
		c.Spec.Egress = append(c.Spec.Egress, CiliumEgressRule{
			ToCIDR:  []string{netip.PrefixFrom(a, a.BitLen()).String()},
			ToPorts: []CiliumPortRule{{Ports: []CiliumPort{{Port: strconv.Itoa(d.Port), Protocol: strings.ToUpper(d.Proto)}}, Rules: rules}},
		})
		r.trace(obj, "spec.egress["+strconv.Itoa(len(c.Spec.Egress)-1)+"]", d.Proto+"/"+strconv.Itoa(d.Port)+" to "+d.Host+", lookups of the named hosts", d)
	}
}

func hostList(es []grant.Egress) string {
	var hs []string
	for _, e := range es {
		if !slices.Contains(hs, e.Host) {
			hs = append(hs, e.Host)
		}
	}
	return strings.Join(hs, ", ")
}

func port(proto string, n int) networkingv1.NetworkPolicyPort {
	p := corev1.ProtocolTCP
	if proto == "udp" {
		p = corev1.ProtocolUDP
	}
	v := intstr.FromInt32(int32(n))
	return networkingv1.NetworkPolicyPort{Protocol: &p, Port: &v}
}
