package compiler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The model route (issue 24). In api-key mode the provider key never
// enters the sandbox: Pi talks to the model through the launcher's proxy
// on the gateway, which adds the key (read from the deployment's secrets
// at each request) in the provider API's credential header and forwards,
// over TLS verified against the provider's name, only the requests the
// profile lists for that API. The sandbox gets a placeholder key
// (bundle.ModelRoutePlaceholder) and a generated models.json pointing the
// selected provider at the route; the packet filter has no rule toward
// the model host at all.

// modelRoutePort is the route's port on the gateway; modelRoutePortAlt is
// taken when the MCP route already listens there.
const (
	modelRoutePort    = 18080
	modelRoutePortAlt = 18081
)

// modelsBytes bounds the daemon's models.json the compiler reads.
const modelsBytes = 256 << 10

const modelsFact = "state.agentDir/models.json"

// modelFiles is what the generated models.json settles for the model
// route: the provider API Pi speaks through it, and the file itself
// (files/models.json). Both are empty when it was refused.
type modelFiles struct {
	api string
	doc []byte
}

// modelRouted reports whether this launch gets the model route: a key to
// keep out of the sandbox, and a network the sandbox could use it on.
func (c *compilation) modelRouted() bool {
	return (c.facts.Credential.Mode == "api-key" || c.loginBrokered()) && c.reg.Network.Mode == "sandbox" && slices.Contains(c.prof.Egress, "model")
}

// loginBrokered reports whether the credential is a subscription login
// the model route brokers (credential mode oauth-broker): the login (the
// deployment's auth.json, access and refresh token) stays on the host,
// the route adds its access token and refreshes it at the provider's
// token endpoint itself, and the sandbox gets ModelLoginPlaceholder.
func (c *compilation) loginBrokered() bool { return c.facts.Credential.Mode == "oauth-broker" }

// checkLoginBroker refuses an oauth-broker launch the route cannot serve:
// without the route the login would have no way to the model.
func (c *compilation) checkLoginBroker() {
	if !c.loginBrokered() {
		return
	}
	if c.reg.Network.Mode != "sandbox" || !slices.Contains(c.prof.Egress, "model") {
		c.diags.Addf(diag.ModelRoute, "credential.mode", "oauth-broker mode reaches the model through the model route only: it needs network mode sandbox and a profile whose egress allows model")
	}
}

// modelRouteURL is what Pi in the sandbox calls instead of model.baseURL.
func (c *compilation) modelRouteURL(port int, prefix string) string {
	return "http://" + net.JoinHostPort(gatewayName, strconv.Itoa(port)) + prefix
}

// modelUpstream checks model.baseURL as the route's upstream: https (the
// key travels only over TLS), no query or fragment. It returns the
// canonical upstream and the path prefix the route serves.
func (c *compilation) modelUpstream() (upstream, prefix string, ok bool) {
	host, port, _, ok := c.endpoint("model.baseURL", c.facts.Model.BaseURL)
	if !ok {
		return "", "", false
	}
	u, _ := url.Parse(c.facts.Model.BaseURL)
	if u.Scheme != "https" {
		c.diags.Addf(diag.ModelRoute, "model.baseURL", "api-key mode reaches the model through the route, which sends the key over TLS only: the base URL must be https")
		return "", "", false
	}
	if u.RawQuery != "" || u.Fragment != "" || u.RawPath != "" || strings.Contains(u.Path, "//") {
		c.diags.Addf(diag.ModelRoute, "model.baseURL", "the model route forwards below a plain path: no query, fragment, escapes or empty segments")
		return "", "", false
	}
	prefix = strings.TrimSuffix(u.Path, "/")
	return "https://" + net.JoinHostPort(host, strconv.Itoa(port)) + prefix, prefix, true
}

