package kubernetes_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/pkg/securitycontext"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/agentsandbox"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// TestRenderedPodOnContainerdRunsc runs a rendered Pod the way a node does:
// the reference facts compiled (testbundle: the real compiler and profile,
// a busybox image, the argv a long sleep), rendered for Kubernetes, then
// given to containerd's CRI as the kubelet would give it (RunPodSandbox on
// the runsc handler, CreateContainer and StartContainer from the Pod's
// fields), with the image imported from a local archive built from the
// plan's own rootfs. Probes through the CRI's ExecSync (the kubelet's exec
// probes) check what the rendering promised: gVisor, the read-only root,
// the uid and gid, no capabilities, no new privileges, the argv, env, cwd
// and hostname, and each mount's content and access.
func TestRenderedPodOnContainerdRunsc(t *testing.T) {
	nodePrerequisites(t)
	argv := []string{"/bin/busybox", "sleep", "600"}
	s := testbundle.New(t, testbundle.Options{Argv: argv})
	files, err := bundle.Read(s.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := files.Verify(); err != nil {
		t.Fatal(err)
	}

	// The image holds the plan's rootfs and the mount points of the Pod's
	// mounts (a read-only root cannot make them at start); its digest is
	// only known once it is built, so the Pod is rendered twice.
	first, err := kubernetes.Render(files, kubernetes.Options{Image: "paseo.test/probe@sha256:" + strings.Repeat("0", 64)})
	if err != nil {
		t.Fatal(err)
	}
	imgDir := t.TempDir()
	entries := treeEntries(t, s.Rootfs)
	addMountPoints(entries, first.Pod)
	// A directory anyone may write, so that a write the root refuses is the
	// read-only root's refusal (EROFS), not a permission's.
	entries["probe-rw"] = layerEntry{dir: true, mode: 0o1777}
	probe := buildImage(t, imgDir, "paseo.test/probe:1", entries, nil)
	pause := buildImage(t, imgDir, "paseo.test/pause:1", map[string]layerEntry{
		"bin": {dir: true, mode: 0o755}, "bin/busybox": {data: readFile(t, "/bin/busybox"), mode: 0o755},
		"proc": {dir: true, mode: 0o755}, "dev": {dir: true, mode: 0o755}, "sys": {dir: true, mode: 0o755},
	}, []string{"/bin/busybox", "sleep", "2147483647"})
	r, err := kubernetes.Render(files, kubernetes.Options{Image: probe.ByDigest()})
	if err != nil {
		t.Fatal(err)
	}
	pod := r.Pod
	// The agent-sandbox rendering's template runs this same Pod: what the
	// node proves of the one, it proves of the other.
	as, err := agentsandbox.Render(files, kubernetes.Options{Image: probe.ByDigest()})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := yamlOf(t, as.Template.Spec.PodTemplate.Spec), yamlOf(t, pod.Spec); !bytes.Equal(got, want) {
		t.Fatal("the SandboxTemplate's Pod spec is not the rendered Pod's")
	}

	// The kubelet's volumes, made before the node starts (its private mount
	// namespace sees the host's mounts as they were then).
	vols := materialize(t, pod, r.ConfigMap)
	n := startNode(t, pause.Name)
	n.importImage(t, pause)
	n.importImage(t, probe)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The kubelet asks for the image by the Pod's reference and pulls only
	// when it is absent; here it must be present (nothing is pulled).
	// The CRI learns of an import from containerd's events, so it may take
	// a moment to list it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, err := n.Img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: pod.Spec.Containers[0].Image}})
		if err == nil && st.Image != nil {
			break
		}
		if time.Now().After(deadline) {
			l, _ := n.Img.ListImages(ctx, &cri.ListImagesRequest{})
			t.Fatalf("image %s is not on the node (%v); it has %v", pod.Spec.Containers[0].Image, err, l)
		}
	}

	sandboxCfg := podSandboxConfig(t, pod, n.dir)
	sb, err := n.CRI.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: sandboxCfg, RuntimeHandler: runtimeHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := n.CRI.StopPodSandbox(c, &cri.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("StopPodSandbox: %v", err)
		}
		if _, err := n.CRI.RemovePodSandbox(c, &cri.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("RemovePodSandbox: %v", err)
		}
	})
	ctrCfg := containerConfig(t, pod, vols)
	cc, err := n.CRI.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: ctrCfg, SandboxConfig: sandboxCfg})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := n.CRI.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	c := &pod.Spec.Containers[0]
	exec := func(args ...string) (stdout, stderr string, code int32) {
		t.Helper()
		res, err := n.CRI.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: cc.ContainerId, Cmd: args, Timeout: 30})
		if err != nil {
			t.Fatalf("ExecSync %v: %v", args, err)
		}
		return string(res.Stdout), string(res.Stderr), res.ExitCode
	}

	t.Run("gvisor", func(t *testing.T) {
		if out, _, _ := exec("/bin/busybox", "dmesg"); !strings.Contains(out, "gVisor") {
			t.Errorf("dmesg does not say gVisor: %q", out)
		}
	})
	t.Run("identity", func(t *testing.T) {
		for flag, want := range map[string]int64{"-u": *c.SecurityContext.RunAsUser, "-g": *c.SecurityContext.RunAsGroup} {
			if out, _, _ := exec("/bin/busybox", "id", flag); strings.TrimSpace(out) != fmt.Sprint(want) {
				t.Errorf("id %s = %q, want %d", flag, out, want)
			}
		}
	})
	t.Run("no-capabilities-no-new-privileges", func(t *testing.T) {
		out, _, _ := exec("/bin/busybox", "cat", "/proc/1/status")
		for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if !strings.Contains(out, f+":\t0000000000000000\n") {
				t.Errorf("%s is not empty:\n%s", f, out)
			}
		}
		if !strings.Contains(out, "NoNewPrivs:\t1\n") {
			t.Errorf("NoNewPrivs is not set:\n%s", out)
		}
	})
	t.Run("read-only-root", func(t *testing.T) {
		if _, errOut, code := exec("/bin/busybox", "touch", "/probe-rw/x"); code == 0 || !strings.Contains(errOut, "Read-only file system") {
			t.Errorf("the root took a new file (exit %d, %q)", code, errOut)
		}
	})
	t.Run("process", func(t *testing.T) {
		if out, _, _ := exec("/bin/busybox", "cat", "/proc/1/cmdline"); out != strings.Join(c.Command, "\x00")+"\x00" {
			t.Errorf("argv %q, want %q", out, c.Command)
		}
		environ, _, _ := exec("/bin/busybox", "cat", "/proc/1/environ")
		for _, e := range c.Env {
			if !slices.Contains(strings.Split(environ, "\x00"), e.Name+"="+e.Value) {
				t.Errorf("the process's environment lacks %s=%s", e.Name, e.Value)
			}
		}
		if out, _, _ := exec("/bin/busybox", "readlink", "/proc/1/cwd"); strings.TrimSpace(out) != c.WorkingDir {
			t.Errorf("cwd %q, want %s", out, c.WorkingDir)
		}
		if out, _, _ := exec("/bin/busybox", "hostname"); strings.TrimSpace(out) != pod.Spec.Hostname {
			t.Errorf("hostname %q, want %s", out, pod.Spec.Hostname)
		}
	})
	t.Run("mounts", func(t *testing.T) {
		for _, m := range c.VolumeMounts {
			v := volume(pod, m.Name)
			file := v.ConfigMap != nil || (v.HostPath != nil && *v.HostPath.Type == corev1.HostPathFile)
			if v.ConfigMap != nil {
				if out, _, _ := exec("/bin/busybox", "cat", m.MountPath); out != r.ConfigMap.Data[m.SubPath] {
					t.Errorf("%s holds %q, not the ConfigMap's %s", m.MountPath, out, m.SubPath)
				}
			}
			// A write: opening a file for append writes nothing; a directory
			// gets a file that is removed at once. Every host side is
			// writable by anyone (materialize), so a read-only mount refuses
			// with EROFS and a writable one takes the write.
			script := `set -e; p="$1/.paseo-probe"; echo probe > "$p"; rm "$p"`
			if file {
				script = `: >> "$1"`
			}
			_, errOut, code := exec("/bin/busybox", "sh", "-c", script, "sh", m.MountPath)
			erofs := code != 0 && strings.Contains(errOut, "Read-only file system")
			if m.ReadOnly != erofs || (!m.ReadOnly && code != 0) {
				t.Errorf("%s: readOnly %v, but the write gave exit %d %q", m.MountPath, m.ReadOnly, code, errOut)
			}
		}
		// The workspace is the host's: what the Pod writes there, the host reads.
		ws := c.WorkingDir
		if _, errOut, code := exec("/bin/busybox", "sh", "-c", `echo from-pod > "$1/from-pod"`, "sh", ws); code != 0 {
			t.Fatalf("writing the workspace: %s", errOut)
		}
		var st unix.Stat_t
		if data, err := os.ReadFile(filepath.Join(ws, "from-pod")); err != nil || string(data) != "from-pod\n" {
			t.Errorf("the host reads %q from the workspace (%v)", data, err)
		} else if err := unix.Stat(filepath.Join(ws, "from-pod"), &st); err != nil || int64(st.Uid) != *c.SecurityContext.RunAsUser {
			t.Errorf("the Pod's file is uid %d on the host, want %d (%v)", st.Uid, *c.SecurityContext.RunAsUser, err)
		}
	})

	// The runtime grants (runsc flags) the Pod cannot carry are the node's
	// runsc config: every runsc the shim ran for this Pod had them.
	t.Run("runsc-flags", func(t *testing.T) {
		logs, _ := filepath.Glob(filepath.Join(n.dir, "runsc-*-boot.log"))
		if len(logs) == 0 {
			t.Fatal("no runsc boot log")
		}
		for _, l := range logs {
			data := readFile(t, l)
			for _, flag := range []string{"--directfs=false", "--network=sandbox"} {
				if !bytes.Contains(data, []byte(flag)) {
					t.Errorf("%s: runsc ran without %s", filepath.Base(l), flag)
				}
			}
		}
	})

	// A suspend that keeps the agent's state would be the kubelet's
	// checkpoint (CRI CheckpointContainer). On this node it is refused:
	// containerd's CRI checkpoints through CRIU (runc's path) and the runsc
	// shim's task Checkpoint is not implemented (docs/kubernetes.md,
	// "Suspend and resume"). The refusal changes nothing: the container
	// still runs and no archive is left.
	t.Run("cri-checkpoint-refused", func(t *testing.T) {
		archive := filepath.Join(n.dir, "checkpoint.tar")
		_, err := n.CRI.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: cc.ContainerId, Location: archive, Timeout: 30})
		if err == nil {
			t.Fatal("CheckpointContainer of a runsc container succeeded: docs/kubernetes.md says the node cannot, update it (and the suspend mapping)")
		}
		t.Logf("CheckpointContainer refused: %v", err)
		if _, err := os.Stat(archive); err == nil {
			t.Error("a refused checkpoint left an archive")
		}
		st, err := n.CRI.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: cc.ContainerId})
		if err != nil || st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("after the refused checkpoint the container is %v (%v)", st.GetStatus().GetState(), err)
		}
		if out, _, code := exec("/bin/busybox", "echo", "alive"); code != 0 || out != "alive\n" {
			t.Errorf("after the refused checkpoint exec gives %d %q", code, out)
		}
	})

	if _, err := n.CRI.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: cc.ContainerId, Timeout: 5}); err != nil {
		t.Errorf("StopContainer: %v", err)
	}
	if _, err := n.CRI.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		t.Errorf("RemoveContainer: %v", err)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func volume(pod *corev1.Pod, name string) corev1.Volume {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	panic("no volume " + name)
}

