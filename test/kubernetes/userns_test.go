package kubernetes_test

import "syscall"

// nodeNamespaces are the namespaces the test's node runs in: its own
// network and mount namespaces, and a user namespace that maps every uid
// and gid but the last to itself.
//
// Why a user namespace: the runsc shim sets its own oom_score_adj to -999
// (gvisor.dev/gvisor/pkg/shim/v1 manager.go), which needs CAP_SYS_RESOURCE,
// and this machine's kernel gives no process that capability (it is
// missing from every bounding set, root's included). containerd's shim
// library ignores that refusal in a user namespace, as it does for every
// rootless containerd, and nowhere else; with the last id unmapped the
// namespace is one (a full identity map reads as the initial namespace).
// Every id the test uses maps to itself, so files on the host keep their
// owners, and runsc still runs as root, of this namespace. On a real node
// (CAP_SYS_RESOURCE held) none of this is needed; docs/kubernetes.md.
func nodeNamespaces() *syscall.SysProcAttr {
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1<<32 - 2}}
	return &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET,
		UidMappings:                ids,
		GidMappings:                ids,
		GidMappingsEnableSetgroups: true,
		Pdeathsig:                  syscall.SIGKILL,
	}
}