// modelRoute grants the route: the API is the facts' model.api or the
// daemon's models.json's for the provider (which must agree), or for a
// model of Pi's built-in catalogue the catalogue's (which they must agree
// with), and the requests are the profile's for that API. api is what
// modelsDoc settled; "" when it refused.
func (c *compilation) modelRoute(p *grant.Plan, api string) {
	upstream, prefix, ok := c.modelUpstream()
	if !ok || api == "" {
		return
	}
	reqs := c.prof.ModelRoute[api]
	if len(reqs) == 0 {
		c.diags.Addf(diag.ModelRoute, "model.api", "profile %s routes no request of API %s; an api-key launch of it is refused", c.prof.Name, api)
		return
	}
	if slices.ContainsFunc(reqs, func(r string) bool { return strings.Contains(r, grant.ModelInPath) }) && !grant.PathSafeModel(c.facts.Model.ID) {
		c.diags.Addf(diag.ModelRoute, "model.id", "API %s names the model in the request path, where the route admits the model id as one plain path segment (letters, digits, . _ -) only", api)
		return
	}
	f := c.facts
	if c.loginBrokered() {
		c.modelLoginRoute(p, api, upstream, prefix, reqs)
		return
	}
	p.Add(grant.Route{Purpose: "model", Proto: "tcp", Port: c.modelPort(), Path: prefix, Upstream: upstream,
		TokenRef: f.Credential.SecretRef, API: api, Credential: grant.ModelCredentials[api], Requests: slices.Clone(reqs),
		Model: f.Model.ID, Headers: slices.Clone(c.prof.ModelHeaders[api]), HostedTools: slices.Clone(c.hostedTools),
		Provenance: why("the model through the launcher's per-sandbox proxy on the gateway, which adds the provider key (credential.secretRef) outside the sandbox and forwards over TLS, verified against the provider's name, only the requests named here (profile."+
			c.prof.Name+".modelRoute), with bodies inside the API's body policy naming model.id only and the feature headers named here (profile."+
			c.prof.Name+".modelHeaders); the sandbox has no route to the model host itself"+c.hostedReason(), "model.baseURL")})
}

// modelLoginHeaders are the feature headers a login route passes on
// besides the profile's, by API: what Pi 1.6.0 adds for an OAuth token
// (pi-ai api/anthropic-messages.js getBetaFeatures: the Claude Code and
// OAuth betas), which the subscription API requires.
var modelLoginHeaders = map[string][]string{
	"anthropic-messages": {"anthropic-beta: claude-code-20250219", "anthropic-beta: oauth-2025-04-20"},
	// pi-ai api/openai-codex-responses.js buildSSEHeaders.
	"openai-codex-responses": {"openai-beta: responses=experimental"},
}

// loginAPI refuses an API whose subscription login the route does not
// broker.
func (c *compilation) loginAPI(api string) bool {
	if grant.ModelLoginAPIs[api] != "" {
		return true
	}
	c.diags.Addf(diag.ModelRoute, "model.api", "oauth-broker mode brokers the subscription logins of %s only, not API %s; use oauth-file", strings.Join(slices.Sorted(maps.Keys(grant.ModelLoginAPIs)), ", "), api)
	return false
}