// addMountPoints adds each volume mount's mount point to the image: an
// empty file for a file mount, else a directory, with their parents.
func addMountPoints(entries map[string]layerEntry, pod *corev1.Pod) {
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		v := volume(pod, m.Name)
		rel := strings.TrimPrefix(m.MountPath, "/")
		for d := filepath.Dir(rel); d != "." && d != "/"; d = filepath.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = layerEntry{dir: true, mode: 0o755}
			}
		}
		if _, ok := entries[rel]; ok {
			continue
		}
		if v.ConfigMap != nil || (v.HostPath != nil && *v.HostPath.Type == corev1.HostPathFile) {
			entries[rel] = layerEntry{mode: 0o644}
		} else {
			entries[rel] = layerEntry{dir: true, mode: 0o755}
		}
	}
}

// materialize makes each volume's host side as the kubelet does: a
// hostPath is its path; a ConfigMap's keys are files of their own and a
// subPath mount binds one; a memory emptyDir is a tmpfs of its size limit,
// world-writable. It returns the host path of each volume mount, by mount
// path. Every host side is then made writable by anyone (the ConfigMap
// files too, not their defaultMode), so the probes' writes meet the
// mounts' read-only flags and nothing else.
func materialize(t *testing.T, pod *corev1.Pod, cm *corev1.ConfigMap) map[string]string {
	t.Helper()
	podDir := t.TempDir()
	out := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		v := volume(pod, m.Name)
		switch {
		case v.HostPath != nil:
			out[m.MountPath] = v.HostPath.Path
			openUp(t, v.HostPath.Path)
		case v.ConfigMap != nil:
			dir := filepath.Join(podDir, "volumes", "kubernetes.io~configmap", v.Name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, m.SubPath)
			if err := os.WriteFile(p, []byte(cm.Data[m.SubPath]), 0o444); err != nil {
				t.Fatal(err)
			}
			openUp(t, p)
			out[m.MountPath] = p
		case v.EmptyDir != nil:
			dir := filepath.Join(podDir, "volumes", "kubernetes.io~empty-dir", v.Name)
			if err := os.MkdirAll(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+fmt.Sprint(v.EmptyDir.SizeLimit.Value())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
					t.Errorf("unmount %s: %v", dir, err)
				}
			})
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			out[m.MountPath] = dir
		default:
			t.Fatalf("volume %s of a kind the test cannot make", v.Name)
		}
	}
	return out
}

