package bundle

import "strings"

// SecretMarker opens every secret placeholder. The compiler writes
// placeholders in exactly two places (the credential's env entry and the
// MCP bearer); anywhere else the marker is refused, at compile in the
// inputs and at launch in the bundle.
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
// compiler renders it and the launcher fills the bearer of its one server
// in its private copy, so both share this layout.
type MCPConfig struct {
	Servers map[string]MCPServer `json:"mcpServers"`
}

// MCPServer is one MCP server entry.
type MCPServer struct {
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Auth    bool              `json:"auth"`
	OAuth   bool              `json:"oauth"`
}

// The one server the compiler writes and the header that carries its
// bearer ("Bearer " + placeholder).
const (
	MCPServerName   = "paseo"
	MCPBearerHeader = "Authorization"
	MCPBearerPrefix = "Bearer "
)
