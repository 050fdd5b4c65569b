package launcher

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/policy/bundle"
)

// SecretRefs lists, sorted and once each, the refs the bundle's slots
// name and the provider key of its model route: what a launch asks its
// SecretSource for (with the manifest's deployment).
func SecretRefs(files bundle.Files) ([]string, error) {
	slots, err := bundle.SecretSlots(files)
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, s := range slots {
		refs = append(refs, s.Ref)
	}
	model, err := ModelKeyRef(files)
	if err != nil {
		return nil, err
	}
	if model != "" {
		refs = append(refs, model)
	}
	slices.Sort(refs)
	return slices.Compact(refs), nil
}

// ModelKeyRef is the secret reference of the provider key the bundle's
// model route adds ("" when it has none). The key is handed to the route
// proxy only; it is no slot, so it is in no file and no checkpoint, and a
// key rotated while a sandbox sleeps is simply the one its wake gets.
func ModelKeyRef(files bundle.Files) (string, error) {
	eg, err := files.Egress()
	if err != nil {
		return "", err
	}
	for _, r := range eg.Routes {
		if r.Purpose == "model" {
			return r.TokenRef, nil
		}
	}
	return "", nil
}

// ErrStrayPlaceholder is bundle.ErrStrayPlaceholder: a launch refused for
// a placeholder where the compiler puts none.
var ErrStrayPlaceholder = bundle.ErrStrayPlaceholder

// fillSecrets returns the private copies of config.json with exactly the
// credential slot filled and (when the bundle has one) files/mcp.json,
// checked to carry no bearer, after refusing any placeholder marker
// anywhere else in the bundle. Secrets are
// looked up in the manifest's deployment. Errors name refs, never values.
func fillSecrets(files bundle.Files, secrets SecretSource) (map[string][]byte, error) {
	deployment, slots, err := bundle.CheckSecretPlaceholders(files)
	if err != nil {
		return nil, err
	}
	return fillSlots(files, deployment, slots, secrets)
}

// fillSlots is fillSecrets once the slots are known and the bundle holds
// no marker outside them: a launch plan's validator found both
// (ocicheck.Decoded), so a launch does not scan the bundle a second time.
func fillSlots(files bundle.Files, deployment string, slots []bundle.SecretSlot, secrets SecretSource) (out map[string][]byte, err error) {
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
		v, err := secrets(deployment, s.Ref)
		if err != nil {
			return nil, err
		}
		values[s.Ref] = v
		if !validSecretValue(v) {
			return nil, fmt.Errorf("secret %s contains characters that cannot go in an environment variable or a header", s.Ref)
		}
	}
	out = map[string][]byte{}
	if out[bundle.ConfigFile], err = fillConfig(files[bundle.ConfigFile], slots, values); err != nil {
		return nil, err
	}
	if mcp, ok := files[bundle.MCPConfigFile]; ok {
		if out[bundle.MCPConfigFile], err = checkMCP(mcp); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fillConfig sets the credential's env entry in the typed spec. The entry
// must be there exactly once, as the compiler wrote it.
func fillConfig(cfg []byte, slots []bundle.SecretSlot, values map[string][]byte) ([]byte, error) {
	var spec rspec.Spec
	if err := json.Unmarshal(cfg, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", bundle.ConfigFile, err)
	}
	filled := false
	for _, s := range slots {
		if s.Kind != bundle.SlotCredentialEnv {
			continue
		}
		if spec.Process == nil {
			return nil, fmt.Errorf("%s has no process for the credential's env entry", bundle.ConfigFile)
		}
		want, n := s.Env+"="+s.Placeholder(), 0
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

// checkMCP passes the MCP config on once it is the compiler's layout: one
// server and no headers. The daemon's bearer is added by the route proxy
// outside the sandbox, so a header here would be a credential (or a
// placeholder) in a file the agent reads.
func checkMCP(data []byte) ([]byte, error) {
	var doc bundle.MCPConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", bundle.MCPConfigFile, err)
	}
	srv, ok := doc.Servers[bundle.MCPServerName]
	if !ok || len(doc.Servers) != 1 || len(srv.Headers) != 0 {
		return nil, fmt.Errorf("%s is not the compiler's layout: one server %q and no headers (the route proxy adds the bearer)", bundle.MCPConfigFile, bundle.MCPServerName)
	}
	return data, nil
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

// fetched holds the values of a bundle's secrets, each fetched from the
// source once per launch: the slots are filled from them and the launch
// record keeps their digest.
type fetched struct {
	refs   []string // sorted, each once
	values map[string][]byte
}

func fetchSecrets(deployment string, slots []bundle.SecretSlot, src SecretSource) (*fetched, error) {
	f := &fetched{values: map[string][]byte{}}
	for _, s := range slots {
		if _, ok := f.values[s.Ref]; ok {
			continue
		}
		if src == nil {
			f.clear()
			return nil, fmt.Errorf("bundle needs secret %s and no secret source was given", s.Ref)
		}
		v, err := src(deployment, s.Ref)
		if err != nil {
			f.clear()
			return nil, err
		}
		f.values[s.Ref] = append([]byte(nil), v...)
		f.refs = append(f.refs, s.Ref)
	}
	slices.Sort(f.refs)
	return f, nil
}

// get is a SecretSource serving the fetched values (copies, which the
// slot filling clears after use).
func (f *fetched) get(_, ref string) ([]byte, error) {
	v, ok := f.values[ref]
	if !ok {
		return nil, fmt.Errorf("secret %s was not fetched for this launch", ref)
	}
	return append([]byte(nil), v...), nil
}

// digest is a sha256 over each value's sha256, by ref: equal digests mean
// equal values, and the digest reveals none.
func (f *fetched) digest() string {
	h := sha256.New()
	for _, ref := range f.refs {
		v := sha256.Sum256(f.values[ref])
		fmt.Fprintf(h, "%s=%x\n", ref, v)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (f *fetched) clear() {
	for _, v := range f.values {
		clear(v)
	}
}
