package bundle

import "strings"

// SecretMarker opens every secret placeholder. Compilers before the model
// route wrote one in the credential's env entry for the launcher to fill;
// none is written or filled now, and the marker is refused everywhere, at
// compile in the inputs and at launch in the bundle (CheckNoSecretMarkers).
const (
	SecretMarker = "@@paseo-secret:"
	secretEnd    = "@@"
)

// SecretPlaceholder is the placeholder for ref.
func SecretPlaceholder(ref string) string { return SecretMarker + ref + secretEnd }

// PlaceholderRef returns the ref when s is exactly one placeholder.
func PlaceholderRef(s string) (string, bool) {
	ref, ok := strings.CutPrefix(s, SecretMarker)
	if !ok {
		return "", false
	}
	ref, ok = strings.CutSuffix(ref, secretEnd)
	if !ok || ref == "" || strings.Contains(ref, "@") {
		return "", false
	}
	return ref, true
}

// MCPConfig is files/mcp.json, the MCP config Pi's adapter reads: the
// compiler renders it and the launcher checks it, so both share this
// layout. It carries no headers: the route proxy adds the daemon's bearer
// outside the sandbox, so no token is ever in a file the agent can read.
type MCPConfig struct {
	Servers map[string]MCPServer `json:"mcpServers"`
}

// MCPServer is one MCP server entry.
type MCPServer struct {
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Auth    bool              `json:"auth"`
	OAuth   bool              `json:"oauth"`
}

// MCPServerName is the one server the compiler writes.
const MCPServerName = "paseo"
