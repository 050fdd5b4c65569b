package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The gateway's Pod: where it reads the bundle and its credentials, and
// the Secret's keys. The paths are the rendering's (nothing else reads
// them); the keys are the contract with the operator who makes the Secret.
const (
	LabelGatewayFor  = "paseo.dev/gateway-for" // on the gateway's pods: the agent object name they serve
	GatewayBundleDir = "/bundle"
	GatewaySecretDir = "/run/paseo"
	SecretKeyModel   = "model-key" // the provider key of the model route
	SecretKeyMCP     = "mcp-token" // the daemon's bearer of the MCP route
	// GatewayUID is the gateway's uid, gid and fsGroup: no grant names
	// one (the gateway is not the sandbox); a fixed non-root id, the
	// Secret's files group-readable (0440) under the fsGroup.
	GatewayUID      = 65532
	gatewayCtr      = "gateway"
	gatewayFilesVol = "bundle"
	gatewaySecVol   = "credentials"
	// configMapMax is the apiserver's bound on a ConfigMap's data.
	configMapMax = 1 << 20
)

// Gateway is the cluster gateway serving the plan's routes
// (`paseo-policy gateway`, docs/kubernetes.md "The cluster gateway"):
// its policies, the bundle it serves, its Deployment and the Service the
// agent's Pod reaches it by.
type Gateway struct {
	NetworkPolicy *networkingv1.NetworkPolicy
	Cilium        *CiliumNetworkPolicy // nil when every upstream is an address
	Bundle        *corev1.ConfigMap
	Deployment    *appsv1.Deployment
	Service       *corev1.Service
}

// Objects are the gateway's objects in apply order: its policies before
// the Pod they confine, the bundle before the Deployment that mounts it.
func (g *Gateway) Objects() []any {
	out := []any{g.NetworkPolicy}
	if g.Cilium != nil {
		out = append(out, g.Cilium)
	}
	return append(out, g.Bundle, g.Deployment, g.Service)
}

// Owns says whether a traced object (Kind/name) is one of the gateway's.
func (g *Gateway) Owns(obj string) bool {
	if g == nil {
		return false
	}
	return obj == "NetworkPolicy/"+g.NetworkPolicy.Name || obj == "ConfigMap/"+g.Bundle.Name ||
		obj == "Deployment/"+g.Deployment.Name || obj == "Service/"+g.Service.Name ||
		(g.Cilium != nil && obj == "CiliumNetworkPolicy/"+g.Cilium.Name)
}

// gatewayName is the gateway's objects' name: a DNS label (a Service's
// name must be one) of at most 63 characters, hashed like objectName.
func gatewayName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "paseo-gw-" + dnsPart(id, 45) + "-" + hex.EncodeToString(sum[:4])
}

// gatewayOptions checks the gateway options: both or neither, the image by
// digest, the Secret's name a name, and a plan with routes to serve. It
// says whether the gateway is rendered.
func (r *renderer) gatewayOptions() bool {
	o := r.opt
	if o.GatewayImage == "" && o.GatewaySecret == "" {
		return false
	}
	ok := true
	if o.GatewayImage == "" {
		r.refuse("options.gatewayImage", "the gateway's Secret is named but not its image: give the paseo-policy image by digest (name@sha256:<64 hex>)")
		ok = false
	} else if !isImageDigest(o.GatewayImage) {
		r.refuse("options.gatewayImage", "the gateway's image must be named by digest: name@sha256:<64 hex>")
		ok = false
	}
	if o.GatewaySecret == "" {
		r.refuse("options.gatewaySecret", "the gateway needs the name of the Secret holding its route credentials (keys %s, %s)", SecretKeyModel, SecretKeyMCP)
		ok = false
	} else if errs := validation.IsDNS1123Subdomain(o.GatewaySecret); len(errs) > 0 {
		r.refuse("options.gatewaySecret", "the gateway's Secret name is not a Secret's name: %s", strings.Join(errs, "; "))
		ok = false
	}
	if len(r.routes) == 0 {
		r.refuse("options.gatewayImage", "the plan has no route for a gateway to serve (network mode %s)", r.modeName())
		ok = false
	}
	for _, rt := range r.routes {
		if rt.Login() {
			r.refuse(rt.Why().Fact, "the %s route brokers a subscription login, whose auth.json and refresh live on the launcher's host: the cluster gateway serves api-key model routes only", rt.Purpose)
			ok = false
		}
		if rt.Purpose == grant.RouteMCP {
			if h, err := upstreamHost(rt.Upstream); err != nil || isLoopback(h) {
				r.refuse(rt.Why().Fact, "the MCP route's upstream %s is the launcher host's loopback (or no host), which in the gateway's Pod is the Pod's own: name the daemon's MCP listener where the gateway's Pod reaches it (an address or name of the cluster)", rt.Upstream)
				ok = false
			}
		}
	}
	return ok
}