// openUp makes p writable by anyone: 0777 for a directory, 0666 for a file.
func openUp(t *testing.T, p string) {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	mode := os.FileMode(0o666)
	if st.IsDir() {
		mode = 0o777
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// podSandboxConfig is the kubelet's PodSandboxConfig for the fields this
// Pod uses (kuberuntime's generatePodSandboxConfig): its metadata,
// hostname, labels, DNS and its namespaces.
func podSandboxConfig(t *testing.T, pod *corev1.Pod, dir string) *cri.PodSandboxConfig {
	t.Helper()
	logDir := filepath.Join(dir, "pods", "paseo_"+pod.Name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": "paseo", "io.kubernetes.pod.uid": "paseo-test-uid"}
	for k, v := range pod.Labels {
		labels[k] = v
	}
	pid := cri.NamespaceMode_CONTAINER
	if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		pid = cri.NamespaceMode_POD
	}
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: pod.Name, Namespace: "paseo", Uid: "paseo-test-uid"},
		Hostname:     pod.Spec.Hostname,
		LogDirectory: logDir,
		Labels:       labels,
		Annotations:  pod.Annotations,
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_POD, Pid: pid, Ipc: cri.NamespaceMode_POD},
		}},
	}
	if pod.Spec.DNSConfig != nil {
		cfg.DnsConfig = &cri.DNSConfig{Options: []string{"ndots:1"}}
	}
	return cfg
}

