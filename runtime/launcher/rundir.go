package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/mounts"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// runDir is the private, root-only copy of a bundle a launch runs from.
type runDir struct {
	dir  string
	root string // the private overlay root, while mounted
}

func newRunDir(stateRoot, id string) (*runDir, error) {
	if err := statedir.ValidID(id); err != nil {
		return nil, refused(diag.LaunchID, "id", err)
	}
	base := statedir.RunDirs(stateRoot)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(stateRoot, 0o700); err != nil {
		return nil, err
	}
	dir := statedir.RunDir(stateRoot, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run dir for %s: %w (is the id in use?)", id, err)
	}
	return &runDir{dir: dir}, nil
}

// materialize writes the plan's bundle files into the run dir and returns
// the run copy of the spec, which start writes once it is complete
// (runstate.go); the reviewed bundle itself is never modified. No secret
// goes into either: the plan's validator refused any placeholder.
func (r *runDir) materialize(plan *launchplan.Plan) (*rspec.Spec, error) {
	spec, err := runSpec(plan.Spec)
	if err != nil {
		return nil, err
	}
	files := plan.Files
	if data, ok := files[bundle.MCPConfigFile]; ok {
		mcp, err := checkMCP(data)
		if err != nil {
			return nil, err
		}
		// Read by the agent through the gofer, so readable inside the
		// sandbox; the run dir (0700) keeps it from everyone else.
		if err := r.writeFile(bundle.MCPConfigFile, mcp, 0o444); err != nil {
			return nil, err
		}
	}
	if hook, ok := files[bundle.FSMonitorHookFile]; ok {
		// Run by the sandbox's git: executable, read-only.
		if err := r.writeFile(bundle.FSMonitorHookFile, hook, 0o555); err != nil {
			return nil, err
		}
	}
	if index, ok := files[bundle.FSMonitorIndexFile]; ok {
		// Compiled empty; the launcher writes the vouched index over it
		// before runsc starts (fsmonitor.go). Read by the start script,
		// whose cp gives the private copy this mode: 0644, as host git
		// leaves an index, so the sandbox user can write over it (Git
		// itself replaces it by rename).
		if err := r.writeFile(bundle.FSMonitorIndexFile, index, 0o644); err != nil {
			return nil, err
		}
	}
	if client, ok := files[bundle.SearchClientFile]; ok {
		// Run as rg by the sandbox's shell and tools: executable, read-only.
		if err := r.writeFile(bundle.SearchClientFile, client, 0o555); err != nil {
			return nil, err
		}
	}
	if spool, ok := files[bundle.SearchSpoolFile]; ok {
		// Compiled empty; the search server writes cat's bytes into it.
		// Read by the sandbox user through the gofer (its bind is
		// read-only); the run dir (0700) keeps it from everyone else.
		if err := r.writeFile(bundle.SearchSpoolFile, spool, 0o644); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{bundle.HostsFile, bundle.ResolvFile, bundle.GitHeadFile, bundle.ModelsFile} {
		if _, ok := files[name]; !ok && (name == bundle.GitHeadFile || name == bundle.ModelsFile) {
			continue // only a main worktree's layout has a HEAD, only a model route a models.json
		}
		// Readable by the sandbox user through the gofer.
		if err := r.writeFile(name, files[name], 0o644); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

func (r *runDir) writeFile(name string, data []byte, mode os.FileMode) error {
	p := filepath.Join(r.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.WriteFile(p, data, mode)
}

// remove unmounts the private root and removes the run dir; what it
// cannot remove, it reports (and gc retries).
func (r *runDir) remove() error {
	return errors.Join(r.unmountRoot(), mounts.RemoveDir(r.dir))
}