func (r *renderer) modeName() string {
	if r.mode == nil {
		return "unset"
	}
	return r.mode.Mode
}

// upstreamHost is a route upstream's host and port.
func upstreamHost(raw string) (hostPort, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return hostPort{}, fmt.Errorf("the upstream %q has no host", raw)
	}
	p, ok := urlPort(u)
	if !ok {
		return hostPort{}, fmt.Errorf("the upstream %q has no port", raw)
	}
	return hostPort{host: u.Hostname(), port: p}, nil
}

type hostPort struct {
	host string
	port int
}

func urlPort(u *url.URL) (int, bool) {
	if ps := u.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		return n, err == nil && n > 0 && n < 65536
	}
	switch u.Scheme {
	case "https":
		return 443, true
	case "http":
		return 80, true
	}
	return 0, false
}

func isLoopback(h hostPort) bool {
	if a, err := netip.ParseAddr(h.host); err == nil {
		return a.Unmap().IsLoopback() || a.IsUnspecified()
	}
	return strings.EqualFold(strings.TrimSuffix(h.host, "."), "localhost")
}

// gatewayObjects renders the gateway: called after the network grants,
// only when gatewayOptions passed.
func (r *renderer) gatewayObjects() {
	name := gatewayName(r.m.Agent)
	g := &Gateway{}
	labels := r.gatewayLabels()
	sel := map[string]string{LabelRole: RoleGateway, LabelGatewayFor: r.name}
	r.gatewayBundle(g, name, labels)
	if g.Bundle == nil {
		return
	}
	r.gatewayDeployment(g, name, labels, sel)
	r.gatewayService(g, name, labels, sel)
	r.gatewayPolicy(g, name, labels, sel)
	r.out.Gateway = g
}

// gatewayLabels are the gateway pods' labels: the role and deployment the
// docs have always named, and the agent they serve, which the agent's
// NetworkPolicy selects so that it reaches its own gateway only.
func (r *renderer) gatewayLabels() map[string]string {
	return map[string]string{
		LabelRole:                      RoleGateway,
		LabelDeployment:                labelValue(r.m.Deployment),
		LabelGatewayFor:                r.name,
		"app.kubernetes.io/managed-by": "paseo-policy",
	}
}

