package launcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/grant"
	"paseo.dev/paseo-policy/internal/pathform"
)

// SlotKind names one of the two places the compiler puts a secret
// placeholder. Nothing else in a bundle is ever substituted: a
// placeholder smuggled into another fact (a model id, an argv word) stays
// a refusal, not a secret in argv.
type SlotKind string

const (
	// SlotCredentialEnv is config.json's process.env entry
	// "<Env>=<placeholder>", from the env grant of credential.secretRef.
	SlotCredentialEnv SlotKind = "credential-env"
	// SlotMCPBearer is files/mcp.json's
	// mcpServers.paseo.headers.Authorization, "Bearer <placeholder>", from
	// the mcp route grant's tokenRef.
	SlotMCPBearer SlotKind = "mcp-bearer"
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

func (s SecretSlot) placeholder() string { return bundle.SecretPlaceholder(s.Ref) }

// SecretSlots lists the bundle's secret slots from its manifest: at most
// one credential env and one MCP bearer.
func SecretSlots(files bundle.Files) ([]SecretSlot, error) {
	m, err := files.Manifest()
	if err != nil {
		return nil, err
	}
	var slots []SecretSlot
	for i, g := range m.Grants {
		switch {
		case g.Kind == grant.Env && g.Fact == credentialFact:
			ref, ok := bundle.PlaceholderRef(g.Value)
			if !ok || g.Access != grant.Set {
				return nil, fmt.Errorf("manifest: the credential's env grant %s is not one secret placeholder", g.Subject)
			}
			slots = append(slots, SecretSlot{Kind: SlotCredentialEnv, Ref: ref, Env: g.Subject, grant: i})
		case g.Kind == grant.Route && g.Subject == "mcp":
			if _, ok := files[bundle.MCPConfigFile]; !ok {
				continue // no generated MCP config: nothing carries the bearer
			}
			ref := ""
			for _, o := range g.Options {
				if v, ok := strings.CutPrefix(o, "tokenRef="); ok {
					ref = v
				}
			}
			slots = append(slots, SecretSlot{Kind: SlotMCPBearer, Ref: ref})
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

// SecretRefs lists, sorted and once each, the refs the bundle's slots
// name: what a launch asks its SecretSource for (with the manifest's
// deployment).
func SecretRefs(files bundle.Files) ([]string, error) {
	slots, err := SecretSlots(files)
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, s := range slots {
		refs = append(refs, s.Ref)
	}
	slices.Sort(refs)
	return slices.Compact(refs), nil
}

// fillSecrets returns the private copies of config.json and (when the
// bundle has one) files/mcp.json with exactly the slots filled, after
// refusing any placeholder marker anywhere else in the bundle. Secrets are
// looked up in the manifest's deployment. Errors name refs, never values.
func fillSecrets(files bundle.Files, secrets SecretSource) (map[string][]byte, error) {
	m, err := files.Manifest()
	if err != nil {
		return nil, err
	}
	slots, err := SecretSlots(files)
	if err != nil {
		return nil, err
	}
	if err := refuseStrayMarkers(files, slots); err != nil {
		return nil, err
	}
	values := map[string][]byte{}
	defer func() {
		for _, v := range values {
			clear(v)
		}
	}()
	for _, s := range slots {
		if _, ok := values[s.Ref]; ok {
			continue
		}
		if secrets == nil {
			return nil, fmt.Errorf("bundle needs secret %s and no secret source was given", s.Ref)
		}
		v, err := secrets(m.Deployment, s.Ref)
		if err != nil {
			return nil, err
		}
		values[s.Ref] = v
		if !validSecretValue(v) {
			return nil, fmt.Errorf("secret %s contains characters that cannot go in an environment variable or a header", s.Ref)
		}
	}
	out := map[string][]byte{}
	if out[bundle.ConfigFile], err = fillConfig(files[bundle.ConfigFile], slots, values); err != nil {
		return nil, err
	}
	if mcp, ok := files[bundle.MCPConfigFile]; ok {
		if out[bundle.MCPConfigFile], err = fillMCP(mcp, slots, values); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fillConfig sets the credential's env entry in the typed spec. The entry
// must be there exactly once, as the compiler wrote it.
func fillConfig(cfg []byte, slots []SecretSlot, values map[string][]byte) ([]byte, error) {
	var spec rspec.Spec
	if err := json.Unmarshal(cfg, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", bundle.ConfigFile, err)
	}
	filled := false
	for _, s := range slots {
		if s.Kind != SlotCredentialEnv {
			continue
		}
		if spec.Process == nil {
			return nil, fmt.Errorf("%s has no process for the credential's env entry", bundle.ConfigFile)
		}
		want, n := s.Env+"="+s.placeholder(), 0
		for i, e := range spec.Process.Env {
			if e == want {
				spec.Process.Env[i] = s.Env + "=" + string(values[s.Ref])
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("%s carries the credential's env entry %s %d times, not once", bundle.ConfigFile, s.Env, n)
		}
		filled = true
	}
	if !filled {
		return cfg, nil
	}
	return bundle.Marshal(&spec)
}

// fillMCP sets the bearer of the one server the compiler writes.
func fillMCP(data []byte, slots []SecretSlot, values map[string][]byte) ([]byte, error) {
	i := slices.IndexFunc(slots, func(s SecretSlot) bool { return s.Kind == SlotMCPBearer })
	if i < 0 {
		return data, nil // refuseStrayMarkers saw no placeholder in it
	}
	s := slots[i]
	var doc bundle.MCPConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", bundle.MCPConfigFile, err)
	}
	srv, ok := doc.Servers[bundle.MCPServerName]
	if !ok || len(doc.Servers) != 1 || srv.Headers[bundle.MCPBearerHeader] != bundle.MCPBearerPrefix+s.placeholder() {
		return nil, fmt.Errorf("%s is not the compiler's layout: one server %q with the bearer placeholder of %s", bundle.MCPConfigFile, bundle.MCPServerName, s.Ref)
	}
	srv.Headers[bundle.MCPBearerHeader] = bundle.MCPBearerPrefix + string(values[s.Ref])
	doc.Servers[bundle.MCPServerName] = srv
	return bundle.Marshal(&doc)
}

// ErrStrayPlaceholder means a secret placeholder sits where the compiler
// puts none; the launch is refused before any secret is read.
var ErrStrayPlaceholder = errors.New("a secret placeholder where the compiler puts none")

// refuseStrayMarkers fails when the placeholder marker appears anywhere
// in the bundle but the slots (and the manifest grant that records the
// credential's). JSON files are decoded first, so an escaped marker
// (\u0040…) is found too; other files are searched as bytes.
func refuseStrayMarkers(files bundle.Files, slots []SecretSlot) error {
	for _, name := range files.Names() {
		data := files[name]
		if !strings.HasSuffix(name, ".json") {
			if bytes.Contains(data, []byte(bundle.SecretMarker)) {
				return fmt.Errorf("%s: %w (only the credential's env entry and the MCP bearer are filled)", name, ErrStrayPlaceholder)
			}
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
			if stray == "" && strings.Contains(s, bundle.SecretMarker) && (isKey || !markerAllowed(name, path, s, slots)) {
				stray = strings.Join(path, ".")
			}
		})
		if stray != "" {
			return fmt.Errorf("%s at %s: %w (only the credential's env entry and the MCP bearer are filled)", name, stray, ErrStrayPlaceholder)
		}
	}
	return nil
}

// markerAllowed reports whether s at path of file is one of the slots.
func markerAllowed(file string, path []string, s string, slots []SecretSlot) bool {
	for _, sl := range slots {
		switch {
		case sl.Kind == SlotCredentialEnv && file == bundle.ConfigFile:
			if len(path) == 3 && path[0] == "process" && path[1] == "env" && isIndex(path[2]) && s == sl.Env+"="+sl.placeholder() {
				return true
			}
		case sl.Kind == SlotCredentialEnv && file == bundle.ManifestFile:
			if slices.Equal(path, []string{"grants", "[" + strconv.Itoa(sl.grant) + "]", "value"}) && s == sl.placeholder() {
				return true
			}
		case sl.Kind == SlotMCPBearer && file == bundle.MCPConfigFile:
			if slices.Equal(path, []string{"mcpServers", bundle.MCPServerName, "headers", bundle.MCPBearerHeader}) && s == bundle.MCPBearerPrefix+sl.placeholder() {
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

// validSecretValue: no control characters (a newline would end an env
// entry's meaning for some readers and split an HTTP header), not empty.
func validSecretValue(v []byte) bool {
	for _, c := range v {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return len(v) > 0
}