// containerConfig is the kubelet's ContainerConfig for the fields this Pod
// uses (kuberuntime's generateContainerConfig and its Linux part): the
// image, argv, cwd, env, mounts, resources and security context, with the
// kubelet's default masked and read-only /proc paths.
func containerConfig(t *testing.T, pod *corev1.Pod, vols map[string]string) *cri.ContainerConfig {
	t.Helper()
	c := &pod.Spec.Containers[0]
	sc := c.SecurityContext
	cfg := &cri.ContainerConfig{
		Metadata:   &cri.ContainerMetadata{Name: c.Name},
		Image:      &cri.ImageSpec{Image: c.Image},
		Command:    c.Command,
		Args:       c.Args,
		WorkingDir: c.WorkingDir,
		Labels:     map[string]string{"io.kubernetes.container.name": c.Name, "io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": "paseo"},
		LogPath:    c.Name + "/0.log",
		Stdin:      c.Stdin,
		StdinOnce:  c.StdinOnce,
		Tty:        c.TTY,
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("env %s comes from a Secret; this test's plan has none", e.Name)
		}
		cfg.Envs = append(cfg.Envs, &cri.KeyValue{Key: e.Name, Value: []byte(e.Value)})
	}
	for _, m := range c.VolumeMounts {
		cfg.Mounts = append(cfg.Mounts, &cri.Mount{ContainerPath: m.MountPath, HostPath: vols[m.MountPath], Readonly: m.ReadOnly, Propagation: cri.MountPropagation_PROPAGATION_PRIVATE})
	}
	// The kubelet's score for a Guaranteed Pod (its limits equal its
	// requests); the node clamps it to its own (userns_test.go).
	res := &cri.LinuxContainerResources{OomScoreAdj: -997}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		res.CpuPeriod, res.CpuQuota, res.CpuShares = 100000, q.MilliValue()*100000/1000, q.MilliValue()*1024/1000
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		res.MemoryLimitInBytes = q.Value()
	}
	var drop []string
	for _, d := range sc.Capabilities.Drop {
		drop = append(drop, string(d))
	}
	procMount := corev1.DefaultProcMount
	cfg.Linux = &cri.LinuxContainerConfig{
		Resources: res,
		SecurityContext: &cri.LinuxContainerSecurityContext{
			Capabilities:     &cri.Capability{DropCapabilities: drop},
			NamespaceOptions: podSandboxConfig(t, pod, t.TempDir()).Linux.SecurityContext.NamespaceOptions,
			RunAsUser:        &cri.Int64Value{Value: *sc.RunAsUser},
			RunAsGroup:       &cri.Int64Value{Value: *sc.RunAsGroup},
			ReadonlyRootfs:   *sc.ReadOnlyRootFilesystem,
			NoNewPrivs:       !*sc.AllowPrivilegeEscalation,
			Seccomp:          &cri.SecurityProfile{ProfileType: cri.SecurityProfile_RuntimeDefault},
			MaskedPaths:      securitycontext.ConvertToRuntimeMaskedPaths(&procMount),
			ReadonlyPaths:    securitycontext.ConvertToRuntimeReadonlyPaths(&procMount),
		},
	}
	if sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("seccomp %s; the rendering writes RuntimeDefault", sc.SeccompProfile.Type)
	}
	return cfg
}
