package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// pins.json and the manifest
//
// Pins describe host state (device and inode numbers), so they stay out of
// manifest.json: the manifest, and with it `compile --check` and the golden
// files, is a function of the inputs alone. pins.json instead names the
// manifest it was compiled with, by the sha256 of manifest.json's bytes. The
// manifest covers every other file, so a pins.json from another compile (or
// a hand-written one) is refused rather than mixed into this bundle.

// PinsKind is the kind of pins.json.
const PinsKind = "Pins"

// Pins is pins.json.
type Pins struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Manifest is Digest(manifest.json) of the compile that wrote it.
	Manifest string `json:"manifest"`
	// Pins has one entry per bind mount of config.json with a host source,
	// sorted by destination.
	Pins []Pin `json:"pins"`
}

// InternalSources are the bind sources that are bundle files, not host
// paths: relative to the bundle, they are served from the launcher's own
// run dir and never pinned.
var InternalSources = []string{HostsFile, ResolvFile, MCPConfigFile, GitHeadFile, ModelsFile, FSMonitorHookFile, FSMonitorIndexFile, SearchClientFile, SearchSpoolFile}

// Why pins.json is refused with a bundle, for errors.Is.
var (
	ErrPinsForeign  = errors.New("pins from another compile are refused")
	ErrPinsUnpaired = errors.New(ConfigFile + " and " + PinsFile + " disagree")
)

// Pins decodes pins.json strictly and requires it to name this bundle's
// manifest. A bundle without pins.json gives an empty list, which pins no
// bind: PinnedBinds then refuses any bind with a host source.
func (f Files) Pins() (*Pins, error) {
	data, ok := f[PinsFile]
	if !ok {
		return &Pins{APIVersion: APIVersion, Kind: PinsKind}, nil
	}
	var p Pins
	if err := strictDecode(data, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", PinsFile, err)
	}
	if p.Kind != PinsKind || p.APIVersion != APIVersion {
		return nil, fmt.Errorf("%s: kind %q version %q, want %q %q", PinsFile, p.Kind, p.APIVersion, PinsKind, APIVersion)
	}
	if want := Digest(f[ManifestFile]); p.Manifest != want {
		return nil, fmt.Errorf("%s was written for manifest %s, not this bundle's %s; %w", PinsFile, p.Manifest, want, ErrPinsForeign)
	}
	return &p, nil
}

// BindPin is one bind mount of config.json (by index in spec.Mounts) with
// its pin.
type BindPin struct {
	Mount int
	Pin   Pin
}

// IsBind reports whether an OCI mount is a bind mount, however spelled.
func IsBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// PinnedBinds pairs every bind mount of config.json with its pin: a bind
// with a host source must have exactly one pin with the same source and
// destination, a pin must belong to a bind, and a bind's source must be a
// host path or one of the InternalSources. Anything else is refused, all
// problems at once.
func (f Files) PinnedBinds() ([]BindPin, error) {
	var spec specs.Spec
	if err := json.NewDecoder(bytes.NewReader(f[ConfigFile])).Decode(&spec); err != nil {
		return nil, fmt.Errorf("%s: %w", ConfigFile, err)
	}
	pins, err := f.Pins()
	if err != nil {
		return nil, err
	}
	return PairBinds(spec.Mounts, pins.Pins)
}

// PairBinds is PinnedBinds on decoded values.
func PairBinds(mounts []specs.Mount, pins []Pin) ([]BindPin, error) {
	var problems []string
	used := make([]bool, len(pins))
	var out []BindPin
	for i, m := range mounts {
		if !IsBind(m) {
			continue
		}
		if slices.Contains(InternalSources, m.Source) {
			continue
		}
		if !filepath.IsAbs(m.Source) {
			problems = append(problems, fmt.Sprintf("bind %s: source %s is neither a host path nor a bundle file", m.Destination, m.Source))
			continue
		}
		match := -1
		for j, p := range pins {
			if p.Destination != m.Destination || p.Source != m.Source {
				continue
			}
			if match >= 0 || used[j] {
				problems = append(problems, fmt.Sprintf("bind %s: more than one pin", m.Destination))
			}
			match = j
		}
		if match < 0 {
			problems = append(problems, fmt.Sprintf("bind %s: source %s has no pin; an unpinned bind is refused", m.Destination, m.Source))
			continue
		}
		used[match] = true
		if err := pins[match].check(); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		out = append(out, BindPin{Mount: i, Pin: pins[match]})
	}
	for j, p := range pins {
		if !used[j] {
			problems = append(problems, fmt.Sprintf("pin %s (source %s) belongs to no bind in %s", p.Destination, p.Source, ConfigFile))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrPinsUnpaired, strings.Join(problems, "; "))
	}
	return out, nil
}

// check is what a pin must be on its own: an absolute clean source beneath
// an absolute clean root, and a kind a bind can stage.
func (p Pin) check() error {
	where := fmt.Sprintf("pin %s (source %s)", p.Destination, p.Source)
	clean := func(s string) bool { return filepath.IsAbs(s) && filepath.Clean(s) == s }
	switch {
	case !clean(p.Source):
		return fmt.Errorf("%s: source is not an absolute clean path", where)
	case !clean(p.Root):
		return fmt.Errorf("%s: root %q is not an absolute clean path", where, p.Root)
	case p.Root != "/" && p.Source != p.Root && !strings.HasPrefix(p.Source, p.Root+"/"):
		return fmt.Errorf("%s: source does not lie beneath its root %s", where, p.Root)
	case p.Kind != "dir" && p.Kind != "file":
		return fmt.Errorf("%s: kind %q cannot be bound (dir or file)", where, p.Kind)
	}
	return nil
}
