package grant

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/diag"
)

// NetworkMode is the runsc --network flag: sandbox (gVisor's stack in a
// fresh netns, egress filtered by the launcher) or none (loopback only).
type NetworkMode struct {
	Mode string
	Provenance
}

func (NetworkMode) Kind() Kind              { return KindRuntime }
func (NetworkMode) Subject() string         { return "network" }
func (g NetworkMode) Key() string           { return key(g) }
func (NetworkMode) Access() Access          { return Set }
func (NetworkMode) Restricts() bool         { return true }
func (NetworkMode) Apply(*specs.Spec) error { return nil }
func (g NetworkMode) Against(old Grant) Direction {
	if old.(NetworkMode).Mode == "sandbox" && g.Mode == "none" {
		return Narrowed
	}
	return Changed
}
func (g NetworkMode) Validate() error {
	if g.Mode != "sandbox" && g.Mode != "none" {
		return errors.New("network mode must be sandbox or none")
	}
	return nil
}

// DirectFS is the runsc --directfs flag; file access stays behind the
// gofer, so it is always off.
type DirectFS struct {
	On bool
	Provenance
}

func (DirectFS) Kind() Kind              { return KindRuntime }
func (DirectFS) Subject() string         { return "directfs" }
func (g DirectFS) Key() string           { return key(g) }
func (DirectFS) Access() Access          { return Set }
func (DirectFS) Restricts() bool         { return true }
func (DirectFS) Apply(*specs.Spec) error { return nil }
func (g DirectFS) Against(old Grant) Direction {
	return flagDirection(!old.(DirectFS).On, !g.On)
}
func (g DirectFS) Validate() error {
	if g.On {
		return errors.New("directfs is never granted")
	}
	return nil
}

// Egress is one allowed destination; everything else is denied.
type Egress struct {
	Host    string // host name or IP
	Proto   string // tcp | udp
	Port    int
	Purpose string // model, oauth-refresh, dns, …
	Provenance
}

func (Egress) Kind() Kind              { return KindEgress }
func (g Egress) Subject() string       { return g.Host }
func (Egress) Access() Access          { return Allow }
func (Egress) Restricts() bool         { return false }
func (Egress) Apply(*specs.Spec) error { return nil }
func (Egress) Against(Grant) Direction { return Changed }
func (g Egress) Key() string {
	return string(KindEgress) + " " + g.Proto + " " + g.Host + " " + strconv.Itoa(g.Port)
}
func (g Egress) Validate() error {
	switch {
	case g.Host == "" || strings.ContainsAny(g.Host, " /\x00"):
		return errors.New("egress host must be a bare host name or address")
	case g.Proto != "tcp" && g.Proto != "udp":
		return errors.New("egress proto must be tcp or udp")
	case g.Port < 1 || g.Port > 65535:
		return errors.New("egress port must be 1-65535")
	case g.Purpose == "":
		return errors.New("egress needs a purpose")
	}
	return nil
}

// Route is a private path the launcher proxies from the sandbox's gateway
// to an endpoint the sandbox cannot reach. Purpose mcp: the daemon's MCP
// listener, for exactly the methods and tools named (the MCP scope), with
// the daemon's bearer added. Purpose model: the model provider at
// Upstream (https), for exactly the Requests named (the provider API's
// methods and paths), with the provider key added in the API's
// Credential header; Path is the prefix those paths lie under.
type Route struct {
	Purpose       RoutePurpose
	Proto         string
	Port          int
	Method, Path  string // mcp: the one HTTP request forwarded; model: "" and the path prefix
	Upstream      string // the URL the proxy forwards to
	CallerAgentID string
	TokenRef      string // the secret reference of the bearer or key the proxy adds
	Methods       []string
	Tools         []string
	// model only: the provider API (openai-completions, ...), the header
	// the key goes in (ModelCredentials), and "METHOD /path" per request
	// the route forwards, the path below Path. Model is the one model a
	// request body may name (the facts' model.id); Headers the feature
	// headers the route passes on, one "name: value" per value it admits
	// (anthropic-beta lists each feature alone).
	API        string
	Credential string
	Requests   []string
	Model      string
	Headers    []string
	// HostedTools: the provider-side tools the registry grants
	// (ModelHostedTools); model only.
	HostedTools []string
	// The subscription login (credential mode oauth-broker), model only:
	// instead of a key under TokenRef the route adds the access token of
	// entry LoginEntry of the deployment's auth.json (LoginFile, a host
	// path the sandbox never sees), refreshing it at LoginRefresh, the
	// provider's token endpoint, on the host. Credential is then
	// ModelLoginCredential.
	LoginFile, LoginEntry, LoginRefresh string
	Provenance
}

