// Package bundle is the compiled output on disk: file names, the egress and
// manifest documents, digests, and reading and writing a bundle directory.
// The launcher depends on this package, never on CUE or the compiler.
package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/grant"
)

// APIVersion of every document paseo-policy writes but the manifest.
const APIVersion = "paseo.dev/policy/v1alpha1"

// ManifestAPIVersion is the manifest's own version. v1alpha2 encodes each
// grant as a tagged union of its kind's typed fields (docs/grants.md);
// v1alpha1 packed them into strings, and is refused.
const (
	ManifestAPIVersion = "paseo.dev/policy/v1alpha2"
	ManifestKind       = "Manifest"
)

// File names inside a bundle directory.
const (
	ConfigFile   = "config.json"
	EgressFile   = "egress.json"
	ManifestFile = "manifest.json"
	PinsFile     = "pins.json"
	HostsFile    = "files/hosts"
	ResolvFile   = "files/resolv.conf"
	// MCPConfigFile is the MCP config Pi reads, generated when the launch
	// has a private MCP route; it holds no bearer (the route proxy adds it).
	MCPConfigFile = "files/mcp.json"
	// GitHeadFile is the HEAD a main worktree's repository shows in the
	// sandbox (GitHostWorktreeHead): the repository is the sandbox's
	// commondir there, so Git takes its HEAD for another worktree's, and
	// the real one would make the agent's own branch "already checked out".
	GitHeadFile = "files/git-HEAD"
	// ModelsFile is the models.json Pi reads when the model route is
	// granted: the selected provider only, its baseUrl the route on the
	// gateway and its apiKey ModelRoutePlaceholder.
	ModelsFile = "files/models.json"
)

// GitHostWorktreeHead is GitHeadFile's content: a ref no branch is, so no
// branch counts as checked out elsewhere.
const GitHostWorktreeHead = "ref: refs/paseo/host-worktree\n"

// Egress is egress.json: deny by default, one rule per allowed destination.
type Egress struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Mode       string       `json:"mode"`    // none | sandbox
	Default    string       `json:"default"` // always deny
	DNS        string       `json:"dns"`     // pinned | resolver
	Rules      []EgressRule `json:"rules"`
	// Gateway is where the sandbox reaches what the launcher serves it
	// (the routes, the workspace monitor); nil when the plan serves
	// nothing there.
	Gateway *Gateway `json:"gateway,omitempty"`
	Routes  []Route  `json:"routes"`
}

// Gateway is the sandbox's gateway as the bundle knows it: the name the
// sandbox reaches it by, the one every generated file that addresses it
// uses (GatewayName: files/models.json, files/mcp.json, the monitor's
// hook). Its address is leased at launch (the veth peer; on Kubernetes
// the gateway Service's), so the launcher pins Name to it in the
// sandbox's /etc/hosts and the Kubernetes rendering names it in the
// Pod's hostAliases; nothing reads the name back from files/hosts.
type Gateway struct {
	Name string `json:"name"`
}

// EgressRule allows one destination. Host is a name or an address; names are
// resolved by the launcher on the trusted side and pinned in /etc/hosts.
type EgressRule struct {
	Proto   string `json:"proto"`
	Host    string `json:"host"`
	Port    int    `json:"port"`
	Purpose string `json:"purpose"`
	Fact    string `json:"fact"`
}

// Route is a private path the launcher proxies from the sandbox's gateway
// address to a daemon endpoint the sandbox cannot reach itself.
type Route struct {
	Purpose       grant.RoutePurpose `json:"purpose"` // decoding refuses one this build does not know
	Listen        string             `json:"listen"`  // "gateway": the peer side of the sandbox veth
	Port          int                `json:"port"`
	Method        string             `json:"method"`
	Path          string             `json:"path"`
	CallerAgentID string             `json:"callerAgentId"`
	Upstream      string             `json:"upstream"`
	// TokenRef names the daemon's bearer in the deployment's secrets, for
	// a launch with no daemon to hand it over (paseo-policy launch). The
	// bearer itself is never in the bundle: the route proxy adds it.
	TokenRef string `json:"tokenRef"`
	// Methods and Tools are the MCP scope: the JSON-RPC methods and the
	// tools (tools/call params.name) the proxy forwards; nothing else
	// reaches the daemon.
	Methods []string `json:"methods"`
	Tools   []string `json:"tools"`
	// The model route (purpose model): the provider API, the header the
	// proxy puts the key (TokenRef) in, and the "METHOD /path" requests it
	// forwards, below Path, to Upstream (https, verified against the
	// provider's name). Empty on the MCP route.
	API        string   `json:"api,omitempty"`
	Credential string   `json:"credential,omitempty"`
	Requests   []string `json:"requests,omitempty"`
	// Model is the one model a request body may name; Headers the
	// feature headers passed on, "name: value" per admitted value.
	Model   string   `json:"model,omitempty"`
	Headers []string `json:"headers,omitempty"`
	// HostedTools are the provider-side tools (grant.ModelHostedTools) the
	// registry grants this deployment's requests; every other one is
	// refused.
	HostedTools []string `json:"hostedTools,omitempty"`
	// The subscription login a login model route brokers (credential mode
	// oauth-broker; grant.Route): the deployment's auth.json on the host,
	// its entry, and the provider's token endpoint. No token is here: the
	// route reads them from the file at each request.
	LoginFile    string `json:"loginFile,omitempty"`
	LoginEntry   string `json:"loginEntry,omitempty"`
	LoginRefresh string `json:"loginRefresh,omitempty"`
	Fact         string `json:"fact"`
}

