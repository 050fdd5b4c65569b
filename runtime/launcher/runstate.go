package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/policy/bundle"
)

// What the launcher adds to the run copy of config.json
//
// The compiled bundle is a function of its inputs and cannot know what only
// exists at launch: the container's cgroup, in sandbox mode the network
// namespace built for it, and the private overlay over the image that the
// launch runs on (rootfs.go). The launcher fills in exactly these three
// fields in its private copy, and points each bind at the source it
// staged in the run dir (binds.go), and nothing else; everything a
// reviewer approved stays as compiled.
//
// The run copy is the launch plan's decoded spec, copied where the launch
// changes it; the phases collect the values (runtimeState), and start
// patches them in and writes the copy once, just before runsc starts. Nothing reads it back.

type runtimeState struct {
	cgroupsPath string
	netnsPath   string
	// privateRoot mounts an overlay over the image (rootfs.go).
	privateRoot bool
	// binds are the bind sources staged in the run dir (binds.go); every
	// bind with a host source must be one of them.
	binds []stagedBind
	// fsmonitor is the workspace monitor, when the plan grants one
	// (fsmonitor.go); it adds nothing to the run copy.
	fsmonitor *fsmonitorState
	// search is the native search, when the plan grants it
	// (nativesearch.go); it adds nothing to the run copy.
	search *nativeSearchState
}

// runSpec copies the parts of the plan's verified spec a launch changes
// (the process env, the mounts, the root, the namespaces), so patching the
// copy leaves the plan as it was judged. Everything else is shared and
// never written.
func runSpec(compiled *rspec.Spec) (*rspec.Spec, error) {
	if compiled == nil || compiled.Linux == nil || compiled.Root == nil {
		return nil, fmt.Errorf("%s has no linux section or no root", bundle.ConfigFile)
	}
	s := *compiled
	if s.Process != nil {
		p := *s.Process
		p.Env = slices.Clone(p.Env)
		s.Process = &p
	}
	s.Mounts = slices.Clone(s.Mounts)
	root := *s.Root
	s.Root = &root
	linux := *s.Linux
	linux.Namespaces = slices.Clone(linux.Namespaces)
	s.Linux = &linux
	return &s, nil
}

// writeSpec fills the launch-time fields into spec, the run copy, and
// writes it into the run dir: the one write of the run copy.
func (r *runDir) writeSpec(spec *rspec.Spec, st runtimeState) error {
	spec.Linux.CgroupsPath = st.cgroupsPath
	// The plan's validator required an absolute read-only root and only
	// new namespaces (ocicheck invariants readonly-root, namespaces); the
	// run copy is those verified values, so they are not judged again here.
	if st.privateRoot {
		merged, err := r.mountRoot(spec.Root.Path)
		if err != nil {
			return err
		}
		spec.Root.Path = merged
	}
	if err := useStaged(spec, st.binds, r.dir); err != nil {
		return err
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
		return fmt.Errorf("compiled spec has no network namespace")
	}
	out, err := bundle.Marshal(spec)
	if err != nil {
		return err
	}
	// Read by runsc as root; the run dir (0700) keeps it from everyone
	// else on the host, with the credential it may hold.
	if err := os.WriteFile(filepath.Join(r.dir, bundle.ConfigFile), out, 0o600); err != nil {
		return fmt.Errorf("run copy of %s: %w", bundle.ConfigFile, err)
	}
	return nil
}