// RoutePurpose is what a route is for: RouteMCP or RouteModel, the only
// values there are. Everything downstream (the egress document, the
// launcher's proxies, the supervisor, the Kubernetes rendering) branches
// on these constants, and a decoder refuses any other value.
type RoutePurpose string

const (
	RouteMCP   RoutePurpose = "mcp"   // the daemon's MCP listener
	RouteModel RoutePurpose = "model" // the model provider
)

// Known reports whether p is one of the route purposes.
func (p RoutePurpose) Known() bool { return p == RouteMCP || p == RouteModel }

// ErrRoutePurpose is a route of a purpose this build does not know
// (PP-GRANT-UNKNOWN-KIND: no route type decodes it).
var ErrRoutePurpose = errors.New(string(diag.GrantUnknownKind) + ": a route purpose this build does not know")

// UnmarshalJSON decodes a purpose strictly: a string, one of the known
// purposes.
func (p *RoutePurpose) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if !RoutePurpose(s).Known() {
		return fmt.Errorf("%w: %q", ErrRoutePurpose, s)
	}
	*p = RoutePurpose(s)
	return nil
}

// ModelHostedTools are the provider-side tools a registry may grant a
// deployment's model route by name (registry deployments.<id>.model.
// hostedTools), each with what granting it lets the provider do with the
// deployment's key. Connectors (an MCP server the provider would call
// with a URL and authorization the request names) are not among them:
// the body comes from the sandbox, so the route could not hold the URL
// and token to what the registry names; they are refused always.
var ModelHostedTools = map[string]string{
	"web_search": "the provider searches the web with queries the model writes (OpenAI Responses tool web_search, Anthropic tool web_search_<version>, chat completions' web_search_options): what the agent read can leave in a query, to the provider's search only",
}

// ModelCredentials are the credential headers a model route may add, by
// provider API: what Pi's provider clients send the key in.
var ModelCredentials = map[string]string{
	"openai-completions": "authorization-bearer",
	"openai-responses":   "authorization-bearer",
	"anthropic-messages": "x-api-key",
	// @google/genai (Pi's google-generative-ai client) sends the key in
	// x-goog-api-key, never as a ?key= query.
	"google-generative-ai": "x-goog-api-key",
	// The openai SDK's AzureOpenAI client (Pi's azure-openai-responses)
	// sends the key in api-key.
	"azure-openai-responses": "api-key",
	// Pi's own Mistral client sends the key as a bearer.
	"mistral-conversations": "authorization-bearer",
	// Pi's own message protocol (pi-messages, the Radius gateway's) sends
	// the key as a bearer.
	"pi-messages": "authorization-bearer",
}

// ModelLoginCredential is a login route's credential: the login's access
// token as a bearer, as Pi sends an OAuth token.
const ModelLoginCredential = "oauth-bearer"

// ModelLoginAPIs are the provider APIs whose subscription login the model
// route brokers (credential mode oauth-broker), each with what the route
// does for it.
var ModelLoginAPIs = map[string]string{
	"anthropic-messages":     "Anthropic's subscription (Claude Pro/Max): the access token as a bearer, refreshed with Pi's refresh request",
	"openai-codex-responses": "OpenAI's ChatGPT subscription (Codex): the access token as a bearer and its ChatGPT account id, refreshed with Pi's form-encoded refresh request; Pi's WebSocket refused (Pi falls back to HTTP), its zstd body decompressed within the body limit and forwarded uncompressed",
}

