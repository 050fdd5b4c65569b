// Package kubernetes renders a bundle's plan of grants for Kubernetes: a
// Pod on the gvisor RuntimeClass, the ConfigMap of the bundle files it
// mounts, a default-deny NetworkPolicy and, where the plan names hosts, a
// CiliumNetworkPolicy. It is a third rendering of the same reviewed plan,
// beside config.json and egress.json.
//
// It reads the bundle's manifest (the grants and the header), the bundle
// files its mounts name, the kinds pins.json records, and the Options: the
// two facts about the cluster a plan does not hold. Nothing else, so the
// same bundle and options give the same bytes. Every field it sets is
// traced to the grant that made it (Trace), and every grant Kubernetes has
// no field for is listed with what stands in for it (Gap). What it cannot
// render faithfully it refuses (PP-KUBE-RENDER), all problems at once.
package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/netdest"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// RuntimeClass is the RuntimeClass the Pod names; its handler on the node
// is containerd's runsc shim (docs/kubernetes.md).
const RuntimeClass = "gvisor"

// Labels the rendering writes and selects by.
const (
	LabelSandbox    = "paseo.dev/sandbox"    // the Pod's own name: what the policies select
	LabelDeployment = "paseo.dev/deployment" // the deployment, as a label value
	LabelRole       = "paseo.dev/role"       // "gateway" on the pods serving the plan's routes
	RoleGateway     = "gateway"
	containerName   = "agent"
)

// Options are what the cluster knows and the plan does not.
type Options struct {
	// Image is the OCI image that holds the plan's rootfs, by digest
	// (name@sha256:<64 hex>). The plan pins its rootfs by the digest of the
	// tree; which OCI image carries that tree is the operator's to say.
	Image string
	// GatewayIP is where the sandbox reaches the gateway serving its routes
	// (the cluster IP of that Service); required when the plan has routes.
	GatewayIP string
	// GatewayImage is the paseo-policy image, by digest, whose
	// `paseo-policy gateway` serves the plan's routes, and GatewaySecret
	// the name of the Secret holding their credentials (keys model-key and
	// mcp-token; never a value). Given, the rendering deploys the gateway
	// (Rendering.Gateway); both empty, the gateway is the operator's.
	GatewayImage  string
	GatewaySecret string
}

// Rendering is the plan as Kubernetes objects, with the trace of every
// field and the grants Kubernetes cannot carry.
type Rendering struct {
	ConfigMap     *corev1.ConfigMap // nil when the Pod mounts no bundle file
	Pod           *corev1.Pod
	NetworkPolicy *networkingv1.NetworkPolicy
	Cilium        *CiliumNetworkPolicy // nil when the plan names no host
	Gateway       *Gateway             // nil unless the gateway options are given
	Trace         []Trace
	Gaps          []Gap
}

// Trace says which grant set one field. Grant is the grant's key, empty for
// the few fields the rendering fixes itself (its Reason says why).
type Trace struct {
	Object string `json:"object"` // Kind/name
	Field  string `json:"field"`  // a JSON path in the object
	Value  string `json:"value"`
	Grant  string `json:"grant,omitempty"`
	Fact   string `json:"fact,omitempty"`
	Reason string `json:"reason"`
}

// Gap is a grant with no Kubernetes field, and what stands in for it.
type Gap struct {
	Grant   string `json:"grant"`
	Fact    string `json:"fact"`
	StandIn string `json:"standIn"`
}

// renderer holds one rendering's state; every method adds to out or diags.
type renderer struct {
	m     *bundle.Manifest
	files bundle.Files
	kinds map[string]string // pin kind (dir, file) by bind destination
	opt   Options
	diags diag.List
	out   *Rendering

	name    string
	pod     *corev1.Pod
	ctr     *corev1.Container
	gateway string // the gateway's host name, from egress.json

	// the network grants, read after every grant is seen
	egress []grant.Egress
	routes []grant.Route
	mode   *grant.NetworkMode
	hosts  *grant.Mount // the /etc/hosts grant
	resolv *grant.Mount // the /etc/resolv.conf grant
	// bundle files the Pod mounts, by ConfigMap key
	cmKeys map[string]string
	// the gateway's: whether it is rendered, and its ConfigMap keys' paths
	withGateway bool
	gwKeys      map[string]string
}

