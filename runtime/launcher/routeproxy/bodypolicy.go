package routeproxy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// The body policy (issue 31): a model route forwards a request body only
// when every member in it is one Pi's own provider client sends for that
// API (pi-ai 0.84.2 and 1.6.0, api/*.js), holding what Pi puts there.
// Everything else is refused, with the first member that is not: a model
// other than the route's, a provider-side connector (Anthropic's
// mcp_servers, a Responses tool of type mcp), a hosted tool (web search,
// code execution, file search, computer use, ...), provider-side state
// (previous_response_id, conversation, store:true, background, a stored
// prompt, Anthropic's container and threads), content the provider would
// fetch (an image by URL, a file id), and any member the policy does not
// name. Each of these would let the provider, holding the deployment's
// key, reach a host or an account's data the sandbox's egress does not.
// The policy is checked on the strictly decoded value, and that value,
// re-encoded, is what the provider gets.

// Reason is why the route refused a request; Stats counts each.
type Reason uint8

const (
	// ReasonShape: a member Pi sends holds something Pi does not put there.
	ReasonShape Reason = iota
	// ReasonUnknownMember: a member the API's policy does not name.
	ReasonUnknownMember
	// ReasonForeignModel: a model other than the route's (facts' model.id).
	ReasonForeignModel
	// ReasonConnector: the provider would connect to a server the body names.
	ReasonConnector
	// ReasonHostedTool: a tool the provider runs itself.
	ReasonHostedTool
	// ReasonProviderState: state kept at the provider (stored responses,
	// conversations, containers, threads, prompt templates).
	ReasonProviderState
	// ReasonRemoteContent: content the provider would fetch (a URL) or
	// look up (a file id) instead of content in the body.
	ReasonRemoteContent
	// ReasonFeatureHeader: a beta or version header with a value the
	// route's profile does not list.
	ReasonFeatureHeader
	numReasons
)

var reasonNames = [numReasons]string{"shape", "unknown-member", "foreign-model", "connector", "hosted-tool",
	"provider-state", "remote-content", "feature-header"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "reason-" + strconv.Itoa(int(r))
}

// Reasons lists every reason, in order.
func Reasons() []Reason {
	rs := make([]Reason, numReasons)
	for i := range rs {
		rs[i] = Reason(i)
	}
	return rs
}

// Refusal is one refused request: the reason, where in the body (a JSON
// path such as tools[0].type, or the header's name) and what was wrong.
type Refusal struct {
	Reason Reason
	Path   string
	Why    string
}

func (r *Refusal) Error() string {
	return "paseo model route refused the request (" + r.Reason.String() + ") at " + r.Path + ": " + r.Why
}

// checkCtx is what a check needs besides the value: the route's model
// and the hosted tools the registry grants it (grant.ModelHostedTools).
type checkCtx struct {
	model  string
	hosted []string
}

// check judges one value at path; nil admits it.
type check func(c *checkCtx, n *node, path string) *Refusal

func refuseAt(r Reason, path, why string, args ...any) *Refusal {
	return &Refusal{Reason: r, Path: path, Why: fmt.Sprintf(why, args...)}
}

var kindNames = [...]string{"null", "a boolean", "a number", "a string", "an array", "an object"}

func want(k kind) check {
	return func(_ *checkCtx, n *node, path string) *Refusal {
		if n.kind != k {
			return refuseAt(ReasonShape, path, "must be %s, not %s", kindNames[k], kindNames[n.kind])
		}
		return nil
	}
}

var (
	str     = want(kindString)
	num     = want(kindNumber)
	boolean = want(kindBool)
)

// free admits any JSON value: a tool's JSON schema, a call's arguments,
// opaque reasoning the provider handed out. None of it is something the
// provider acts on outside the model.
func free(*checkCtx, *node, string) *Refusal { return nil }

// freeObject admits any object.
func freeObject(c *checkCtx, n *node, path string) *Refusal { return want(kindObject)(c, n, path) }

