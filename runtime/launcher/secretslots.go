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
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
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

// fillSlots fills the plan's secret slots: it returns the run copy of the
// spec (runstate.go) with exactly the credential's env entry set and, when
// the bundle has one, files/mcp.json, checked to carry no bearer. The
// plan's validator found the slots and refused any placeholder marker
// anywhere else (ocicheck.Decoded), before any secret is looked up here.
// Secrets are looked up in the manifest's deployment. Errors name refs,
// never values.
func fillSlots(plan *launchplan.Plan, secrets SecretSource) (spec *rspec.Spec, mcp []byte, err error) {
	if plan.SlotsErr != nil {
		return nil, nil, plan.SlotsErr
	}
	values := map[string][]byte{}
	defer func() {
		for _, v := range values {
			clear(v)
		}
	}()
	for _, s := range plan.Slots {
		if _, ok := values[s.Ref]; ok {
			continue
		}
		if secrets == nil {
			return nil, nil, fmt.Errorf("bundle needs secret %s and no secret source was given", s.Ref)
		}
		v, err := secrets(plan.Deployment, s.Ref)
		if err != nil {
			return nil, nil, err
		}
		values[s.Ref] = v
		if !validSecretValue(v) {
			return nil, nil, fmt.Errorf("secret %s contains characters that cannot go in an environment variable or a header", s.Ref)
		}
	}
	if plan.Spec == nil {
		return nil, nil, plan.SpecErr
	}
	if spec, err = runSpec(plan.Spec); err != nil {
		return nil, nil, err
	}
	if err := fillCredential(spec, plan.Slots, values); err != nil {
		return nil, nil, err
	}
	if data, ok := plan.Files[bundle.MCPConfigFile]; ok {
		if mcp, err = checkMCP(data); err != nil {
			return nil, nil, err
		}
	}
	return spec, mcp, nil
}

// fillCredential sets the credential's env entry in the run copy. The
// entry must be there exactly once, as the compiler wrote it.
func fillCredential(spec *rspec.Spec, slots []bundle.SecretSlot, values map[string][]byte) error {
	for _, s := range slots {
		if s.Kind != bundle.SlotCredentialEnv {
			continue
		}
		if spec.Process == nil {
			return fmt.Errorf("%s has no process for the credential's env entry", bundle.ConfigFile)
		}
		want, n := s.Env+"="+s.Placeholder(), 0
		for i, e := range spec.Process.Env {
			if e == want {
				spec.Process.Env[i] = s.Env + "=" + string(values[s.Ref])
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%s carries the credential's env entry %s %d times, not once", bundle.ConfigFile, s.Env, n)
		}
	}
	return nil
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