// Render renders files, a bundle the caller has verified (its digests tie
// every file to the manifest), for Kubernetes.
func Render(files bundle.Files, opt Options) (*Rendering, error) {
	m, err := files.Manifest()
	if err != nil {
		return nil, err
	}
	pins, err := files.Pins()
	if err != nil {
		return nil, err
	}
	r := &renderer{m: m, files: files, opt: opt, kinds: map[string]string{}, out: &Rendering{}, cmKeys: map[string]string{}}
	for _, p := range pins.Pins {
		r.kinds[p.Destination] = p.Kind
	}
	if _, ok := files[bundle.EgressFile]; ok {
		eg, err := files.Egress()
		if err != nil {
			return nil, err
		}
		if eg.Gateway != nil {
			r.gateway = eg.Gateway.Name
		}
	}
	r.skeleton()
	for _, g := range m.Grants {
		r.grant(g)
	}
	r.withGateway = r.gatewayOptions()
	r.network()
	r.configMap()
	if r.withGateway && len(r.diags) == 0 {
		r.gatewayObjects()
	}
	if len(r.diags) > 0 {
		return nil, r.diags
	}
	return r.out, nil
}

func (r *renderer) refuse(fact, format string, args ...any) {
	r.diags.Addf(diag.KubeRender, fact, format, args...)
}

// trace records that g set field of obj to value.
func (r *renderer) trace(obj, field, value string, g grant.Grant) {
	p := g.Why()
	r.out.Trace = append(r.out.Trace, Trace{Object: obj, Field: field, Value: value, Grant: g.Key(), Fact: p.Fact, Reason: p.Reason})
}

// fixed records a field the rendering sets on its own, and why.
func (r *renderer) fixed(obj, field, value, reason string) {
	r.out.Trace = append(r.out.Trace, Trace{Object: obj, Field: field, Value: value, Reason: reason})
}

func (r *renderer) gap(g grant.Grant, standIn string) {
	r.out.Gaps = append(r.out.Gaps, Gap{Grant: g.Key(), Fact: g.Why().Fact, StandIn: standIn})
}

func (r *renderer) podRef() string { return "Pod/" + r.name }

// skeleton is the Pod before any grant: its names and the fields no grant
// could widen (no API token, no service links, restart never).
func (r *renderer) skeleton() {
	r.name = objectName(r.m.Agent)
	r.pod = &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   r.name,
			Labels: r.labels(),
			Annotations: map[string]string{
				"paseo.dev/agent":      r.m.Agent,
				"paseo.dev/deployment": r.m.Deployment,
				"paseo.dev/profile":    r.m.Profile,
				"paseo.dev/manifest":   bundle.Digest(r.files[bundle.ManifestFile]),
			},
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:             ptr(RuntimeClass),
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr(false),
			EnableServiceLinks:           ptr(false),
			Containers:                   []corev1.Container{{Name: containerName, SecurityContext: &corev1.SecurityContext{}}},
		},
	}
	r.ctr = &r.pod.Spec.Containers[0]
	r.out.Pod = r.pod
	p := r.podRef()
	r.fixed(p, "metadata.annotations[paseo.dev/manifest]", r.pod.Annotations["paseo.dev/manifest"], "the manifest this Pod renders, by the sha256 of manifest.json")
	r.fixed(p, "spec.runtimeClassName", RuntimeClass, "every grant is a grant of a gVisor sandbox: the node's runsc shim runs the Pod (docs/kubernetes.md)")
	r.fixed(p, "spec.restartPolicy", "Never", "a launch runs once; the daemon starts the next")
	r.fixed(p, "spec.automountServiceAccountToken", "false", "no grant gives the sandbox a Kubernetes API credential")
	r.fixed(p, "spec.enableServiceLinks", "false", "the environment is the plan's env grants and nothing else")
	r.fixed(p, "spec.containers[0].securityContext.seccompProfile", "RuntimeDefault", "the runtime's default filter (Pod Security restricted); gVisor's Sentry serves the system calls")
	r.ctr.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	if !isImageDigest(r.opt.Image) {
		r.refuse("options.image", "the image must be named by digest: name@sha256:<64 hex>")
	}
}