// enum admits one of vals.
func enum(vals ...string) check {
	return func(_ *checkCtx, n *node, path string) *Refusal {
		if n.kind != kindString || !slices.Contains(vals, n.str) {
			return refuseAt(ReasonShape, path, "must be one of %s", strings.Join(vals, ", "))
		}
		return nil
	}
}

// only admits the boolean v; the other value is refused for r.
func only(v bool, r Reason) check {
	return func(_ *checkCtx, n *node, path string) *Refusal {
		if n.kind != kindBool {
			return refuseAt(ReasonShape, path, "must be a boolean")
		}
		if n.lit != strconv.FormatBool(v) {
			return refuseAt(r, path, "must be %t through the model route", v)
		}
		return nil
	}
}

// theModel admits the route's model only.
func theModel(c *checkCtx, n *node, path string) *Refusal {
	if n.kind != kindString || n.str != c.model {
		return refuseAt(ReasonForeignModel, path, "this route serves the model %q only", c.model)
	}
	return nil
}

// dataURL admits an inline base64 image (what Pi sends); any other URL
// would be fetched by the provider.
func dataURL(_ *checkCtx, n *node, path string) *Refusal {
	if n.kind != kindString {
		return refuseAt(ReasonShape, path, "must be a string")
	}
	mt, _, ok := strings.Cut(strings.TrimPrefix(n.str, "data:"), ";base64,")
	if !strings.HasPrefix(n.str, "data:") || !ok || !strings.HasPrefix(mt, "image/") {
		return refuseAt(ReasonRemoteContent, path, "an image goes inline (data:image/...;base64,...), never by URL")
	}
	return nil
}

// refused refuses the member wherever it appears, for r.
func refused(r Reason, why string) check {
	return func(_ *checkCtx, _ *node, path string) *Refusal { return refuseAt(r, path, "%s", why) }
}

func arr(elem check) check {
	return func(c *checkCtx, n *node, path string) *Refusal {
		if n.kind != kindArray {
			return refuseAt(ReasonShape, path, "must be an array")
		}
		for i, e := range n.elems {
			if r := elem(c, e, path+"["+strconv.Itoa(i)+"]"); r != nil {
				return r
			}
		}
		return nil
	}
}

// byKind dispatches on the value's JSON kind (a content that is a string
// or an array of parts).
func byKind(m map[kind]check) check {
	return func(c *checkCtx, n *node, path string) *Refusal {
		ch, ok := m[n.kind]
		if !ok {
			return refuseAt(ReasonShape, path, "must not be %s", kindNames[n.kind])
		}
		return ch(c, n, path)
	}
}

// fields is an object's members and what each may hold.
type fields map[string]check

// obj admits an object whose members are all named in f, each passing
// its check, in the order they came.
func obj(f fields) check {
	return func(c *checkCtx, n *node, path string) *Refusal {
		if n.kind != kindObject {
			return refuseAt(ReasonShape, path, "must be an object")
		}
		for _, m := range n.members {
			ch, ok := f[m.key]
			if !ok {
				return refuseAt(ReasonUnknownMember, join(path, m.key), "is not a member Pi sends; unknown members are refused")
			}
			if r := ch(c, m.val, join(path, m.key)); r != nil {
				return r
			}
		}
		return nil
	}
}

// withModel requires the model member: a body without one would leave the
// choice to the provider or a gateway's default, another model than the
// route's.
func withModel(ch check) check {
	return func(c *checkCtx, n *node, path string) *Refusal {
		if _, ok := n.get("model"); n.kind == kindObject && !ok {
			return refuseAt(ReasonForeignModel, join(path, "model"), "a body names the route's model %q", c.model)
		}
		return ch(c, n, path)
	}
}

