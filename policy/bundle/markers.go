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

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/grant"
)

// credentialFact is the fact a legacy secret slot's env grant cites.
const credentialFact = "credential.secretRef"

// ErrStrayPlaceholder means a secret placeholder sits somewhere in the
// bundle; the launch is refused before any secret is read.
var ErrStrayPlaceholder = errors.New("a secret placeholder in the bundle: the compiler writes none and the launcher fills none")

// ErrSecretSlot means the bundle carries a secret slot: the credential's
// env entry as a placeholder, which compilers before the model route
// wrote for the launcher to fill with the provider key. No launcher fills
// one now (the key stays with the route proxy), so such a bundle is
// refused rather than started with a placeholder for a key; compiling
// its facts again gives a bundle with the model route.
var ErrSecretSlot = errors.New("a secret slot (the credential's env entry as a placeholder): the launcher fills no slot since the model route; compile the facts again")

// MarkerError is a secret placeholder marker found in a bundle: a legacy
// secret slot (Code diag.SecretSlot, Unwrap ErrSecretSlot) or a marker
// anywhere else (diag.SecretMarker, ErrStrayPlaceholder). At says where,
// as a path of JSON keys and "[i]" indexes; empty for a file that is not
// JSON.
type MarkerError struct {
	Code diag.Code
	File string
	At   string
}

func (e *MarkerError) Error() string {
	where := e.File
	if e.At != "" {
		where += " at " + e.At
	}
	return fmt.Sprintf("%s %s: %v", e.Code, where, e.Unwrap())
}

// Is matches the marker's code (errors.Is(err, diag.SecretMarker)).
func (e *MarkerError) Is(target error) bool { c, ok := target.(diag.Code); return ok && c == e.Code }

func (e *MarkerError) Unwrap() error {
	if e.Code == diag.SecretSlot {
		return ErrSecretSlot
	}
	return ErrStrayPlaceholder
}

// CheckNoSecretMarkers refuses a bundle that holds the placeholder marker
// anywhere: what the launcher checks before it reads any secret, and
// what validate reports. m must be files' manifest.json, decoded. A
// legacy slot is named as one (the manifest's credential env grant holds
// a placeholder), so its refusal says to compile again. JSON files are
// decoded first, so an escaped marker (\u0040…) is found too; other
// files are searched as bytes.
func CheckNoSecretMarkers(files Files, m *Manifest) error {
	for i, g := range m.Grants {
		if g, ok := g.(grant.Env); ok && g.Fact == credentialFact && strings.Contains(g.Value, SecretMarker) {
			return &MarkerError{Code: diag.SecretSlot, File: ManifestFile, At: "grants.[" + strconv.Itoa(i) + "].value"}
		}
	}
	for _, name := range files.Names() {
		data := files[name]
		if !strings.HasSuffix(name, ".json") {
			if bytes.Contains(data, []byte(SecretMarker)) {
				return &MarkerError{Code: diag.SecretMarker, File: name}
			}
			continue
		}
		// Decoded strings hold the marker only if the bytes do, or if a
		// \u escape could spell it; files with neither need no walk.
		if !bytes.Contains(data, []byte(SecretMarker)) && !bytes.Contains(data, []byte(`\u`)) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var doc any
		if err := dec.Decode(&doc); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		found, at := false, ""
		walkStrings(doc, nil, func(path []string, s string) {
			if !found && strings.Contains(s, SecretMarker) {
				found, at = true, strings.Join(path, ".")
			}
		})
		if found {
			return &MarkerError{Code: diag.SecretMarker, File: name, At: at}
		}
	}
	return nil
}

// walkStrings visits every string of a decoded JSON value, map keys
// included, with its path (keys, and "[i]" for array elements; a key is
// one segment even when it contains dots).
func walkStrings(v any, path []string, visit func(path []string, s string)) {
	switch x := v.(type) {
	case string:
		visit(path, x)
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			p := append(slices.Clip(path), k)
			visit(p, k)
			walkStrings(x[k], p, visit)
		}
	case []any:
		for i, e := range x {
			walkStrings(e, append(slices.Clip(path), "["+strconv.Itoa(i)+"]"), visit)
		}
	}
}
