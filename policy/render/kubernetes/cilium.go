package kubernetes

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CiliumNetworkPolicy is the part of Cilium's cilium.io/v2
// CiliumNetworkPolicy this rendering writes: egress by host name
// (toFQDNs), which networking/v1 cannot say. These are our own small types,
// not Cilium's (its Go module would bring its whole agent in); the field
// names and JSON spellings are Cilium's, as its CRD documents them, and
// nothing here is read back.
type CiliumNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              CiliumRule `json:"spec"`
}

// CiliumRule is one policy rule: the endpoints it selects and their egress.
// An egress section puts the selected endpoints in default deny for egress,
// as a networking/v1 policy with policyTypes Egress does.
type CiliumRule struct {
	EndpointSelector metav1.LabelSelector `json:"endpointSelector"`
	Egress           []CiliumEgressRule   `json:"egress"`
}

// CiliumEgressRule allows traffic to the union of its selectors, on its
// ports.
type CiliumEgressRule struct {
	ToEndpoints []metav1.LabelSelector `json:"toEndpoints,omitempty"`
	ToCIDR      []string               `json:"toCIDR,omitempty"`
	ToFQDNs     []FQDNSelector         `json:"toFQDNs,omitempty"`
	ToPorts     []CiliumPortRule       `json:"toPorts,omitempty"`
}

// FQDNSelector names one host exactly (matchName); this rendering writes
// no patterns.
type FQDNSelector struct {
	MatchName string `json:"matchName"`
}

// CiliumPortRule is a set of ports and, for DNS, the names lookups may ask
// for (Cilium's DNS proxy answers only those, and learns their addresses
// for toFQDNs).
type CiliumPortRule struct {
	Ports []CiliumPort   `json:"ports"`
	Rules *CiliumL7Rules `json:"rules,omitempty"`
}

// CiliumPort is a port and protocol (TCP, UDP or ANY); Cilium spells the
// port as a string.
type CiliumPort struct {
	Port     string `json:"port"`
	Protocol string `json:"protocol"`
}

// CiliumL7Rules holds the DNS rules of a port rule.
type CiliumL7Rules struct {
	DNS []FQDNSelector `json:"dns"`
}

const (
	ciliumAPIVersion = "cilium.io/v2"
	ciliumKind       = "CiliumNetworkPolicy"
)