// ModelRoutePlaceholder is the credential the sandbox holds in place of
// the provider key when the model route is granted: Pi must send some
// key, the route accepts this one only, and drops it for the real one.
// It is public, the same for every sandbox, and worth nothing anywhere
// else.
const ModelRoutePlaceholder = "paseo-model-route"

// ModelLoginPlaceholder is the sandbox's stand-in for a subscription
// login's access token (credential mode oauth-broker): Pi 1.6.0's
// Anthropic client takes a key containing "sk-ant-oat" for an OAuth token
// (pi-ai api/anthropic-messages.js isOAuthToken) and sends it as a bearer
// with the subscription's headers and system prompt. Public, the same in
// every sandbox, and no token anywhere: the route swaps it for the
// login's current access token.
const ModelLoginPlaceholder = "sk-ant-oat-paseo-model-route"

// ModelCodexAccount is the public stand-in ChatGPT account id the Codex
// login placeholder carries: Pi 1.6.0 (pi-ai api/openai-codex-responses.js
// extractAccountId) reads the chatgpt-account-id header it sends from the
// access token's claim "https://api.openai.com/auth"; the route replaces
// it with the real login's.
const ModelCodexAccount = "paseo-model-route"

// ModelCodexLoginPlaceholder is the sandbox's stand-in for an OpenAI
// Codex (ChatGPT subscription) access token: an unsigned JWT (alg none,
// no signature) whose only claim is ModelCodexAccount, shaped so Pi takes
// it for a Codex login. Public, the same in every sandbox, and no
// credential anywhere.
const ModelCodexLoginPlaceholder = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." +
	"eyJodHRwczovL2FwaS5vcGVuYWkuY29tL2F1dGgiOnsiY2hhdGdwdF9hY2NvdW50X2lkIjoicGFzZW8tbW9kZWwtcm91dGUifX0."

// LoginPlaceholder is the placeholder a login route's API takes.
func LoginPlaceholder(api string) string {
	if api == "openai-codex-responses" {
		return ModelCodexLoginPlaceholder
	}
	return ModelLoginPlaceholder
}

// Manifest is manifest.json: every grant with its reason and fact, and the
// digests that tie the bundle to its inputs.
type Manifest struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Compiler   string            `json:"compiler"`
	Profile    string            `json:"profile"`
	Deployment string            `json:"deployment"`
	Topology   string            `json:"topology"`
	Agent      string            `json:"agent"`
	Image      ImageRef          `json:"image"`
	Inputs     map[string]string `json:"inputs"`  // facts, registryEntry, profile -> sha256:…
	Outputs    map[string]string `json:"outputs"` // bundle file -> sha256:…
	Grants     grant.List        `json:"grants"`
}

// MarshalManifest renders manifest.json: the bytes Marshal(m) gives, but
// the grants are encoded as plain structs rather than through
// grant.List's MarshalJSON, whose output encoding/json scans again (a
// measurable share of a compile). The outer grants field shadows the
// embedded one and sorts last, where Manifest declares it.
func MarshalManifest(m *Manifest) ([]byte, error) {
	return Marshal(struct {
		*Manifest
		Grants []grant.Encoded `json:"grants"`
	}{m, m.Grants.Encode()})
}

// ImageRef names the rootfs the bundle runs.
type ImageRef struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
	Rootfs  string `json:"rootfs"`
}