// tagged dispatches an object on its tag member (type or role) to the
// variant's fields (which need not name the tag). A value of the tag no
// variant has is refused for other(value); an object without the tag
// takes variant "" if there is one.
func tagged(tag string, variants map[string]fields, other func(string) Reason) check {
	checks := map[string]check{}
	for v, f := range variants {
		f = maps.Clone(f)
		f[tag] = free // the tag itself was matched below
		checks[v] = obj(f)
	}
	return func(c *checkCtx, n *node, path string) *Refusal {
		if n.kind != kindObject {
			return refuseAt(ReasonShape, path, "must be an object")
		}
		v := ""
		if t, ok := n.get(tag); ok {
			if t.kind != kindString || t.str == "" {
				return refuseAt(ReasonShape, join(path, tag), "must be a non-empty string")
			}
			v = t.str
		}
		ch, ok := checks[v]
		if !ok {
			if v == "" {
				return refuseAt(ReasonShape, path, "names no %s", tag)
			}
			return refuseAt(other(v), join(path, tag), "%q is not one Pi sends", v)
		}
		return ch(c, n, path)
	}
}

// shapeOf is the reason for an unknown tag that is just not Pi's.
func shapeOf(string) Reason { return ReasonShape }

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// BodyPolicy is one API's policy: the request body's top-level check.
type BodyPolicy struct {
	API  string
	body check
}

// Check judges a request body (the strictly decoded value) for a route
// whose model is model and whose registry grants the hosted tools.
func (p *BodyPolicy) Check(n *node, model string, hosted ...string) *Refusal {
	return p.body(&checkCtx{model: model, hosted: hosted}, n, "")
}

// hostedTool is a provider-side tool as one API spells it: the registry
// name that grants it (grant.ModelHostedTools), which tool types are it,
// and the members it may hold then.
type hostedTool struct {
	name   string
	match  func(typ string) bool
	fields fields
}

// withHosted admits a tool the route's registry grants, by its type,
// with the hosted tool's own members; anything else goes to base (where
// a hosted tool is refused).
func withHosted(base check, tools ...hostedTool) check {
	checks := make([]check, len(tools))
	for i, h := range tools {
		f := maps.Clone(h.fields)
		f["type"] = free // matched below
		checks[i] = obj(f)
	}
	return func(c *checkCtx, n *node, path string) *Refusal {
		if t, ok := n.get("type"); ok && n.kind == kindObject && t.kind == kindString {
			for i, h := range tools {
				if h.match(t.str) && slices.Contains(c.hosted, h.name) {
					return checks[i](c, n, path)
				}
			}
		}
		return base(c, n, path)
	}
}

// granted admits the member by ch when the route's registry grants the
// hosted tool name, and by base (a refusal) otherwise.
func granted(name string, ch, base check) check {
	return func(c *checkCtx, n *node, path string) *Refusal {
		if slices.Contains(c.hosted, name) {
			return ch(c, n, path)
		}
		return base(c, n, path)
	}
}

// BodyPolicies are the policies of the APIs a model route speaks.
var BodyPolicies = map[string]*BodyPolicy{
	"openai-completions": {API: "openai-completions", body: withModel(completionsBody)},
	"openai-responses":   {API: "openai-responses", body: withModel(responsesBody)},
	"anthropic-messages": {API: "anthropic-messages", body: withModel(anthropicBody)},
	// The model is in the path (grant.ModelInPath), which match pins.
	"google-generative-ai": {API: "google-generative-ai", body: googleBody},
	// Azure OpenAI's Responses (pi-ai api/azure-openai-responses.js
	// buildParams: a subset of openai-responses' members; the model is the
	// deployment name, which Pi takes from model.id unless the sandbox's
	// AZURE_OPENAI_DEPLOYMENT_NAME_MAP says otherwise).
	"azure-openai-responses": {API: "azure-openai-responses", body: withModel(responsesBody)},
	"mistral-conversations":  {API: "mistral-conversations", body: withModel(mistralBody)},
	// Pi's own message protocol (the Radius gateway's; apis.go).
	"pi-messages": {API: "pi-messages", body: withModel(piMessagesBody)},
	// OpenAI's ChatGPT subscription (a login route only; codex.go).
	"openai-codex-responses": {API: "openai-codex-responses", body: withModel(codexBody)},
}
