package preflight

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/compiler/pathsafe"
)

const bundleConfigName = bundle.ConfigFile

// bundleResult holds the three bundle checks; each is judged on its own so
// a report names every problem, not just the first.
type bundleResult struct {
	digests, hooks, pins error
	pinsOK               string
}

func checkBundle(dir string) bundleResult {
	files, err := bundle.Read(dir)
	return checkBundleFiles(files, err, dir, true)
}

// checkBundleFiles checks the bundle as read (readErr: why it could not be
// read). resolvePins re-resolves pinned sources by path: doctor's advisory
// check. A launch checks each pin on the descriptor it mounts instead
// (launcher/binds.go), so here it only requires pins.json to belong to the
// manifest.
func checkBundleFiles(files bundle.Files, readErr error, dir string, resolvePins bool) bundleResult {
	if readErr != nil {
		skipped := errors.New("not checked: the bundle could not be read")
		return bundleResult{digests: readErr, hooks: skipped, pins: skipped}
	}
	var r bundleResult
	if err := files.Verify(); err != nil {
		r.digests = fmt.Errorf("bundle %s fails verification: %w", dir, err)
	}
	r.hooks = checkNoHooks(files[bundle.ConfigFile])
	r.pinsOK, r.pins = checkPins(files, resolvePins)
	return r
}

// checkNoHooks refuses an OCI config with a hooks object at all, even an
// empty one: hooks run on the host, outside the sandbox, and paseo bundles
// never contain them. Only hook kinds and counts are reported, never paths,
// arguments or environment.
func checkNoHooks(config []byte) error {
	var spec specs.Spec
	if err := json.Unmarshal(config, &spec); err != nil {
		return fmt.Errorf("%s is not a valid OCI runtime config: %w", bundle.ConfigFile, err)
	}
	if spec.Hooks == nil {
		return nil
	}
	h := spec.Hooks
	counts := map[string]int{
		"prestart":        len(h.Prestart), // deprecated, still run by runtimes
		"createRuntime":   len(h.CreateRuntime),
		"createContainer": len(h.CreateContainer),
		"startContainer":  len(h.StartContainer),
		"poststart":       len(h.Poststart),
		"poststop":        len(h.Poststop),
	}
	var kinds []string
	for k, n := range counts {
		if n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
	}
	sort.Strings(kinds)
	if len(kinds) == 0 {
		return fmt.Errorf("%s has a hooks object (empty); hooks run on the host and are refused", bundle.ConfigFile)
	}
	return fmt.Errorf("%s has hooks (%s); hooks run on the host and are refused", bundle.ConfigFile, strings.Join(kinds, ", "))
}

// checkPins requires pins.json to belong to this bundle's manifest with one
// pin per host bind (bundle.PinnedBinds) and, with resolve, re-resolves every pinned bind source by path and requires
// the same device, inode and kind as at compile time, so a directory
// renamed away and replaced (or swapped for a symlink) since compile is
// reported. That is advice for doctor: only the launcher's check on the
// descriptor it mounts holds for the launch (launcher/binds.go).
func checkPins(files bundle.Files, resolve bool) (string, error) {
	pairs, err := files.PinnedBinds() // without pins.json, any host bind is refused
	if err != nil {
		return "", err
	}
	if _, ok := files[bundle.PinsFile]; !ok {
		return "no " + bundle.PinsFile + " and no bind with a host source", nil
	}
	if !resolve {
		return fmt.Sprintf("%d pin(s), one per host bind, for this manifest; each is checked on the descriptor the launcher mounts", len(pairs)), nil
	}
	pins := make([]bundle.Pin, len(pairs))
	for i, bp := range pairs {
		pins[i] = bp.Pin
	}
	var problems []string
	for _, p := range pins {
		if err := checkPin(p); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("%d of %d pinned bind source(s) changed since compile: %s", len(problems), len(pins), strings.Join(problems, "; "))
	}
	return fmt.Sprintf("%d pinned bind source(s) resolve to the same device, inode and kind", len(pins)), nil
}

func checkPin(p bundle.Pin) error {
	where := fmt.Sprintf("pin %s (source %s)", p.Destination, p.Source)
	if !filepath.IsAbs(p.Source) || filepath.Clean(p.Source) != p.Source {
		return fmt.Errorf("%s: source is not an absolute clean path", where)
	}
	// No O_NOFOLLOW: with RESOLVE_NO_SYMLINKS a trailing symlink then fails
	// with ELOOP instead of opening the link itself, so the reason is clear.
	fd, err := unix.Openat2(unix.AT_FDCWD, p.Source, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("%s: %s", where, openat2Reason(err))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: stat: %v", where, err)
	}
	kind := string(pathsafe.KindOf(st.Mode))
	if st.Dev != p.Dev || st.Ino != p.Ino || kind != p.Kind {
		return fmt.Errorf("%s: now dev %d inode %d kind %s, compiled as dev %d inode %d kind %s; the path was replaced", where, st.Dev, st.Ino, kind, p.Dev, p.Ino, p.Kind)
	}
	return nil
}

func openat2Reason(err error) string {
	switch {
	case errors.Is(err, unix.ELOOP):
		return "a path component is a symlink; pinned sources are re-resolved without following links"
	case errors.Is(err, unix.ENOENT):
		return "no longer exists"
	case errors.Is(err, unix.ENOTDIR):
		return "a component of the path is not a directory"
	case errors.Is(err, unix.ENOSYS):
		return "openat2 is unavailable (kernel older than 5.6)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "permission denied while resolving"
	}
	return "openat2: " + err.Error()
}
