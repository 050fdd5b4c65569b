package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// filesVolume is the one volume of the bundle files the Pod mounts.
const filesVolume = "bundle-files"

// runtimeMounts are the kernel filesystems and device dirs every container
// of the node runtime gets (containerd's default spec: /proc, /dev tmpfs,
// /dev/pts, /dev/shm, /sys read-only); a Pod cannot name them.
var runtimeMounts = map[string]string{"/proc": "proc", "/dev": "tmpfs", "/dev/pts": "devpts", "/dev/shm": "tmpfs", "/sys": "sysfs"}

// mount renders one mount grant: a host bind as a hostPath volume, a
// bundle file as a key of the ConfigMap, a tmpfs as a memory emptyDir, with
// the grant's read-only flag. /etc/hosts and /etc/resolv.conf wait for the
// network grants (network.go).
func (r *renderer) mount(g grant.Mount) {
	p := r.podRef()
	if t, ok := runtimeMounts[g.Destination]; ok && t == g.Type {
		r.trace(p, "spec.containers[0]", g.Destination+": the node runtime's own "+g.Type+" (containerd's default spec)", g)
		return
	}
	switch {
	case g.Type == "bind" && g.Source == bundle.SearchClientFile:
		r.gap(g, "none in a Pod: no launcher serves the native search there, so its client is not mounted and PATH is rendered without its directory")
	case g.Type == "bind" && g.Source == bundle.SearchSpoolFile:
		r.gap(g, "none in a Pod: no launcher serves the native search there, so its spool is not mounted")
	case g.Type == "bind" && slices.Contains(bundle.InternalSources, g.Source):
		switch g.Destination {
		case "/etc/hosts":
			r.hosts = &g
		case "/etc/resolv.conf":
			r.resolv = &g
		case bundle.FSMonitorHookPath:
			r.gap(g, "none in a Pod: no launcher serves the workspace monitor there, so its hook is not mounted and core.fsmonitor is rendered false (the env entry traced to the same grant)")
		case bundle.FSMonitorIndexPath:
			r.gap(g, "none in a Pod: no launcher vouches for the workspace there, so the vouched index is not mounted and the start script seeds the private Git dir with the worktree's own index")
		default:
			r.fileMount(g)
		}
	case g.Type == "bind":
		r.hostPath(g)
	case g.Type == "tmpfs":
		r.emptyDir(g)
	case g.Type == "erofs":
		r.gap(g, "the OCI image carries "+g.Destination+" itself; the node does not check the plan's EROFS digest")
	default:
		r.refuse(g.Why().Fact, "a %s mount at %s has no Pod volume", g.Type, g.Destination)
	}
}

func (r *renderer) volumeName(prefix string) string {
	return prefix + "-" + strconv.Itoa(len(r.pod.Spec.Volumes))
}

func (r *renderer) addMount(v corev1.Volume, m corev1.VolumeMount) {
	r.pod.Spec.Volumes = append(r.pod.Spec.Volumes, v)
	r.ctr.VolumeMounts = append(r.ctr.VolumeMounts, m)
}

func (r *renderer) mountField() string {
	return fmt.Sprintf("spec.containers[0].volumeMounts[%d]", len(r.ctr.VolumeMounts)-1)
}

// hostPath binds a host source. Its pin (root, device, inode) has no Pod
// field; the hostPath type (Directory or File) is what the kubelet checks.
func (r *renderer) hostPath(g grant.Mount) {
	var t corev1.HostPathType
	switch r.kinds[g.Destination] {
	case "dir":
		t = corev1.HostPathDirectory
	case "file":
		t = corev1.HostPathFile
	default:
		r.refuse(g.Why().Fact, "the bind at %s has no pin of a directory or a file in pins.json", g.Destination)
		return
	}
	name := r.volumeName("host")
	r.addMount(corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: g.Source, Type: &t}}},
		corev1.VolumeMount{Name: name, MountPath: g.Destination, ReadOnly: g.ReadOnly(), MountPropagation: ptr(corev1.MountPropagationNone)})
	r.trace(r.podRef(), r.mountField(), fmt.Sprintf("%s <- hostPath %s (%s) %s", g.Destination, g.Source, t, g.Access()), g)
	r.gap(g, "the kubelet checks only that "+g.Source+" is a "+strings.ToLower(string(t))+
		"; the plan's pin of its device and inode, and its options "+strings.Join(dropAccess(g.Options), ",")+
		", have no Pod field (gVisor's gofer serves the bind)")
}

