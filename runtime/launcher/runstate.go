package launcher

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/policy/bundle"
)

// What the launcher adds to the run copy of config.json
//
// The compiled bundle is a function of its inputs and cannot know what only
// exists at launch: the container's cgroup, in sandbox mode the network
// namespace built for it, and the private overlay over the image that the
// launch runs on (rootfs.go). The launcher fills in exactly these three
// fields in its private copy (besides secret placeholders), and points
// each bind at the source it staged in the run dir (binds.go), and nothing
// else; everything a reviewer approved stays as compiled.

// CgroupsPath is the cgroup of container id. runsc applies the spec's
// resources only when a cgroups path is set, so every launch sets one.
func CgroupsPath(id string) string { return "/" + cgroupParent + "/" + id }

type runtimeState struct {
	cgroupsPath string
	netnsPath   string
	// privateRoot mounts an overlay over the image (rootfs.go).
	privateRoot bool
	// binds are the bind sources staged in the run dir (binds.go); every
	// bind with a host source must be one of them.
	binds []stagedBind
}

// patchSpec fills in the launch-time fields and returns the compiled
// memory limit (0 if none).
func (r *runDir) patchSpec(st runtimeState) (memLimit int64, err error) {
	p := filepath.Join(r.dir, bundle.ConfigFile)
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	var spec rspec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return 0, fmt.Errorf("run copy of config.json: %w", err)
	}
	if spec.Linux == nil {
		return 0, fmt.Errorf("run copy of config.json has no linux section")
	}
	spec.Linux.CgroupsPath = st.cgroupsPath
	// The plan's validator required an absolute read-only root and only
	// new namespaces (ocicheck invariants readonly-root, namespaces); the
	// run copy is those verified bytes, so they are not judged again here.
	if spec.Root == nil {
		return 0, fmt.Errorf("run copy of config.json has no root")
	}
	if st.privateRoot {
		merged, err := r.mountRoot(spec.Root.Path)
		if err != nil {
			return 0, err
		}
		spec.Root.Path = merged
	}
	if err := useStaged(&spec, st.binds, r.dir); err != nil {
		return 0, err
	}
	found := false
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type != rspec.NetworkNamespace {
			continue
		}
		found = true
		spec.Linux.Namespaces[i].Path = st.netnsPath
	}
	if !found {
		return 0, fmt.Errorf("compiled spec has no network namespace")
	}
	out, err := bundle.Marshal(&spec)
	if err != nil {
		return 0, err
	}
	if r := spec.Linux.Resources; r != nil && r.Memory != nil && r.Memory.Limit != nil {
		memLimit = *r.Memory.Limit
	}
	return memLimit, os.WriteFile(p, out, 0o600)
}
