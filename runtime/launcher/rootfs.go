package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher/mounts"
)

// A private root for every launch
//
// The compiled root is the shared, versioned image, read-only inside the
// sandbox. But runsc creates missing bind-mount destinations on the host
// side of the root (measured with the pinned runsc, under every overlay
// setting), which would change the image's digest and leave one
// deployment's paths visible to the next sandbox; and a root that is itself
// a read-only mount makes such a launch fail. So each launch runs on an
// overlay in its private run dir: the image as the lower layer, an empty
// upper layer that only runsc's mount points ever land in, removed with the
// run dir. The sandbox still sees the root read-only (root.readonly).

// mountRoot mounts the overlay over lower and returns the merged path.
func (r *runDir) mountRoot(lower string) (string, error) {
	if !filepath.IsAbs(lower) || strings.ContainsAny(lower, ",:\\") {
		return "", fmt.Errorf("image root %q cannot be an overlay lower layer (relative, or holds ',', ':' or '\\')", lower)
	}
	if fi, err := os.Stat(lower); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("image root %s: not a directory (%v)", lower, err)
	}
	base := filepath.Join(r.dir, "root")
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("private overlay over the image: %w", err)
	}
	r.root = merged
	return merged, nil
}

// unmountRoot detaches the overlay (and anything runsc left below it).
func (r *runDir) unmountRoot() error {
	if r.root == "" {
		return nil
	}
	err := mounts.UnmountBeneath(r.root)
	r.root = ""
	return err
}