// modelLoginRoute grants the route of a brokered subscription login: the
// deployment's auth.json (credential.authFile, resolved beneath a state
// root, never mounted), its entry for model.provider, and the token
// endpoint (credential.refreshURLs[0]) the route refreshes it at.
func (c *compilation) modelLoginRoute(p *grant.Plan, api, upstream, prefix string, reqs []string) {
	f := c.facts
	if !c.loginAPI(api) {
		return
	}
	if len(f.Credential.RefreshURLs) != 1 || f.Credential.AuthFile != f.State.AgentDir+"/auth.json" {
		return // refused by checkCredential
	}
	refresh := f.Credential.RefreshURLs[0]
	if _, _, _, ok := c.endpoint("credential.refreshURLs[0]", refresh); !ok {
		return
	}
	if u, err := url.Parse(refresh); err != nil || u.Scheme != "https" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		c.diags.Addf(diag.ModelRoute, "credential.refreshURLs[0]", "the token endpoint takes the refresh token over TLS only: https, no user information, query or fragment")
		return
	}
	s, ok := c.src.resolve("credential.authFile", f.Credential.AuthFile, "state", c.dep.Roots.State, pathsafe.File)
	if !ok {
		return
	}
	headers := append(slices.Clone(c.prof.ModelHeaders[api]), modelLoginHeaders[api]...)
	p.Add(grant.Route{Purpose: "model", Proto: "tcp", Port: c.modelPort(), Path: prefix, Upstream: upstream,
		API: api, Credential: grant.ModelLoginCredential, Requests: slices.Clone(reqs),
		Model: f.Model.ID, Headers: headers, HostedTools: slices.Clone(c.hostedTools),
		LoginFile: s.host, LoginEntry: f.Model.Provider, LoginRefresh: refresh,
		Provenance: why("the model through the launcher's per-sandbox proxy on the gateway, which holds the subscription login outside the sandbox (entry "+f.Model.Provider+
			" of credential.authFile, on the host), adds its access token, refreshes it at the token endpoint (credential.refreshURLs[0]) itself and writes the new tokens back under Pi's lock, and forwards over TLS, verified against the provider's name, only the requests named here (profile."+
			c.prof.Name+".modelRoute), with bodies inside the API's body policy naming model.id only and the feature headers named here (profile."+
			c.prof.Name+".modelHeaders and the subscription's); the sandbox holds a placeholder, and has no route to the model host or the token endpoint"+c.hostedReason(), "credential.authFile")})
}

// checkHostedTools returns the provider-side tools the registry grants
// this deployment's model route, refusing (PP-MODEL-HOSTED-TOOL) a name
// the route does not know, a name given twice and an MCP connector. A
// connector is never grantable: the provider would connect to the URL,
// with the authorization, the request body names, and the body comes
// from the sandbox, so nothing could hold them to what the registry
// names.
func (c *compilation) checkHostedTools() []string {
	if c.dep.Model == nil {
		return nil
	}
	var out []string
	for i, name := range c.dep.Model.HostedTools {
		at := fmt.Sprintf("registry.deployments.%s.model.hostedTools[%d]", c.facts.Deployment.ID, i)
		switch {
		case name == "mcp" || strings.HasPrefix(name, "mcp_") || strings.Contains(name, "connector"):
			c.diags.Addf(diag.ModelHostedTool, at, "an MCP connector is never granted: the provider would connect to the server URL, with the authorization, that the request from the sandbox names")
		case grant.ModelHostedTools[name] == "":
			c.diags.Addf(diag.ModelHostedTool, at, "%q is not a hosted tool the model route knows (%s)", name, strings.Join(slices.Sorted(maps.Keys(grant.ModelHostedTools)), ", "))
		case slices.Contains(out, name):
			c.diags.Addf(diag.ModelHostedTool, at, "%q is granted twice", name)
		default:
			out = append(out, name)
		}
	}
	return out
}

// hostedReason is the model route's reason for its hosted tools.
func (c *compilation) hostedReason() string {
	if len(c.hostedTools) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("; and the hosted tools registry.deployments." + c.facts.Deployment.ID + ".model.hostedTools grants:")
	for _, name := range c.hostedTools {
		b.WriteString(" " + name + " (" + grant.ModelHostedTools[name] + ")")
	}
	return b.String()
}

func (c *compilation) modelPort() int {
	if c.facts.MCP != nil {
		if u, err := url.Parse(c.facts.MCP.AgentsURL); err == nil {
			if port, ok := urlPort(u); ok && port == modelRoutePort {
				return modelRoutePortAlt
			}
		}
	}
	return modelRoutePort
}