// gatewayBundle puts every bundle file but pins.json in a ConfigMap of its
// own, one key per file ('/' spelled '_'), immutable and named for its
// content: the gateway reads and verifies the whole bundle
// (launchplan.Load), not only the files the agent's Pod mounts.
func (r *renderer) gatewayBundle(g *Gateway, name string, labels map[string]string) {
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Immutable:  ptr(true),
	}
	h := sha256.New()
	keys := map[string]string{}
	size := 0
	for _, path := range slices.Sorted(maps.Keys(r.files)) {
		if path == bundle.PinsFile {
			// The agent's node's state (devices and inodes of its bind
			// sources): the gateway stages no bind, and the manifest
			// does not digest it.
			continue
		}
		key := strings.ReplaceAll(path, "/", "_")
		if !configKeyChars.MatchString(key) || keys[key] != "" {
			r.refuse("bundle", "the bundle file %s has no ConfigMap key of its own", path)
			return
		}
		keys[key] = path
		data := r.files[path]
		size += len(key) + len(data)
		fmt.Fprintf(h, "%s\x00%s\x00", key, bundle.Digest(data))
		putConfigMapData(cm, key, data)
	}
	if size > configMapMax {
		r.refuse("bundle", "the bundle is %d bytes, more than a ConfigMap holds (%d)", size, configMapMax)
		return
	}
	cm.Name = name + "-bundle-" + hex.EncodeToString(h.Sum(nil))[:8]
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		r.fixed("ConfigMap/"+cm.Name, "data["+key+"]", bundle.Digest(r.files[keys[key]]), "the bundle's "+keys[key]+", as its manifest digests it: the gateway reads and verifies the whole bundle")
	}
	g.Bundle = cm
	r.gwKeys = keys
}

