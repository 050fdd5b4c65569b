package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/grant"
)

// SlotKind names the place the compiler puts a secret placeholder.
// Nothing else in a bundle is ever substituted: a placeholder smuggled
// into another fact (a model id, an argv word) stays a refusal, not a
// secret in argv. The daemon's MCP bearer has no slot: it never enters
// the sandbox, the route proxy adds it (runtime/launcher/routeproxy Token).
type SlotKind string

const (
	// SlotCredentialEnv is config.json's process.env entry
	// "<Env>=<placeholder>", from the env grant of credential.secretRef.
	SlotCredentialEnv SlotKind = "credential-env"
)

// credentialFact is the fact the compiler's credential env grant cites.
const credentialFact = "credential.secretRef"

// SecretSlot is one placeholder the compiler wrote, read from the
// manifest's grants.
type SecretSlot struct {
	Kind SlotKind
	Ref  string
	// Env is the variable of a SlotCredentialEnv.
	Env string
	// grant is the manifest index of the credential's env grant, the one
	// other place its placeholder may appear.
	grant int
}

// Placeholder is the slot's placeholder text.
func (s SecretSlot) Placeholder() string { return SecretPlaceholder(s.Ref) }

// SecretSlots lists the bundle's secret slots from its manifest: at most
// one credential env.
func SecretSlots(files Files) ([]SecretSlot, error) {
	m, err := files.Manifest()
	if err != nil {
		return nil, err
	}
	return slotsOf(files, m)
}

func slotsOf(files Files, m *Manifest) ([]SecretSlot, error) {
	var slots []SecretSlot
	for i, g := range m.Grants {
		switch g := g.(type) {
		case grant.Env:
			if g.Fact != credentialFact || g.Value == ModelRoutePlaceholder {
				// The model route's stand-in is no slot: the key it
				// stands for never enters the bundle or the sandbox.
				continue
			}
			ref, ok := PlaceholderRef(g.Value)
			if !ok {
				return nil, fmt.Errorf("manifest: the credential's env grant %s is not one secret placeholder", g.Name)
			}
			slots = append(slots, SecretSlot{Kind: SlotCredentialEnv, Ref: ref, Env: g.Name, grant: i})
		}
	}
	seen := map[SlotKind]bool{}
	for _, s := range slots {
		if seen[s.Kind] {
			return nil, fmt.Errorf("manifest: more than one %s secret slot", s.Kind)
		}
		seen[s.Kind] = true
		if code, _ := pathform.Check("/" + s.Ref); code != "" || s.Ref == "" || strings.Contains(s.Ref, "@") {
			return nil, fmt.Errorf("manifest: %s secret reference %q is not a clean relative name", s.Kind, s.Ref)
		}
	}
	return slots, nil
}

// ErrStrayPlaceholder means a secret placeholder sits where the compiler
// puts none; the launch is refused before any secret is read.
var ErrStrayPlaceholder = errors.New("a secret placeholder where the compiler puts none")

// refuseStrayMarkers fails when the placeholder marker appears anywhere
// in the bundle but the slots (and the manifest grant that records the
// credential's). JSON files are decoded first, so an escaped marker
// (\u0040…) is found too; other files are searched as bytes.
func refuseStrayMarkers(files Files, slots []SecretSlot) error {
	for _, name := range files.Names() {
		data := files[name]
		if !strings.HasSuffix(name, ".json") {
			if bytes.Contains(data, []byte(SecretMarker)) {
				return fmt.Errorf("%s: %w (only the credential's env entry is filled)", name, ErrStrayPlaceholder)
			}
			continue
		}
		// Decoded strings hold the marker only if the bytes do, or if a
		// \u escape could spell it; files with neither need no walk.
		n := bytes.Count(data, []byte(SecretMarker))
		if n == 0 && !bytes.Contains(data, []byte(`\u`)) {
			continue
		}
		// The manifest is large and never reaches the sandbox; slotsOf
		// found the credential's placeholder in its typed grant, so one
		// occurrence, unescaped, is that one.
		if name == ManifestFile && !bytes.Contains(data, []byte(`\u`)) && n == credentialSlots(slots) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var doc any
		if err := dec.Decode(&doc); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		var stray string
		walkStrings(doc, nil, func(path []string, s string, isKey bool) {
			if stray == "" && strings.Contains(s, SecretMarker) && (isKey || !markerAllowed(name, path, s, slots)) {
				stray = strings.Join(path, ".")
			}
		})
		if stray != "" {
			return fmt.Errorf("%s at %s: %w (only the credential's env entry is filled)", name, stray, ErrStrayPlaceholder)
		}
	}
	return nil
}

// markerAllowed reports whether s at path of file is one of the slots.
func markerAllowed(file string, path []string, s string, slots []SecretSlot) bool {
	for _, sl := range slots {
		switch {
		case sl.Kind == SlotCredentialEnv && file == ConfigFile:
			if len(path) == 3 && path[0] == "process" && path[1] == "env" && isIndex(path[2]) && s == sl.Env+"="+sl.Placeholder() {
				return true
			}
		case sl.Kind == SlotCredentialEnv && file == ManifestFile:
			if slices.Equal(path, []string{"grants", "[" + strconv.Itoa(sl.grant) + "]", "value"}) && s == sl.Placeholder() {
				return true
			}
		}
	}
	return false
}

func isIndex(seg string) bool {
	n, ok := strings.CutPrefix(seg, "[")
	n, ok2 := strings.CutSuffix(n, "]")
	_, err := strconv.Atoi(n)
	return ok && ok2 && err == nil
}

// walkStrings visits every string of a decoded JSON value, map keys
// included, with its path (keys, and "[i]" for array elements; a key is
// one segment even when it contains dots).
func walkStrings(v any, path []string, visit func(path []string, s string, isKey bool)) {
	switch x := v.(type) {
	case string:
		visit(path, x, false)
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			e := x[k]
			p := append(slices.Clip(path), k)
			visit(p, k, true)
			walkStrings(e, p, visit)
		}
	case []any:
		for i, e := range x {
			walkStrings(e, append(slices.Clip(path), "["+strconv.Itoa(i)+"]"), visit)
		}
	}
}

// CheckSecretPlaceholders returns the bundle's secret slots after
// refusing a placeholder marker anywhere else in it: what the launcher
// checks before it reads any secret, and what validate reports.
// It returns the manifest's deployment, whose secrets the slots name.
func CheckSecretPlaceholders(files Files) (deployment string, slots []SecretSlot, err error) {
	m, err := files.Manifest()
	if err != nil {
		return "", nil, err
	}
	return CheckSecretPlaceholdersOf(files, m)
}

// CheckSecretPlaceholdersOf is CheckSecretPlaceholders with manifest.json
// already decoded (m must be files' manifest.json).
func CheckSecretPlaceholdersOf(files Files, m *Manifest) (deployment string, slots []SecretSlot, err error) {
	if slots, err = slotsOf(files, m); err != nil {
		return "", nil, err
	}
	if err := refuseStrayMarkers(files, slots); err != nil {
		return "", nil, err
	}
	return m.Deployment, slots, nil
}

func credentialSlots(slots []SecretSlot) int {
	n := 0
	for _, s := range slots {
		if s.Kind == SlotCredentialEnv {
			n++
		}
	}
	return n
}
