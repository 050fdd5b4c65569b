package grant

import (
	"errors"
	"path"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Rootfs is the image root: a pinned, read-only tree.
type Rootfs struct {
	Path     string // host path of the rootfs
	ReadOnly bool
	Version  string // the image version the registry pins
	Digest   string // sha256:<hex> of the image
	Provenance
}

func (Rootfs) Kind() Kind       { return KindRootfs }
func (Rootfs) Subject() string  { return "/" }
func (g Rootfs) Key() string    { return key(g) }
func (Rootfs) Restricts() bool  { return false }
func (g Rootfs) Access() Access { return roRW(g.ReadOnly) }
func (g Rootfs) Apply(s *specs.Spec) error {
	s.Root = &specs.Root{Path: g.Path, Readonly: g.ReadOnly}
	return nil
}
func (g Rootfs) Against(old Grant) Direction {
	if o, ok := old.(Rootfs); ok && o.Path == g.Path && o.Version == g.Version && o.Digest == g.Digest {
		return readOnlyDirection(o.ReadOnly, g.ReadOnly)
	}
	return Changed
}
func (g Rootfs) Validate() error {
	switch {
	case !absolute(g.Path):
		return errors.New("rootfs path must be absolute")
	case !g.ReadOnly:
		return errors.New("the rootfs is always read-only")
	case !isDigest(g.Digest):
		return errors.New("rootfs digest must be sha256:<64 hex>")
	}
	return nil
}

// Mount is one entry of the spec's mounts: a bind, a tmpfs, an EROFS image
// file or a kernel filesystem. Options are OCI mount options, passed to the
// runtime as they are; the access is read-only exactly when they hold "ro".
type Mount struct {
	Destination string
	Type        string // bind, tmpfs, erofs, proc, …
	Source      string // host path, bundle-relative file, or the filesystem type
	Options     []string
	Digest      string // erofs only: sha256:<hex> of the file, checked at launch
	// AuthFile marks the read-write bind of Pi's auth.json in credential
	// mode oauth-file: the file the launcher locks for the sandbox's life
	// (one sandbox per auth.json). The launcher finds it by this field,
	// never by its path or provenance.
	AuthFile bool
	Provenance
}

func (Mount) Kind() Kind        { return KindMount }
func (g Mount) Subject() string { return g.Destination }
func (g Mount) Key() string     { return key(g) }
func (Mount) Restricts() bool   { return false }
func (g Mount) Access() Access  { return roRW(g.ReadOnly()) }
func (g Mount) ReadOnly() bool  { return slices.Contains(g.Options, "ro") }
func (g Mount) IsBind() bool    { return g.Type == "bind" }
func (g Mount) Apply(s *specs.Spec) error {
	s.Mounts = append(s.Mounts, specs.Mount{Destination: g.Destination, Type: g.Type, Source: g.Source, Options: g.Options})
	return nil
}

// Against: the same source made writable widens, made read-only narrows.
func (g Mount) Against(old Grant) Direction {
	if o, ok := old.(Mount); ok && o.Source == g.Source && o.Type == g.Type {
		return readOnlyDirection(o.ReadOnly(), g.ReadOnly())
	}
	return Changed
}

func (g Mount) Validate() error {
	switch {
	case !absolute(g.Destination):
		return errors.New("mount destination must be absolute")
	case g.Type == "" || g.Source == "":
		return errors.New("mount needs a type and a source")
	case g.Type == "erofs" && !isDigest(g.Digest):
		return errors.New("an EROFS mount needs the sha256 digest of its file")
	case g.Type != "erofs" && g.Digest != "":
		return errors.New("only an EROFS mount carries a digest")
	case g.ReadOnly() && slices.Contains(g.Options, "rw"):
		return errors.New("mount options say both ro and rw")
	case g.AuthFile && (!g.IsBind() || g.ReadOnly() || path.Base(g.Destination) != "auth.json"):
		return errors.New("only a read-write bind of an auth.json is the auth.json bind")
	}
	return nil
}

func roRW(readOnly bool) Access {
	if readOnly {
		return RO
	}
	return RW
}

// readOnlyDirection compares a read-only flag that is the only change.
func readOnlyDirection(oldRO, newRO bool) Direction {
	switch {
	case oldRO && !newRO:
		return Widened
	case !oldRO && newRO:
		return Narrowed
	}
	return Changed
}

func absolute(p string) bool { return strings.HasPrefix(p, "/") }

func isDigest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	return strings.Trim(hex, "0123456789abcdef") == ""
}