// gatewayDeployment is the gateway's Pod: `paseo-policy gateway` on the
// bundle, each file mounted with subPath (a ConfigMap volume links its
// keys through ..data, and bundle.Read follows no link), the credentials
// likewise from the Secret; no RuntimeClass (the gateway is the trusted
// side), no API token, non-root, read-only, nothing to escalate.
func (r *renderer) gatewayDeployment(g *Gateway, name string, labels, sel map[string]string) {
	obj := "Deployment/" + name
	t := "spec.template.spec."
	c := t + "containers[0]."
	uid := int64(GatewayUID)
	ctr := corev1.Container{
		Name:    gatewayCtr,
		Image:   r.opt.GatewayImage,
		Command: []string{"paseo-policy"},
		Args:    []string{"gateway", "--listen", "0.0.0.0"},
		SecurityContext: &corev1.SecurityContext{
			Privileged:               ptr(false),
			AllowPrivilegeEscalation: ptr(false),
			ReadOnlyRootFilesystem:   ptr(true),
			RunAsNonRoot:             ptr(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
	r.fixed(obj, c+"image", r.opt.GatewayImage, "the --gateway-image option: the paseo-policy image, by digest")
	r.fixed(obj, c+"command", "paseo-policy", "the gateway command of the paseo-policy image (on its PATH); the image's entrypoint is not used")
	r.fixed(obj, c+"args[0:3]", "gateway --listen 0.0.0.0", "every route port on the Pod's own address; the Service forwards each to it")
	r.fixed(obj, c+"securityContext", "privileged false, allowPrivilegeEscalation false, readOnlyRootFilesystem true, runAsNonRoot true, capabilities.drop ALL", "the gateway needs no privilege, no write and no capability: it reads files and proxies TCP on unprivileged ports")
	secret := &corev1.SecretVolumeSource{SecretName: r.opt.GatewaySecret, DefaultMode: ptr(int32(0o440))}
	for _, rt := range r.routes {
		key, flag := SecretKeyMCP, "--mcp-token-file"
		if rt.Purpose == grant.RouteModel {
			key, flag = SecretKeyModel, "--model-key-file"
		}
		file := GatewaySecretDir + "/" + key
		secret.Items = append(secret.Items, corev1.KeyToPath{Key: key, Path: key})
		ctr.Args = append(ctr.Args, flag, file)
		r.trace(obj, fmt.Sprintf(c+"args[%d:%d]", len(ctr.Args)-2, len(ctr.Args)), flag+" "+file, rt)
		ctr.Ports = append(ctr.Ports, corev1.ContainerPort{Name: string(rt.Purpose), ContainerPort: int32(rt.Port), Protocol: corev1.ProtocolTCP})
		r.trace(obj, fmt.Sprintf(c+"ports[%d]", len(ctr.Ports)-1), "tcp/"+strconv.Itoa(rt.Port)+" ("+string(rt.Purpose)+" route)", rt)
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: gatewaySecVol, MountPath: file, SubPath: key, ReadOnly: true})
		r.trace(obj, fmt.Sprintf(c+"volumeMounts[%d]", len(ctr.VolumeMounts)-1), file+" <- Secret "+r.opt.GatewaySecret+" key "+key+" (0440)", rt)
	}
	ctr.Args = append(ctr.Args, GatewayBundleDir)
	r.fixed(obj, fmt.Sprintf(c+"args[%d]", len(ctr.Args)-1), GatewayBundleDir, "the bundle the gateway serves, from the ConfigMap "+g.Bundle.Name)
	for _, key := range slices.Sorted(maps.Keys(r.gwKeys)) {
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: gatewayFilesVol, MountPath: GatewayBundleDir + "/" + r.gwKeys[key], SubPath: key, ReadOnly: true})
	}
	r.fixed(obj, c+"volumeMounts", "each bundle file at "+GatewayBundleDir+"/<its path>, by subPath", "a ConfigMap volume links its keys through ..data, which bundle.Read refuses as any link: with subPath the kubelet binds each file itself")
	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					"paseo.dev/agent":    r.m.Agent,
					"paseo.dev/manifest": bundle.Digest(r.files[bundle.ManifestFile]),
				}},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken: ptr(false),
					EnableServiceLinks:           ptr(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr(true), RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{ctr},
					Volumes: []corev1.Volume{
						{Name: gatewayFilesVol, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: g.Bundle.Name}, DefaultMode: ptr(int32(0o444))}}},
						{Name: gatewaySecVol, VolumeSource: corev1.VolumeSource{Secret: secret}},
					},
				},
			},
		},
	}
	r.fixed(obj, "spec.replicas", "1", "one gateway per bundle, as `paseo-policy gateway` serves one: the route's scope is this agent's")
	r.fixed(obj, "spec.strategy.type", "Recreate", "a new bundle's gateway never serves beside the old one's")
	r.fixed(obj, "spec.selector.matchLabels", LabelRole+"="+RoleGateway+", "+LabelGatewayFor+"="+r.name, "the gateway of this agent's Pod")
	r.fixed(obj, "spec.template.metadata.annotations[paseo.dev/manifest]", d.Spec.Template.Annotations["paseo.dev/manifest"], "the manifest the gateway serves, by the sha256 of manifest.json")
	r.fixed(obj, t+"runtimeClassName", "unset", "the gateway is the trusted side (it holds the key), not a sandbox: the node's default runtime")
	r.fixed(obj, t+"automountServiceAccountToken", "false", "the gateway needs no Kubernetes API credential")
	r.fixed(obj, t+"enableServiceLinks", "false", "the environment holds nothing the rendering did not write")
	r.fixed(obj, t+"securityContext", fmt.Sprintf("runAsUser, runAsGroup, fsGroup %d; runAsNonRoot; seccompProfile RuntimeDefault", GatewayUID), "a fixed non-root id (no grant names the gateway's); the Secret's files are root's, group-readable (0440) under the fsGroup, as the gateway's credential check admits")
	r.fixed(obj, t+"volumes[1].secret", r.opt.GatewaySecret+" (mode 0440, only the routes' keys)", "the --gateway-secret option: the Secret is named, never rendered; the agent's Pod mounts no Secret")
	g.Deployment = d
}

// gatewayService is where the agent's Pod reaches the gateway: the
// cluster IP its hostAliases name, one port per route.
func (r *renderer) gatewayService(g *Gateway, name string, labels, sel map[string]string) {
	obj := "Service/" + name
	ip := r.opt.GatewayIP
	s := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Selector:   sel,
		},
	}
	r.fixed(obj, "spec.clusterIP", ip, "the --gateway-ip option: the address the agent's Pod names the gateway by (its hostAliases)")
	for _, rt := range r.routes {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: string(rt.Purpose), Protocol: corev1.ProtocolTCP, Port: int32(rt.Port), TargetPort: intstr.FromInt32(int32(rt.Port))})
		r.trace(obj, fmt.Sprintf("spec.ports[%d]", len(s.Spec.Ports)-1), "tcp/"+strconv.Itoa(rt.Port)+" ("+string(rt.Purpose)+" route)", rt)
	}
	g.Service = s
}