// fileMount mounts a bundle file from the ConfigMap at its destination.
// A ConfigMap volume is read-only, so a writable bundle file is refused.
func (r *renderer) fileMount(g grant.Mount) {
	if !g.ReadOnly() {
		r.refuse(g.Why().Fact, "the bundle file %s is granted writable, and a ConfigMap volume is read-only", g.Source)
		return
	}
	key, ok := configKey(g.Source)
	if !ok {
		r.refuse(g.Why().Fact, "the bundle file %s has no name a ConfigMap key can be", g.Source)
		return
	}
	r.cmKeys[key] = g.Source
	if !slices.ContainsFunc(r.pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == filesVolume }) {
		// Named by configMap, once every file is known.
		r.pod.Spec.Volumes = append(r.pod.Spec.Volumes, corev1.Volume{Name: filesVolume, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{DefaultMode: ptr(int32(0o444))}}})
	}
	r.ctr.VolumeMounts = append(r.ctr.VolumeMounts, corev1.VolumeMount{Name: filesVolume, MountPath: g.Destination, SubPath: key, ReadOnly: true})
	r.trace(r.podRef(), r.mountField(), g.Destination+" <- "+g.Source+" ro", g)
}

// emptyDir is a tmpfs: a memory emptyDir bounded by the grant's size.
func (r *renderer) emptyDir(g grant.Mount) {
	size, ok := tmpfsSize(g.Options)
	if !ok {
		r.refuse(g.Why().Fact, "the tmpfs at %s has no size a Pod can bound", g.Destination)
		return
	}
	name := r.volumeName("tmp")
	q := resource.NewQuantity(size, resource.BinarySI)
	r.addMount(corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: q}}},
		corev1.VolumeMount{Name: name, MountPath: g.Destination, ReadOnly: g.ReadOnly()})
	r.trace(r.podRef(), r.mountField(), fmt.Sprintf("%s <- emptyDir Memory %s %s", g.Destination, q, g.Access()), g)
	if rest := dropAccess(slices.DeleteFunc(slices.Clone(g.Options), func(o string) bool { return strings.HasPrefix(o, "size=") })); len(rest) > 0 {
		r.gap(g, "an emptyDir's options "+strings.Join(rest, ",")+" have no Pod field: the kubelet makes it world-writable (0777); only the sandbox's one uid runs in it")
	}
}

// dropAccess is the options but the access and bind flags, which the volume
// mount carries.
func dropAccess(opts []string) []string {
	return slices.DeleteFunc(slices.Clone(opts), func(o string) bool { return o == "ro" || o == "rw" || o == "bind" || o == "rbind" })
}

// tmpfsSize is a tmpfs size= option in bytes (a k, m or g suffix allowed).
func tmpfsSize(opts []string) (int64, bool) {
	for _, o := range opts {
		v, ok := strings.CutPrefix(o, "size=")
		if !ok {
			continue
		}
		mult := int64(1)
		switch {
		case strings.HasSuffix(v, "k"):
			mult, v = 1<<10, strings.TrimSuffix(v, "k")
		case strings.HasSuffix(v, "m"):
			mult, v = 1<<20, strings.TrimSuffix(v, "m")
		case strings.HasSuffix(v, "g"):
			mult, v = 1<<30, strings.TrimSuffix(v, "g")
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > (1<<62)/mult {
			return 0, false
		}
		return n * mult, true
	}
	return 0, false
}

var configKeyChars = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// configKey is a bundle file's ConfigMap key: its base name.
func configKey(source string) (string, bool) {
	k := path.Base(source)
	return k, configKeyChars.MatchString(k) && k != "." && k != ".."
}

// configMap holds the bundle files the Pod mounts, byte for byte. It is
// immutable and named for its content (the Pod's name and the sha256 of its
// keys and files), so a later launch of the same agent with other files
// gets a ConfigMap of its own instead of editing one a Pod uses.
func (r *renderer) configMap() {
	if len(r.cmKeys) == 0 {
		return
	}
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Labels: r.labels()},
		Immutable:  ptr(true),
	}
	h := sha256.New()
	for _, key := range slices.Sorted(maps.Keys(r.cmKeys)) {
		fmt.Fprintf(h, "%s\x00%s\x00", key, bundle.Digest(r.files[r.cmKeys[key]]))
	}
	cm.Name = r.name + "-files-" + hex.EncodeToString(h.Sum(nil))[:8]
	for i := range r.pod.Spec.Volumes {
		if v := &r.pod.Spec.Volumes[i]; v.Name == filesVolume {
			v.ConfigMap.Name = cm.Name
		}
	}
	r.fixed(r.podRef(), "spec.volumes["+filesVolume+"]", "ConfigMap "+cm.Name+" mode 0444", "the bundle files the plan mounts, generated and read-only")
	for key, src := range r.cmKeys {
		data, ok := r.files[src]
		if !ok {
			r.refuse("", "the bundle has no %s, which a mount names", src)
			continue
		}
		putConfigMapData(cm, key, data)
		r.fixed("ConfigMap/"+cm.Name, "data["+key+"]", bundle.Digest(data), "the bundle's "+src+", as its manifest digests it")
	}
	r.out.ConfigMap = cm
}

// putConfigMapData puts a bundle file's bytes under key: as text when they
// are UTF-8 (data), else as binaryData, which a ConfigMap needs for any
// other bytes.
func putConfigMapData(cm *corev1.ConfigMap, key string, data []byte) {
	if utf8.Valid(data) {
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[key] = string(data)
		return
	}
	if cm.BinaryData == nil {
		cm.BinaryData = map[string][]byte{}
	}
	cm.BinaryData[key] = data
}