// signedAPIs are Pi's provider APIs whose requests carry no static key:
// each is signed per request, or carries a token minted from a service
// account, on the client. The route would have to hold the signing
// secret and sign the body it re-encodes; it does not.
var signedAPIs = map[string]string{
	"bedrock-converse-stream": "signs each request with AWS Signature Version 4 (the AWS SDK, from the account's access key and secret)",
	"google-vertex":           "authenticates with Google Application Default Credentials (an OAuth access token minted from a service account or user login by the Google auth library)",
}

// notTurnAPIs are Pi 1.6.0's API modules (pi-ai dist/api) that carry no
// agent turn: Pi registers them as classifiers or image generators, never
// as a model's stream, so a model of one of them could not answer Pi's
// agent and the route has no turn of theirs to forward. Each is named so
// the refusal says what it is rather than that the route knows no header.
var notTurnAPIs = map[string]string{
	"llama-cpp-classify":               "is a classifier (llama.cpp's /tokenize, /apply-template and /completion, label probabilities)",
	"openai-decisions":                 "is a classifier (OpenAI's Decisions, POST /v1/decisions)",
	"typesafe-system-one":              "is a classifier (the System One protocol, POST <baseUrl>/systemone)",
	"cloudflare-workers-ai-system-one": "is a classifier (System One on Workers AI, POST <baseUrl>/run)",
	"openrouter-images":                "is image generation (OpenRouter's chat completions with image output, Pi's images registry)",
}

// modelProviderKeys are the provider keys of Pi 0.84.2's models.json the
// generated file carries over for the selected provider; the others are
// refused (headers and oauth would carry credentials into the bundle or
// past the route), and baseUrl and apiKey are the route's.
var modelProviderKeys = []string{"api", "apiKey", "authHeader", "baseUrl", "compat", "modelOverrides", "models", "name"}