// Pin is one bind source's identity at compile time (pins.json, pins.go).
// It describes host state, not policy, so it is kept out of the manifest:
// the manifest stays a function of the inputs alone. Root is the registered
// root (a host path) the source lies beneath: the launcher opens the source
// beneath it, as the compiler did.
type Pin struct {
	Destination string `json:"destination"`
	Source      string `json:"source"`
	Root        string `json:"root"`
	Dev         uint64 `json:"dev"`
	Ino         uint64 `json:"ino"`
	Kind        string `json:"kind"`
}

// Digest returns "sha256:<hex>" of data.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Marshal renders a document as indented JSON with a final newline; every
// bundle file goes through it so formatting is one decision.
//
// The bytes are those of an Encoder with SetIndent("", "  ") and HTML
// escaping off, but the indenting is indentCompact's: encoding/json's own
// re-scans its output through its validating scanner, a sixth of a compile
// (TestIndentCompactMatchesEncoding holds the two equal).
func Marshal(v any) ([]byte, error) {
	s := marshalScratch.Get().(*marshalBufs)
	defer marshalScratch.Put(s)
	s.compact.Reset()
	enc := json.NewEncoder(&s.compact)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	s.indented = indentCompact(s.indented[:0], s.compact.Bytes())
	return bytes.Clone(s.indented), nil
}

// marshalScratch holds Marshal's working buffers between calls, so a
// document costs one allocation of its own size rather than a buffer
// grown by doubling, twice. A goroutine takes a pair for itself; only the
// copy it returns leaves Marshal.
var marshalScratch = sync.Pool{New: func() any { return new(marshalBufs) }}

type marshalBufs struct {
	compact  bytes.Buffer
	indented []byte
}

// Files is a bundle in memory: relative name -> content.
type Files map[string][]byte

// Names returns the file names in sorted order.
func (f Files) Names() []string {
	names := make([]string, 0, len(f))
	for n := range f {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Write writes the bundle into dir (created 0755 if missing); files are
// written whole to a temporary name and renamed, so a reader never sees a
// half-written bundle file.
func (f Files) Write(dir string) error {
	for _, n := range f.Names() {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, f[n], 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	return nil
}

// Manifest decodes manifest.json strictly.
func (f Files) Manifest() (*Manifest, error) {
	var head Head
	// The version is read first, so a manifest of another version is
	// refused as such rather than for the fields it has.
	if err := json.Unmarshal(f[ManifestFile], &head); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestFile, err)
	}
	if head.Kind != ManifestKind || head.APIVersion != ManifestAPIVersion {
		return nil, fmt.Errorf("%s: %w: kind %q version %q, want %q %q", ManifestFile, ErrManifestVersion, head.Kind, head.APIVersion, ManifestKind, ManifestAPIVersion)
	}
	var out Manifest
	if err := strictDecode(f[ManifestFile], &out); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestFile, err)
	}
	return &out, nil
}

// Head is what every document starts with.
type Head struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// ErrManifestVersion is a manifest of a kind or version this build does
// not read (PP-MANIFEST-VERSION).
var ErrManifestVersion = errors.New(string(diag.ManifestVersion) + ": not a manifest this build reads")

// Egress decodes egress.json strictly.
func (f Files) Egress() (*Egress, error) {
	var e Egress
	if err := strictDecode(f[EgressFile], &e); err != nil {
		return nil, fmt.Errorf("%s: %w", EgressFile, err)
	}
	return &e, nil
}

// Verify checks that every output the manifest lists is present with the
// recorded digest and that no policy file is present without one, so a
// tampered or mixed bundle is refused.
func (f Files) Verify() error {
	m, err := f.Manifest()
	if err != nil {
		return err
	}
	return f.VerifyAgainst(m)
}

// VerifyAgainst is Verify with manifest.json already decoded (m must be
// f's manifest.json): a caller that holds the decoded manifest does not
// decode it again.
func (f Files) VerifyAgainst(m *Manifest) error {
	// In name order: the first mismatch reported is the same every run.
	for _, name := range slices.Sorted(maps.Keys(m.Outputs)) {
		want := m.Outputs[name]
		data, ok := f[name]
		if !ok {
			return fmt.Errorf("bundle lacks %s listed in the manifest", name)
		}
		if got := Digest(data); got != want {
			return fmt.Errorf("%s digest %s does not match the manifest's %s", name, got, want)
		}
	}
	// pins.json is host state and not in the outputs; it is tied to this
	// manifest instead (pins.go).
	if _, err := f.Pins(); err != nil {
		return err
	}
	for _, name := range f.Names() {
		if name == ManifestFile || name == PinsFile {
			continue
		}
		if _, ok := m.Outputs[name]; !ok {
			return fmt.Errorf("%s is not covered by the manifest", name)
		}
	}
	return nil
}

func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