func (r *renderer) labels() map[string]string {
	return map[string]string{
		LabelSandbox:                   r.name,
		LabelDeployment:                labelValue(r.m.Deployment),
		"app.kubernetes.io/managed-by": "paseo-policy",
	}
}

// grant renders one grant, in plan order.
func (r *renderer) grant(g grant.Grant) {
	p, sc := r.podRef(), r.ctr.SecurityContext
	c := "spec.containers[0]."
	switch g := g.(type) {
	case grant.Rootfs:
		r.ctr.Image = r.opt.Image
		sc.ReadOnlyRootFilesystem = ptr(g.ReadOnly)
		r.pod.Annotations["paseo.dev/image"] = g.Version + " " + g.Digest
		r.trace(p, c+"image", r.opt.Image, g)
		r.trace(p, "metadata.annotations[paseo.dev/image]", g.Version+" "+g.Digest, g)
		r.trace(p, c+"securityContext.readOnlyRootFilesystem", fmt.Sprint(g.ReadOnly), g)
	case grant.Argv:
		r.trace(p, fmt.Sprintf(c+"command[%d]", len(r.ctr.Command)), strings.Join(g.Words, " "), g)
		r.ctr.Command = append(r.ctr.Command, g.Words...)
	case grant.Cwd:
		r.ctr.WorkingDir = g.Dir
		r.trace(p, c+"workingDir", g.Dir, g)
	case grant.Identity:
		id := int64(g.ID)
		if g.Field == "uid" {
			sc.RunAsUser, sc.RunAsNonRoot = &id, ptr(true)
			r.trace(p, c+"securityContext.runAsUser", fmt.Sprint(id), g)
			r.trace(p, c+"securityContext.runAsNonRoot", "true", g)
		} else {
			sc.RunAsGroup = &id
			r.trace(p, c+"securityContext.runAsGroup", fmt.Sprint(id), g)
		}
	case grant.Capabilities:
		sc.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
		r.trace(p, c+"securityContext.capabilities.drop", "ALL", g)
	case grant.NoNewPrivileges:
		sc.AllowPrivilegeEscalation = ptr(!g.On)
		r.trace(p, c+"securityContext.allowPrivilegeEscalation", fmt.Sprint(!g.On), g)
	case grant.Terminal:
		r.ctr.TTY, r.ctr.Stdin = g.On, true
		r.trace(p, c+"tty", fmt.Sprint(g.On), g)
		r.trace(p, c+"stdin", "true", g)
	case grant.Namespace:
		r.namespace(g)
	case grant.Hostname:
		r.pod.Spec.Hostname = g.Name
		r.trace(p, "spec.hostname", g.Name, g)
	case grant.Mount:
		r.mount(g)
	case grant.Env:
		r.env(g)
	case grant.CgroupMax:
		r.cgroup(g)
	case grant.CPUQuota:
		r.cpu(g)
	case grant.WallLimit:
		secs := int64(g.Wall.Seconds())
		r.pod.Spec.ActiveDeadlineSeconds = &secs
		r.trace(p, "spec.activeDeadlineSeconds", fmt.Sprint(secs), g)
	case grant.Rlimit:
		r.gap(g, "none in a Pod: the node runtime's default rlimits apply (containerd's); the memory and CPU limits still bound the sandbox")
	case grant.OutputLimit:
		r.gap(g, "none in a Pod: the kubelet's node-wide containerLogMaxSize rotates the log, and nothing ends the Pod for its output")
	case grant.DirectFS:
		r.gap(g, "the node's runsc config for the gvisor handler (runsc.toml: directfs = false), which the rendering cannot see (docs/kubernetes.md)")
	case grant.NetworkMode:
		r.mode = &g
		if g.Mode == "none" {
			r.gap(g, "a Pod always has a network: the NetworkPolicy denies all ingress and egress instead of a loopback-only stack")
		} else {
			r.gap(g, "the node's runsc config for the gvisor handler (network = sandbox, gVisor's own stack in the pod's netns); the NetworkPolicy filters it")
		}
	case grant.Search:
		if !g.On {
			r.gap(g, "none in a Pod, and none needed: the search is off, so the Pod's rg is the image's, as in the sandbox")
			break
		}
		r.gap(g, "none in a Pod: no launcher serves the native search there; its client is not mounted and PATH is rendered without its directory, so the Pod's rg, fd, find and cat are the image's, reading through gVisor as with the search off")
	case grant.FSMonitor:
		r.gap(g, "none in a Pod: no launcher serves the workspace monitor there; its hook is not mounted and core.fsmonitor is rendered false, so the sandbox's git scans the workspace in full, as with the monitor off")
	case grant.Egress:
		r.egress = append(r.egress, g)
	case grant.Route:
		r.routes = append(r.routes, g)
	default:
		r.refuse(g.Why().Fact, "grant %s has no Kubernetes rendering", g.Key())
	}
}