// modelsDoc builds files/models.json from the daemon's models.json (nil:
// none): the selected provider's entry only, its baseUrl the route, its
// apiKey the placeholder. Other providers are left out: their keys would
// land in the bundle, and the sandbox reaches no other provider anyway.
// It settles the route's API (modelFiles.api), which the route grant
// (modelRoute) uses; a refusal returns neither.
func (c *compilation) modelsDoc(daemon []byte, port int) modelFiles {
	f := c.facts
	entry := map[string]json.RawMessage{}
	if daemon != nil {
		var doc struct {
			Providers map[string]map[string]json.RawMessage `json:"providers"`
		}
		if err := json.Unmarshal(daemon, &doc); err != nil {
			c.diags.Addf(diag.ModelRoute, modelsFact, "models.json must be a JSON object of providers of at most %d bytes", modelsBytes)
			return modelFiles{}
		}
		if e, ok := doc.Providers[f.Model.Provider]; ok && e != nil {
			entry = e
		}
	}
	for _, k := range slices.Sorted(maps.Keys(entry)) {
		if !slices.Contains(modelProviderKeys, k) {
			c.diags.Addf(diag.ModelRoute, modelsFact, "the selected provider's entry sets %q; with the model route only %s are carried into the sandbox (headers and OAuth would carry credentials)", k, strings.Join(modelProviderKeys, ", "))
			return modelFiles{}
		}
	}
	api := f.Model.API
	if raw, ok := entry["api"]; ok {
		var a string
		if json.Unmarshal(raw, &a) != nil || (api != "" && a != api) {
			c.diags.Addf(diag.ModelRoute, "model.api", "the daemon's models.json names another API for the provider than model.api")
			return modelFiles{}
		}
		api = a
	}
	if !definesModel(entry, f.Model.ID) {
		// A built-in model: Pi speaks the catalogue's API to it whatever
		// the provider's entry says (an entry without the model in its
		// models list only moves the provider's base URL).
		if catAPI, ok := catalogueAPI(f.Model.Provider, f.Model.ID); ok {
			if api != "" && api != catAPI {
				cat, _ := EmbeddedPiCatalogue()
				c.diags.Addf(diag.ModelRoute, "model.api", "names API %s, but Pi %s speaks %s to its built-in model %s of provider %s; leave model.api out or name that API", api, cat.Pi, catAPI, f.Model.ID, f.Model.Provider)
				return modelFiles{}
			}
			api = catAPI
		}
	}
	if api == "" {
		c.diags.Addf(diag.ModelRoute, "model.api", "api-key mode routes the model by its provider API: Pi's built-in catalogue has no model %s of provider %s, so name the API in model.api or in the provider's models.json entry", f.Model.ID, f.Model.Provider)
		return modelFiles{}
	}
	if why, ok := signedAPIs[api]; ok {
		c.diags.Addf(diag.ModelSigned, "model.api", "API %s %s: there is no static key the model route could add outside the sandbox, so an api-key launch of it is refused", api, why)
		return modelFiles{}
	}
	if what, ok := notTurnAPIs[api]; ok {
		c.diags.Addf(diag.ModelNotTurn, "model.api", "API %s %s, not a provider API Pi streams an agent's turn through: the model route refuses it", api, what)
		return modelFiles{}
	}
	if c.loginBrokered() {
		if !c.loginAPI(api) {
			return modelFiles{}
		}
	} else if grant.ModelCredentials[api] == "" {
		c.diags.Addf(diag.ModelRoute, "model.api", "the model route knows no credential header for API %s", api)
		return modelFiles{}
	}
	if raw, ok := entry["baseUrl"]; ok {
		var b string
		if json.Unmarshal(raw, &b) != nil || strings.TrimSuffix(b, "/") != strings.TrimSuffix(f.Model.BaseURL, "/") {
			c.diags.Addf(diag.ModelRoute, modelsFact, "the selected provider's baseUrl is not model.baseURL, the route's upstream")
			return modelFiles{}
		}
	}
	if !c.modelsPerModelOK(entry, api) {
		return modelFiles{}
	}
	if api == "anthropic-messages" && !c.anthropicCompatOff(entry) {
		return modelFiles{}
	}
	prefix := ""
	if u, err := url.Parse(f.Model.BaseURL); err == nil {
		prefix = strings.TrimSuffix(u.Path, "/")
	}
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	entry["baseUrl"] = str(c.modelRouteURL(port, prefix))
	if c.loginBrokered() {
		entry["apiKey"] = str(bundle.LoginPlaceholder(api))
	} else {
		entry["apiKey"] = str(bundle.ModelRoutePlaceholder)
	}
	entry["api"] = str(api)
	out, err := bundle.Marshal(map[string]any{"providers": map[string]any{f.Model.Provider: entry}})
	if err != nil {
		c.diags.Addf(diag.ModelRoute, modelsFact, "models.json: the selected provider's entry cannot be re-encoded")
		return modelFiles{}
	}
	return modelFiles{api: api, doc: out}
}

// anthropicOff are the compat settings of Pi 1.6.0's Anthropic client
// (pi-ai api/anthropic-messages.js) whose requests the model route never
// forwards, each with the value that turns it off: allowedFallbackModels
// sends other models than the facts' (the fallbacks member and the
// server-side-fallback beta), supportsMessageThreads keeps the
// conversation at the provider (the thread member and the message-threads
// beta). Pi's own catalogue sets allowedFallbackModels on its flagship
// Anthropic models, so without this every turn of those models through the
// route would be refused; the generated entry's compat carries the off
// values, which Pi merges over every built-in model's own.
var anthropicOff = map[string]string{"allowedFallbackModels": "[]", "supportsMessageThreads": "false"}

