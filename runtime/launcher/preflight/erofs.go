package preflight

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

// The image's EROFS files
//
// runsc hands an EROFS mount's file to the Sentry, which serves the files in
// it to the agent; nothing else checks what is in it. So every EROFS mount in
// config.json must be a grant in the manifest that records the file's digest,
// and the file must still have that digest: root-owned, in a root-owned
// directory, writable by nobody else (runsc opens it again by path), and its
// sha256 equal to the grant's. Hashing the ~600 MB an image's /usr and /opt
// take costs about a second, so digests are cached by file identity as the
// runsc binary's are (digestcache.go), one cache file per image file in
// cacheDir.

// checkErofs verifies the bundle's EROFS mounts and returns what it checked.
func checkErofs(bundleDir, cacheDir string) (string, error) {
	plan, err := launchplan.Load(bundleDir)
	return checkErofsPlan(plan, err, cacheDir)
}

// checkErofsPlan is checkErofs on the plan as read.
func checkErofsPlan(plan *launchplan.Plan, readErr error, cacheDir string) (string, error) {
	if readErr != nil {
		return "", because(ErrNotChecked, "not checked: the bundle could not be read: %w", readErr)
	}
	if plan.Spec == nil {
		return "", because(ErrNotChecked, "not checked: %s is not a valid OCI runtime config", bundle.ConfigFile)
	}
	if plan.Manifest == nil {
		return "", because(ErrNotChecked, "not checked: %s does not decode", bundle.ManifestFile)
	}
	m := plan.Manifest
	var checked []string
	var problems []error
	for _, mnt := range plan.Spec.Mounts {
		if mnt.Type != "erofs" {
			continue
		}
		want := ""
		for _, g := range m.Grants {
			if g, ok := g.(grant.Mount); ok && g.Type == "erofs" && g.Destination == mnt.Destination && g.Source == mnt.Source {
				want = g.Digest
			}
		}
		if want == "" {
			problems = append(problems, because(ErrNoDigestGrant, "EROFS mount %s of %s has no grant with a digest in the manifest", mnt.Destination, mnt.Source))
			continue
		}
		if err := verifyErofsFile(mnt.Source, want, cacheDir); err != nil {
			problems = append(problems, err)
			continue
		}
		checked = append(checked, mnt.Destination+" "+want)
	}
	if len(problems) > 0 {
		return "", joined(problems)
	}
	if len(checked) == 0 {
		return "no EROFS mounts", nil
	}
	return "EROFS files match their digests: " + strings.Join(checked, ", "), nil
}

// verifyErofsFile checks one file against want ("sha256:<hex>").
func verifyErofsFile(path, want, cacheDir string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("EROFS file %s is not an absolute path", path)
	}
	var dst syscall.Stat_t
	if err := syscall.Stat(filepath.Dir(path), &dst); err != nil || dst.Uid != 0 || dst.Mode&0o022 != 0 {
		return because(ErrWritable, "EROFS file %s: its directory must exist, be owned by root and be writable by no one else", path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("EROFS file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("EROFS file: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
		return because(ErrWritable, "EROFS file %s must be a regular file owned by root and writable by no one else (mode %s)", path, fi.Mode())
	}
	id, _ := identityOf(fi)
	cache := ""
	if cacheDir != "" {
		key := sha256.Sum256([]byte(path))
		cache = filepath.Join(cacheDir, hex.EncodeToString(key[:16])+".json")
	}
	sum, hit := lookupDigest(cache, path, id)
	if !hit {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return fmt.Errorf("reading EROFS file %s: %w", path, err)
		}
		sum = hex.EncodeToString(h.Sum(nil))
		storeDigest(cache, path, id, sum)
	}
	if "sha256:"+sum != want {
		return because(ErrDigestDiffers, "EROFS file %s has sha256:%s but the bundle was compiled for %s; rebuild the image or recompile", path, sum, want)
	}
	return nil
}