// Login reports whether the model route brokers a subscription login.
func (g Route) Login() bool { return g.LoginFile != "" }

func (Route) Kind() Kind              { return KindRoute }
func (g Route) Subject() string       { return string(g.Purpose) }
func (g Route) Key() string           { return key(g) }
func (Route) Access() Access          { return Allow }
func (Route) Restricts() bool         { return false }
func (Route) Apply(*specs.Spec) error { return nil }

// Against classifies a route whose only change is its scope: fewer
// methods or tools narrow it; any new one (a swap included) widens it.
func (g Route) Against(old Grant) Direction {
	o := old.(Route)
	a, b := o, g
	a.Methods, a.Tools, b.Methods, b.Tools = nil, nil, nil, nil
	a.Requests, b.Requests = nil, nil
	a.Headers, b.Headers = nil, nil
	a.HostedTools, b.HostedTools = nil, nil
	if !sameAuthority(a, b) {
		return Changed
	}
	added := func(olds, news []string) bool {
		return slices.ContainsFunc(news, func(s string) bool { return !slices.Contains(olds, s) })
	}
	if added(o.Methods, g.Methods) || added(o.Tools, g.Tools) || added(o.Requests, g.Requests) || added(o.Headers, g.Headers) || added(o.HostedTools, g.HostedTools) {
		return Widened
	}
	return Narrowed
}
func (g Route) Validate() error {
	switch {
	case !g.Purpose.Known():
		return errors.New("route purpose must be mcp or model")
	case g.Proto != "tcp":
		return errors.New("route proto must be tcp")
	case g.Port < 1 || g.Port > 65535:
		return errors.New("route port must be 1-65535")
	case g.Upstream == "":
		return errors.New("route needs an upstream")
	case g.Purpose == RouteModel:
		return g.validateModel()
	case g.Method == "" || !absolute(g.Path):
		return errors.New("route needs a method and an absolute path")
	case g.API != "" || g.Credential != "" || len(g.Requests) > 0 || g.Model != "" || len(g.Headers) > 0 || len(g.HostedTools) > 0 || g.LoginFile != "" || g.LoginEntry != "" || g.LoginRefresh != "":
		return errors.New("only a model route names a provider API, credential header, requests, model, headers and hosted tools")
	}
	return nil
}

func (g Route) validateModel() error {
	switch {
	case !strings.HasPrefix(g.Upstream, "https://"):
		return errors.New("a model route forwards over TLS only: its upstream must be https")
	case g.Method != "" || (g.Path != "" && !absolute(g.Path)) || strings.HasSuffix(g.Path, "/"):
		return errors.New("a model route has no single method, and its path is an absolute prefix without a trailing slash")
	case g.Login() && (ModelLoginAPIs[g.API] == "" || g.Credential != ModelLoginCredential || g.TokenRef != "" || g.LoginEntry == "" || !absolute(g.LoginFile) || !strings.HasPrefix(g.LoginRefresh, "https://")):
		return errors.New("a login model route names an API whose login it brokers, the login's auth.json and entry, and an https token endpoint, and no key")
	case !g.Login() && (g.LoginEntry != "" || g.LoginRefresh != ""):
		return errors.New("only a login model route names a login entry or token endpoint")
	case !g.Login() && (ModelCredentials[g.API] == "" || ModelCredentials[g.API] != g.Credential):
		return errors.New("a model route names a provider API it knows the credential header of")
	case !g.Login() && g.TokenRef == "":
		return errors.New("a model route names the secret of the key it adds")
	case len(g.Requests) == 0 || g.CallerAgentID != "" || len(g.Methods) > 0 || len(g.Tools) > 0:
		return errors.New("a model route forwards the requests it names, and nothing of the MCP scope")
	case g.Model == "" || strings.ContainsAny(g.Model, "\x00\n\r"):
		return errors.New("a model route names the one model its requests may ask for")
	}
	for i, h := range g.HostedTools {
		if ModelHostedTools[h] == "" || slices.Contains(g.HostedTools[:i], h) {
			return errors.New("a model route's hosted tools are names of ModelHostedTools, each once")
		}
	}
	for _, h := range g.Headers {
		if !ValidModelHeader(h) {
			return errors.New("a model route's header is \"name: value\", the name lower-case, one value without commas or spaces")
		}
	}
	for _, r := range g.Requests {
		if _, _, _, ok := ModelRequest(r); !ok {
			return errors.New("a model route's request is \"GET|POST /path\", with at most one fixed name=value query")
		}
		if _, p, _, _ := ModelRequest(r); strings.Contains(p, ModelInPath) && !PathSafeModel(g.Model) {
			return errors.New("a model route whose request names the model in its path serves a model id that is one plain path segment")
		}
	}
	return nil
}