// gatewayPolicy confines the gateway: ingress only from this agent's Pod
// on the route ports, egress only to the routes' upstreams. An upstream
// by address is an IP block; by name, networking/v1 cannot say it, and the
// CiliumNetworkPolicy's toFQDNs (with the DNS lookups of those names) does.
func (r *renderer) gatewayPolicy(g *Gateway, name string, labels, sel map[string]string) {
	obj := "NetworkPolicy/" + name
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	r.fixed(obj, "spec.policyTypes", "Ingress, Egress", "deny by default in both directions: only the rules below pass")
	agent := metav1.LabelSelector{MatchLabels: map[string]string{LabelSandbox: r.name}}
	in := networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &agent}}}
	var named []grant.Route
	var names []hostPort
	for _, rt := range r.routes {
		in.Ports = append(in.Ports, port("tcp", rt.Port))
		r.trace(obj, fmt.Sprintf("spec.ingress[0].ports[%d]", len(in.Ports)-1), "tcp/"+strconv.Itoa(rt.Port)+" from this agent's Pod ("+LabelSandbox+"="+r.name+")", rt)
		up, _ := upstreamHost(rt.Upstream) // checked in gatewayOptions for MCP; a model upstream is compiled from a URL
		a, err := netip.ParseAddr(up.host)
		if err != nil {
			named, names = append(named, rt), append(names, up)
			r.gap(rt, "the gateway's egress to "+up.host+": networking/v1 names no hosts, so only the CiliumNetworkPolicy's toFQDNs allows it (a cluster without Cilium gives the gateway no way to it)")
			continue
		}
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}}},
			Ports: []networkingv1.NetworkPolicyPort{port("tcp", up.port)},
		})
		r.trace(obj, fmt.Sprintf("spec.egress[%d]", len(np.Spec.Egress)-1), "tcp/"+strconv.Itoa(up.port)+" to "+up.host+" ("+string(rt.Purpose)+" route's upstream)", rt)
	}
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{in}
	g.NetworkPolicy = np
	if len(named) == 0 {
		return
	}
	cobj := "CiliumNetworkPolicy/" + name
	c := &CiliumNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: ciliumAPIVersion, Kind: ciliumKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       CiliumRule{EndpointSelector: metav1.LabelSelector{MatchLabels: sel}},
	}
	var dns []FQDNSelector
	for i, rt := range named {
		up := names[i]
		c.Spec.Egress = append(c.Spec.Egress, CiliumEgressRule{
			ToFQDNs: []FQDNSelector{{MatchName: up.host}},
			ToPorts: []CiliumPortRule{{Ports: []CiliumPort{{Port: strconv.Itoa(up.port), Protocol: "TCP"}}}},
		})
		r.trace(cobj, fmt.Sprintf("spec.egress[%d]", len(c.Spec.Egress)-1), "tcp/"+strconv.Itoa(up.port)+" to "+up.host+" ("+string(rt.Purpose)+" route's upstream)", rt)
		if !slices.Contains(dns, FQDNSelector{MatchName: up.host}) {
			dns = append(dns, FQDNSelector{MatchName: up.host})
		}
	}
	slices.SortFunc(dns, func(a, b FQDNSelector) int { return strings.Compare(a.MatchName, b.MatchName) })
	c.Spec.Egress = append(c.Spec.Egress, CiliumEgressRule{
		ToEndpoints: []metav1.LabelSelector{{MatchLabels: kubeDNS}},
		ToPorts:     []CiliumPortRule{{Ports: []CiliumPort{{Port: "53", Protocol: "ANY"}}, Rules: &CiliumL7Rules{DNS: dns}}},
	})
	for _, rt := range named {
		r.trace(cobj, fmt.Sprintf("spec.egress[%d]", len(c.Spec.Egress)-1), "kube-dns, lookups of the upstreams' names only", rt)
	}
	g.Cilium = c
}