func (r *renderer) namespace(g grant.Namespace) {
	p := r.podRef()
	switch g.Type {
	case "pid":
		r.pod.Spec.ShareProcessNamespace = ptr(false)
		r.trace(p, "spec.shareProcessNamespace", "false", g)
		r.trace(p, "spec.hostPID", "false (unset)", g)
	case "network":
		r.trace(p, "spec.hostNetwork", "false (unset)", g)
	case "ipc":
		r.trace(p, "spec.hostIPC", "false (unset)", g)
	case "uts", "mount":
		// Every Pod has its own; under gVisor the Sentry's.
		r.trace(p, "spec", g.Type+" namespace: the Pod's own, always", g)
	default:
		r.refuse(g.Why().Fact, "namespace %s has no Pod field", g.Type)
	}
}

// objectName is the agent's id as a DNS label: "paseo-", the id lowered
// with other characters made '-', and a hash of the exact id so that ids
// differing only in case or punctuation get different names.
func objectName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "paseo-" + dnsPart(id, 48) + "-" + hex.EncodeToString(sum[:4])
}

var notDNS = regexp.MustCompile(`[^a-z0-9]+`)

func dnsPart(s string, max int) string {
	s = strings.Trim(notDNS.ReplaceAllString(strings.ToLower(s), "-"), "-")
	if len(s) > max {
		s = strings.TrimRight(s[:max], "-")
	}
	if s == "" {
		s = "x"
	}
	return s
}

// labelValue is a deployment id as a label value, hashed like objectName.
func labelValue(id string) string {
	sum := sha256.Sum256([]byte(id))
	return dnsPart(id, 54) + "-" + hex.EncodeToString(sum[:4])
}

var imageDigest = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$`)

func isImageDigest(s string) bool { return imageDigest.MatchString(s) }

// gatewayAddr checks the gateway option: an address, of no unsafe class.
func gatewayAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("the gateway must be an IP address (its Service's cluster IP)")
	}
	if v := netdest.Addr(a); v.Unsafe() {
		return netip.Addr{}, fmt.Errorf("the gateway address is unsafe: %s", v.Why)
	}
	return a, nil
}

func ptr[T any](v T) *T { return &v }