// ModelInPath stands for the route's model in a request's path: an API
// that names the model in the URL, not the body (Google's
// /models/{model}:streamGenerateContent), lists it so, and the route
// matches the path with the route's model there and no other.
const ModelInPath = "{model}"

// modelPathSegment is one path segment that may hold ModelInPath: the
// placeholder alone, or followed by a method (":streamGenerateContent").
func modelPathSegment(seg string) bool {
	rest, ok := strings.CutPrefix(seg, ModelInPath)
	if !ok {
		return !strings.ContainsAny(seg, "{}:")
	}
	if rest == "" {
		return true
	}
	m, ok := strings.CutPrefix(rest, ":")
	return ok && m != "" && strings.Trim(m, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") == ""
}

// PathSafeModel reports whether a model id can stand in a path segment as
// it is: letters, digits and . _ - only, not . or .. (Google's ids).
func PathSafeModel(m string) bool {
	if m == "" || m == "." || m == ".." {
		return false
	}
	for _, c := range m {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ModelPath is a request path with the route's model put in for
// ModelInPath.
func ModelPath(path, model string) string { return strings.ReplaceAll(path, ModelInPath, model) }

// ModelRequest splits one of a model route's requests, "GET|POST /path"
// or "GET|POST /path?name=value": a provider client that always sends one
// fixed query (the Anthropic SDK's beta messages, ?beta=true) names it, and
// the route forwards that query only, spelled as listed.
func ModelRequest(r string) (method, path, query string, ok bool) {
	method, rest, ok := strings.Cut(r, " ")
	path, query, hasQuery := strings.Cut(rest, "?")
	switch {
	case !ok || (method != "GET" && method != "POST") || !absolute(path) || strings.ContainsAny(path, "?#% "):
		return "", "", "", false
	case !allSegments(path, modelPathSegment):
		return "", "", "", false
	case hasQuery && !fixedQuery(query):
		return "", "", "", false
	}
	return method, path, query, true
}

func allSegments(path string, ok func(string) bool) bool {
	for seg := range strings.SplitSeq(path, "/") {
		if !ok(seg) {
			return false
		}
	}
	return true
}

// fixedQuery reports whether q is one name=value pair of lower-case
// letters, digits and _ . - (nothing to escape, nothing repeated).
func fixedQuery(q string) bool {
	name, v, ok := strings.Cut(q, "=")
	if !ok || name == "" || v == "" {
		return false
	}
	for _, c := range name + v {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// ValidModelHeader reports whether h is one "name: value" entry of a
// model route's Headers: a lower-case header name and one value, no
// commas (a list header is listed value by value), spaces or controls.
func ValidModelHeader(h string) bool {
	name, v, ok := strings.Cut(h, ": ")
	if !ok || name == "" || v == "" {
		return false
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	for _, c := range v {
		if c <= ' ' || c == ',' || c == 0x7f {
			return false
		}
	}
	return true
}
