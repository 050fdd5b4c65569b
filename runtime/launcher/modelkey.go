package launcher

import (
	"bytes"
	"encoding/json"
	"fmt"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// SecretRefs lists the refs a launch of the bundle asks its SecretSource
// for (with the manifest's deployment): the provider key of its model
// route, if it has one. The launcher fills no secret into the sandbox;
// the key is handed to the route proxy only.
func SecretRefs(files bundle.Files) ([]string, error) {
	ref, err := ModelKeyRef(files)
	if err != nil || ref == "" {
		return nil, err
	}
	return []string{ref}, nil
}

// ModelKeyRef is the secret reference of the provider key the bundle's
// model route adds ("" when it has none). The key is handed to the route
// proxy only, so it is in no file and no checkpoint, and a key rotated
// while a sandbox sleeps is simply the one its wake gets.
func ModelKeyRef(files bundle.Files) (string, error) {
	eg, err := files.Egress()
	if err != nil {
		return "", err
	}
	for _, r := range eg.Routes {
		if r.Purpose == grant.RouteModel {
			return r.TokenRef, nil
		}
	}
	return "", nil
}

// ErrStrayPlaceholder is bundle.ErrStrayPlaceholder: a launch refused for
// a secret placeholder in the bundle (PP-SECRET-MARKER).
var ErrStrayPlaceholder = bundle.ErrStrayPlaceholder

// ErrSecretSlot is bundle.ErrSecretSlot: a launch refused for a legacy
// secret slot (PP-SECRET-SLOT), which no launcher fills since the model
// route.
var ErrSecretSlot = bundle.ErrSecretSlot

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
