package statedir

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ImageFile is the description of an image, beside the image directory.
const ImageFile = "image.json"

// OwnerFile names the process that took the checkpoint and alone can wake
// it (the sandbox's holder: it keeps the stdio pipes and the bridge the
// restored sandbox continues). It is written before runsc checkpoints, so
// gc never mistakes a checkpoint under way for an orphan.
const OwnerFile = "owner.json"

// Image is what a checkpoint recorded about itself.
type Image struct {
	ID      string `json:"id"`
	Network string `json:"network"`
	// Link is the sandbox's /30 (network sandbox): gVisor restores the
	// netstack with its addresses and routes, so the wake rebuilds exactly
	// this link.
	Link netip.Prefix `json:"link,omitzero"`
	// Files are the sha256 digests of runsc's image files, by name.
	Files map[string]string `json:"files"`
	// LegacySecretsDigest is read and ignored: images taken while the
	// launcher still filled secret slots recorded the digest of the
	// values, which a wake compared. No launch puts a secret in the
	// sandbox now (the model key stays with the route proxy) and a bundle
	// with a slot is refused (PP-SECRET-SLOT), so there is nothing to
	// compare; the field stays so that such an image still decodes.
	LegacySecretsDigest string `json:"secretsDigest,omitempty"`
	// Ran is how long the sandbox ran, over every launch and wake: the
	// wake gets what is left of wallSeconds, so hibernating does not
	// extend it (time hibernated does not count).
	Ran   time.Duration `json:"ran"`
	Taken time.Time     `json:"taken"`
}

// WriteImage writes img's description into id's checkpoint dir.
func WriteImage(root string, img *Image) error {
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(HibernateDir(root, img.ID), ImageFile), append(data, '\n'), 0o600)
}

// LoadImage checks id's checkpoint dir (CheckRootOnlyDir), reads the image
// description and checks every image file against its recorded digest,
// and that no file was added or removed.
func LoadImage(root, id string) (*Image, error) {
	dir := HibernateDir(root, id)
	if err := CheckRootOnlyDir(dir); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, ImageFile))
	if err != nil {
		return nil, fmt.Errorf("no checkpoint of %s: %w", id, err)
	}
	var img Image
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&img); err != nil {
		return nil, fmt.Errorf("checkpoint description of %s: %w", id, err)
	}
	if img.ID != id {
		return nil, fmt.Errorf("checkpoint description names %s, not %s", img.ID, id)
	}
	got, err := DigestFiles(ImageDir(root, id))
	if err != nil {
		return nil, err
	}
	for _, name := range sortedUnion(got, img.Files) {
		if got[name] != img.Files[name] {
			return nil, fmt.Errorf("checkpoint image file %s does not match the digest recorded at hibernate", name)
		}
	}
	return &img, nil
}

// DigestFiles is the sha256 of every regular file in dir (runsc's image
// is flat); anything else refuses.
func DigestFiles(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("checkpoint image holds %s, which is not a regular file", e.Name())
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out[e.Name()] = hex.EncodeToString(h.Sum(nil))
	}
	return out, nil
}

func sortedUnion(a, b map[string]string) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		out = append(out, k)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Hibernated reports whether container id has a checkpoint.
func Hibernated(root, id string) bool {
	_, err := os.Stat(filepath.Join(HibernateDir(root, id), ImageFile))
	return err == nil
}

// RemoveImage deletes container id's checkpoint.
func RemoveImage(root, id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	return os.RemoveAll(HibernateDir(root, id))
}

// Who owns a checkpoint (gc of orphaned images)
//
// A hibernated sandbox has no launch record: its launch ended at the
// checkpoint. What will wake it is the process that took it, the holder,
// which keeps the sandbox's stdio and bridge; the supervisor knows its
// sandboxes across restarts only through their holders (it adopts a
// holder that answers on its socket and drops a dead one's socket), and a
// new holder cannot take over another's checkpoint. So a checkpoint is
// owned exactly while its owner process lives (pid and start time, as a
// record's launcher). Once the owner is dead, nothing can adopt or wake
// the image, and gc removes it with its address lease. Fail safe: an
// owner that cannot be read (a checkpoint taken before owners were
// recorded, a damaged file), or one in another pid namespace than gc's
// (its pid means nothing here), counts as alive; the supervisor's delete,
// or an operator, removes it.

// Owner is the process that took a checkpoint (OwnerFile).
type Owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	// PidNS is the owner's pid namespace (readlink /proc/self/ns/pid).
	PidNS string `json:"pidNS"`
}

// PidNamespace is this process's pid namespace.
func PidNamespace() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

// WriteOwner names this process the owner of the checkpoint dir dir.
func WriteOwner(dir string) error {
	pid := os.Getpid()
	data, err := json.Marshal(Owner{PID: pid, Start: ProcessStart(pid), PidNS: PidNamespace()})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, OwnerFile), append(data, '\n'), 0o600)
}

// HibernationOwned reports whether a live process may still wake the
// checkpoint of id: its owner lives, or who its owner is cannot be told.
// A hibernate dir gone meanwhile is owned by nobody.
func HibernationOwned(root, id string) bool {
	dir := HibernateDir(root, id)
	data, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Lstat(dir); errors.Is(serr, os.ErrNotExist) {
			return false
		}
		return true // taken before owners were recorded: keep
	}
	var o Owner
	if err != nil || json.Unmarshal(data, &o) != nil || o.PID <= 0 || o.Start == 0 || o.PidNS == "" || o.PidNS != PidNamespace() {
		return true
	}
	return ProcessStart(o.PID) == o.Start
}
