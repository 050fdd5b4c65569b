// Package statedir is the layout of the launcher's state root: what lives
// where under it, every name made from a sandbox's id (records, run dirs,
// the runsc root, the network state, checkpoint dirs), and the one lookup
// of a record by id. The launcher writes it; the inventory reads it and
// removes what no live launcher owns.
//
//	<root>/records/<id>.json   the launch record (records.go)
//	<root>/run/<id>/           the run dir: the private copy of the bundle
//	<root>/runsc/              runsc's own state, shared by every sandbox
//	<root>/net/                the sandbox networks' state (sandboxnet)
//	<root>/hibernate/<id>/     a checkpoint: image/, image.json, owner.json (checkpoint.go)
//	<root>/locks/              the auth.json locks
package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// ErrInvalidID refuses an id that cannot name a file under the state root.
var ErrInvalidID = errors.New("invalid container id")

// ValidID checks that id can name the files of one sandbox: not empty, no
// slash or NUL, not "." or "..".
func ValidID(id string) error {
	if strings.ContainsAny(id, "/\x00") || id == "" || id == "." || id == ".." {
		return ErrInvalidID
	}
	return nil
}

// RunscRoot is runsc's --root: every sandbox of the state root shares it.
func RunscRoot(root string) string { return filepath.Join(root, "runsc") }

// NetDir is the sandbox networks' state (sandboxnet.Config.StateDir).
func NetDir(root string) string { return filepath.Join(root, "net") }

// RunDirs is the parent of every run dir.
func RunDirs(root string) string { return filepath.Join(root, "run") }

// RunDir is the run dir of sandbox id.
func RunDir(root, id string) string { return filepath.Join(RunDirs(root), id) }

// HibernateDirs is the parent of every checkpoint dir.
func HibernateDirs(root string) string { return filepath.Join(root, "hibernate") }

// HibernateDir is where container id's checkpoint lives: root's, 0700,
// under the state root and never in the bundle or the run dir, which the
// sandbox's gofer serves from.
func HibernateDir(root, id string) string { return filepath.Join(HibernateDirs(root), id) }

// ImageDir is the runsc image of id's checkpoint.
func ImageDir(root, id string) string { return filepath.Join(HibernateDir(root, id), "image") }

// CgroupParent is the cgroup directory every sandbox's cgroup lives in,
// in every hierarchy: shared by every state root on the host, so it is
// never scanned for ids.
const CgroupParent = "paseo-sandbox"

// CgroupsPath is the cgroup of container id. runsc applies the spec's
// resources only when a cgroups path is set, so every launch sets one.
func CgroupsPath(id string) string { return "/" + CgroupParent + "/" + id }

// Names lists the entries of dir (one of the parents above), none when it
// cannot be read.
func Names(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