// anthropicCompatOff refuses a daemon entry that turns on what
// anthropicOff turns off (in the provider's compat or a model's, which
// would win over it), and writes the off values into the entry's compat.
func (c *compilation) anthropicCompatOff(entry map[string]json.RawMessage) bool {
	compats := []json.RawMessage{entry["compat"]}
	var models []map[string]json.RawMessage
	if raw, ok := entry["models"]; ok && json.Unmarshal(raw, &models) == nil {
		for _, m := range models {
			compats = append(compats, m["compat"])
		}
	}
	var overrides map[string]map[string]json.RawMessage
	if raw, ok := entry["modelOverrides"]; ok && json.Unmarshal(raw, &overrides) == nil {
		for _, k := range slices.Sorted(maps.Keys(overrides)) {
			compats = append(compats, overrides[k]["compat"])
		}
	}
	for _, raw := range compats {
		if raw == nil {
			continue
		}
		var cm map[string]json.RawMessage
		if json.Unmarshal(raw, &cm) != nil {
			c.diags.Addf(diag.ModelRoute, modelsFact, "the selected provider's compat settings must be JSON objects")
			return false
		}
		for _, k := range slices.Sorted(maps.Keys(anthropicOff)) {
			if v, ok := cm[k]; ok && !jsonEqual(v, anthropicOff[k]) {
				c.diags.Addf(diag.ModelRoute, modelsFact, "compat.%s is set for the selected provider: Pi would send what the model route refuses (%s), so every turn would fail; leave it out", k, anthropicWhy[k])
				return false
			}
		}
	}
	cm := map[string]json.RawMessage{}
	if raw := entry["compat"]; raw != nil {
		_ = json.Unmarshal(raw, &cm)
	}
	for k, v := range anthropicOff {
		cm[k] = json.RawMessage(v)
	}
	b, err := json.Marshal(cm)
	if err != nil {
		c.diags.Addf(diag.ModelRoute, modelsFact, "models.json: the selected provider's compat cannot be re-encoded")
		return false
	}
	entry["compat"] = b
	return true
}

var anthropicWhy = map[string]string{
	"allowedFallbackModels":  "fallback models are other models than model.id",
	"supportsMessageThreads": "a message thread keeps the conversation at the provider",
}

// jsonEqual reports whether raw JSON a holds the same value as b.
func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

// definesModel reports whether a models.json provider entry lists model id
// in its models, which adds it or replaces Pi's built-in model of that id
// (docs/models.md). A malformed list is refused by modelsPerModelOK.
func definesModel(entry map[string]json.RawMessage, id string) bool {
	var models []struct {
		ID string `json:"id"`
	}
	if raw, ok := entry["models"]; !ok || json.Unmarshal(raw, &models) != nil {
		return false
	}
	return slices.ContainsFunc(models, func(m struct {
		ID string `json:"id"`
	}) bool {
		return m.ID == id
	})
}

// modelsPerModelOK refuses per-model settings that would leave the route:
// a model's own baseUrl, api or headers.
func (c *compilation) modelsPerModelOK(entry map[string]json.RawMessage, api string) bool {
	var models []map[string]json.RawMessage
	if raw, ok := entry["models"]; ok && json.Unmarshal(raw, &models) != nil {
		c.diags.Addf(diag.ModelRoute, modelsFact, "the selected provider's models must be a list of objects")
		return false
	}
	var overrides map[string]map[string]json.RawMessage
	if raw, ok := entry["modelOverrides"]; ok && json.Unmarshal(raw, &overrides) != nil {
		c.diags.Addf(diag.ModelRoute, modelsFact, "the selected provider's modelOverrides must be an object of objects")
		return false
	}
	for _, ov := range overrides {
		models = append(models, ov)
	}
	for _, m := range models {
		_, hasBase := m["baseUrl"]
		_, hasHeaders := m["headers"]
		var a string
		if raw, ok := m["api"]; ok && (json.Unmarshal(raw, &a) != nil || a != api) || hasBase || hasHeaders {
			c.diags.Addf(diag.ModelRoute, modelsFact, "a model of the selected provider sets its own baseUrl, api or headers; the route serves one API at model.baseURL and adds the only credential")
			return false
		}
	}
	return true
}
