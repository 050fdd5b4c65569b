package routeproxy

import (
	"maps"
	"strings"
)

// The three APIs' body policies, member by member as Pi's provider
// clients build them (pi-ai 0.84.2 and 1.6.0: api/openai-completions.js
// buildParams, convertMessages, convertTools; api/openai-responses.js and
// openai-responses-shared.js; api/anthropic-messages.js). A member that
// only some compat setting of Pi sends is here too when it leaves
// nothing but the model to act on (thinking switches, cache keys, chat
// template variables); samplingParams, which Pi merges in unchecked, are
// not. docs/grants.md lists the same, per API.

// toolKind is the reason for a tool type other than Pi's own function
// (and grammar) tools: mcp is a connector, anything else is run by the
// provider.
func toolKind(t string) Reason {
	if t == "mcp" || strings.HasPrefix(t, "mcp_") {
		return ReasonConnector
	}
	return ReasonHostedTool
}

// partKind is the reason for a content part Pi never sends: a file or an
// image by reference is fetched or looked up by the provider.
func partKind(t string) Reason {
	switch {
	case strings.Contains(t, "file"), strings.Contains(t, "document"), strings.Contains(t, "url"), t == "search_result", t == "container_upload":
		return ReasonRemoteContent
	case strings.Contains(t, "mcp"):
		return ReasonConnector
	case strings.HasPrefix(t, "server_tool"), strings.HasSuffix(t, "_tool_result"), strings.HasSuffix(t, "_call"), strings.HasSuffix(t, "_call_output"):
		return ReasonHostedTool
	}
	return ReasonShape
}

var cacheControl = obj(fields{"type": enum("ephemeral"), "ttl": enum("5m", "1h")})

// ---- hosted tools the registry may grant (grant.ModelHostedTools) ----
//
// Pi sends none of them; an extension's onPayload may. Each is admitted
// only on a route whose registry entry names it, with the members the
// provider documents for it; a connector (mcp) never is.

var userLocation = obj(fields{"type": enum("approximate"), "city": str, "country": str, "region": str, "timezone": str})

var searchContext = enum("low", "medium", "high")

// Responses: {"type": "web_search"} (and its dated and preview names).
var rWebSearch = hostedTool{name: "web_search",
	match: func(t string) bool { return t == "web_search" || strings.HasPrefix(t, "web_search_") },
	fields: fields{"filters": obj(fields{"allowed_domains": arr(str)}), "search_context_size": searchContext,
		"user_location": userLocation}}

// Anthropic: {"type": "web_search_20250305", "name": "web_search"}.
var aWebSearch = hostedTool{name: "web_search",
	match: func(t string) bool {
		d, ok := strings.CutPrefix(t, "web_search_")
		return ok && len(d) == 8 && strings.Trim(d, "0123456789") == ""
	},
	fields: fields{"name": enum("web_search"), "max_uses": num, "allowed_domains": arr(str), "blocked_domains": arr(str),
		"user_location": userLocation, "cache_control": cacheControl}}

// Chat completions: the web_search_options member.
var ccWebSearch = obj(fields{"search_context_size": searchContext,
	"user_location": obj(fields{"type": enum("approximate"), "approximate": obj(fields{"city": str, "country": str, "region": str, "timezone": str})})})

// ---- openai-completions ----

var ccText = fields{"text": str, "cache_control": cacheControl}

var ccTextParts = arr(tagged("type", map[string]fields{"text": ccText}, partKind))

var ccTool = tagged("type", map[string]fields{
	"function": {"function": obj(fields{"name": str, "description": str, "parameters": freeObject, "strict": boolean}),
		"cache_control": cacheControl},
	"custom": {"custom": obj(fields{"name": str, "description": str,
		"format": obj(fields{"type": enum("grammar"), "grammar": obj(fields{"syntax": str, "definition": str})})}),
		"cache_control": cacheControl},
}, toolKind)

var ccToolCall = tagged("type", map[string]fields{
	"function": {"id": str, "function": obj(fields{"name": str, "arguments": str})},
	"custom":   {"id": str, "custom": obj(fields{"name": str, "input": str})},
}, toolKind)

var ccContent = byKind(map[kind]check{kindString: str, kindArray: ccTextParts})

var ccMessage = tagged("role", map[string]fields{
	"system":    {"content": ccContent, "tools": arr(ccTool)}, // kimi's deferred tools come in a system message
	"developer": {"content": ccContent},
	"user": {"content": byKind(map[kind]check{kindString: str, kindArray: arr(tagged("type", map[string]fields{
		"text":      ccText,
		"image_url": {"image_url": obj(fields{"url": dataURL, "detail": enum("auto", "low", "high")})},
	}, partKind))})},
	"assistant": {"content": byKind(map[kind]check{kindNull: free, kindString: str, kindArray: ccTextParts}),
		"tool_calls": arr(ccToolCall), "reasoning_details": arr(freeObject),
		// Pi echoes thinking under the field the provider streamed it in.
		"reasoning_content": str, "reasoning": str, "reasoning_text": str},
	"tool": {"content": ccContent, "tool_call_id": str, "name": str},
}, shapeOf)

var completionsBody = obj(fields{
	"model":                  theModel,
	"messages":               arr(ccMessage),
	"stream":                 boolean,
	"stream_options":         obj(fields{"include_usage": boolean}),
	"store":                  only(false, ReasonProviderState),
	"prompt_cache_key":       str,
	"prompt_cache_retention": str,
	"max_tokens":             num,
	"max_completion_tokens":  num,
	"temperature":            num,
	"tools":                  arr(ccTool),
	"tool_stream":            boolean,
	"tool_choice": byKind(map[kind]check{kindString: enum("auto", "none", "required"),
		kindObject: tagged("type", map[string]fields{"function": {"function": obj(fields{"name": str})}}, toolKind)}),
	"reasoning_effort": str,
	"enable_thinking":  boolean,
	"thinking": byKind(map[kind]check{kindString: str,
		kindObject: obj(fields{"type": enum("enabled", "disabled"), "clear_thinking": boolean})}),
	"reasoning":             obj(fields{"effort": str, "enabled": boolean}),
	"thinking_token_budget": num,
	"chat_template_kwargs":  freeObject,
	"chat_template_args":    freeObject,
	"priority":              num,
	// The gateway's routing among its own upstreams, from models.json.
	"provider":        freeObject,
	"providerOptions": obj(fields{"gateway": obj(fields{"only": arr(str), "order": arr(str)})}),
	// Named so their refusal says why.
	"web_search_options": granted("web_search", ccWebSearch, refused(ReasonHostedTool, "the provider's web search is not granted to this deployment (registry model.hostedTools)")),
	"audio":              refused(ReasonHostedTool, "audio output is not Pi's"),
	"prediction":         refused(ReasonShape, "predicted outputs are not Pi's"),
	"metadata":           refused(ReasonProviderState, "stored-completion metadata is provider-side state"),
	"user":               refused(ReasonProviderState, "an end-user id is provider-side state"),
	"models":             refused(ReasonForeignModel, "fallback models (OpenRouter's models) are other models than the route's"),
	"mcp_servers":        refused(ReasonConnector, "the provider (or a gateway in front of it) would connect to the MCP servers named here"),
})

// ---- openai-responses ----

var rTool = tagged("type", map[string]fields{
	"function": {"name": str, "description": str, "parameters": freeObject, "strict": boolean, "defer_loading": boolean},
	"custom": {"name": str, "description": str, "defer_loading": boolean,
		"format": obj(fields{"type": enum("grammar"), "syntax": str, "definition": str})},
}, toolKind)

var rInputParts = arr(tagged("type", map[string]fields{
	"input_text":  {"text": str},
	"input_image": {"image_url": dataURL, "detail": enum("auto", "low", "high")},
}, partKind))

var rOutput = byKind(map[kind]check{kindString: str, kindArray: rInputParts})

// rItem is one input item: a message by role (no type), or a typed item.
var rItem = tagged("type", map[string]fields{
	"": {"role": enum("user", "system", "developer"), "content": byKind(map[kind]check{kindString: str, kindArray: rInputParts})},
	"message": {"role": enum("assistant", "user", "system", "developer"), "id": str, "status": str,
		"phase": enum("commentary", "final_answer"),
		"content": byKind(map[kind]check{kindString: str, kindArray: arr(tagged("type", map[string]fields{
			"input_text":  {"text": str},
			"input_image": {"image_url": dataURL, "detail": enum("auto", "low", "high")},
			"output_text": {"text": str, "annotations": arr(freeObject), "logprobs": arr(freeObject)},
		}, partKind))})},
	"function_call":           {"id": str, "call_id": str, "name": str, "arguments": str, "namespace": str, "status": str},
	"custom_tool_call":        {"id": str, "call_id": str, "name": str, "input": str, "namespace": str, "status": str},
	"function_call_output":    {"call_id": str, "output": rOutput, "id": str, "status": str},
	"custom_tool_call_output": {"call_id": str, "output": rOutput, "id": str, "status": str},
	// Pi replays the reasoning item the provider streamed (its encrypted
	// content is the provider's own; store:false keeps nothing there).
	"reasoning": {"id": str, "status": str, "encrypted_content": byKind(map[kind]check{kindString: str, kindNull: free}),
		"summary": arr(obj(fields{"type": enum("summary_text"), "text": str})),
		"content": arr(obj(fields{"type": enum("reasoning_text"), "text": str}))},
	"additional_tools": {"role": enum("developer"), "tools": arr(rTool)},
	"tool_search_call": {"call_id": str, "execution": enum("client"), "status": str,
		"arguments": obj(fields{"query": str, "limit": num})},
	"tool_search_output": {"call_id": str, "execution": enum("client"), "status": str, "tools": arr(rTool)},
	// Pi 1.6.0: a reasoning effort change mid-conversation.
	"configuration_update": {"reasoning": obj(fields{"effort": str})},
}, partKind)

var responsesBody = obj(responsesFields)

var responsesFields = fields{
	"model":                  theModel,
	"input":                  byKind(map[kind]check{kindString: str, kindArray: arr(itemRef(rItem))}),
	"stream":                 boolean,
	"store":                  only(false, ReasonProviderState),
	"prompt_cache_key":       str,
	"prompt_cache_retention": str,
	"prompt_cache_options":   obj(fields{"mode": str}),
	"max_output_tokens":      num,
	"temperature":            num,
	"service_tier":           str,
	"tools":                  arr(withHosted(rTool, rWebSearch)),
	"tool_choice": byKind(map[kind]check{kindString: enum("auto", "none", "required"),
		kindObject: tagged("type", map[string]fields{"function": {"name": str}}, toolKind)}),
	"reasoning": obj(fields{"effort": str, "summary": str}),
	"include":   arr(enum("reasoning.encrypted_content")),
	// Named so their refusal says why.
	"previous_response_id": refused(ReasonProviderState, "a stored response is provider-side state"),
	"conversation":         refused(ReasonProviderState, "a stored conversation is provider-side state"),
	"background":           refused(ReasonProviderState, "a background response is stored at the provider"),
	"prompt":               refused(ReasonProviderState, "a stored prompt template is provider-side state"),
	"instructions":         refused(ReasonShape, "Pi sends its instructions as a message"),
	"metadata":             refused(ReasonProviderState, "response metadata is provider-side state"),
	"user":                 refused(ReasonProviderState, "an end-user id is provider-side state"),
	"safety_identifier":    refused(ReasonProviderState, "an end-user id is provider-side state"),
	"mcp_servers":          refused(ReasonConnector, "the provider (or a gateway in front of it) would connect to the MCP servers named here"),
}

// codexBody is Pi's Codex request (pi-ai api/openai-codex-responses.js
// buildRequestBody): the Responses members (input items through Pi's
// shared converter) and two of its own, text.verbosity and
// parallel_tool_calls; its function tools carry strict: null (Pi
// converts them with toolOptions strict null, openai-responses-shared.js
// convertResponsesTools).
var codexBody = obj(func() fields {
	f := maps.Clone(responsesFields)
	f["tools"] = arr(withHosted(tagged("type", map[string]fields{
		"function": {"name": str, "description": str, "parameters": freeObject,
			"strict": byKind(map[kind]check{kindBool: boolean, kindNull: free}), "defer_loading": boolean},
		"custom": {"name": str, "description": str, "defer_loading": boolean,
			"format": obj(fields{"type": enum("grammar"), "syntax": str, "definition": str})},
	}, toolKind), rWebSearch))
	f["text"] = obj(fields{"verbosity": enum("low", "medium", "high")})
	f["parallel_tool_calls"] = boolean
	return f
}())

// itemRef refuses an item_reference (a stored item named by id) before
// the item's own check.
func itemRef(ch check) check {
	return func(c *checkCtx, n *node, path string) *Refusal {
		if t, ok := n.get("type"); ok && t.kind == kindString && t.str == "item_reference" {
			return refuseAt(ReasonProviderState, join(path, "type"), "an item stored at the provider is provider-side state")
		}
		return ch(c, n, path)
	}
}

// ---- anthropic-messages ----

var aTool = tagged("type", map[string]fields{
	"":       aToolFields,
	"custom": aToolFields,
}, toolKind)

var aToolFields = fields{"name": str, "description": str, "input_schema": freeObject, "eager_input_streaming": boolean,
	"strict": boolean, "defer_loading": boolean, "cache_control": cacheControl}

var aImage = fields{"source": tagged("type", map[string]fields{"base64": {"media_type": str, "data": str}}, func(string) Reason { return ReasonRemoteContent }),
	"cache_control": cacheControl}

var aText = fields{"text": str, "cache_control": cacheControl}

var aSystem = byKind(map[kind]check{kindString: str, kindArray: arr(tagged("type", map[string]fields{"text": aText}, partKind))})

var aUserBlocks = arr(tagged("type", map[string]fields{
	"text":  aText,
	"image": aImage,
	"tool_result": {"tool_use_id": str, "is_error": boolean, "cache_control": cacheControl,
		"content": byKind(map[kind]check{kindString: str, kindArray: arr(tagged("type", map[string]fields{
			"text":           aText,
			"image":          aImage,
			"tool_reference": {"tool_name": str},
		}, partKind))})},
	"tool_reference": {"tool_name": str},
}, partKind))

var aAssistantBlocks = arr(tagged("type", map[string]fields{
	"text":              aText,
	"thinking":          {"thinking": str, "signature": str},
	"redacted_thinking": {"data": str},
	"tool_use":          {"id": str, "name": str, "input": freeObject, "cache_control": cacheControl},
}, partKind))

var aMessage = tagged("role", map[string]fields{
	"user":      {"content": byKind(map[kind]check{kindString: str, kindArray: aUserBlocks})},
	"assistant": {"content": byKind(map[kind]check{kindString: str, kindArray: aAssistantBlocks})},
	// Pi 1.6.0: mid-conversation system messages (text, tool changes,
	// effort markers).
	"system": {"output_config": obj(fields{"effort": str}), "content": arr(tagged("type", map[string]fields{
		"text":          aText,
		"tool_addition": {"tool": obj(fields{"type": enum("tool_definition"), "definition": aTool}), "cache_control": cacheControl},
		"tool_removal":  {"tool": obj(fields{"type": enum("tool_reference"), "name": str}), "cache_control": cacheControl},
	}, partKind))},
}, shapeOf)

var anthropicBody = obj(fields{
	"model":       theModel,
	"messages":    arr(aMessage),
	"max_tokens":  num,
	"stream":      boolean,
	"system":      aSystem,
	"temperature": num,
	"tools":       arr(withHosted(aTool, aWebSearch)),
	"thinking": tagged("type", map[string]fields{
		"enabled":  {"budget_tokens": num, "display": str},
		"disabled": {},
		"adaptive": {"display": str, "block_binding": obj(fields{"prefix_mismatch_behavior": str})},
	}, shapeOf),
	"output_config": obj(fields{"effort": str}),
	"metadata":      obj(fields{"user_id": str}),
	"tool_choice": tagged("type", map[string]fields{
		"auto": {"disable_parallel_tool_use": boolean},
		"any":  {"disable_parallel_tool_use": boolean},
		"none": {},
		"tool": {"name": str, "disable_parallel_tool_use": boolean},
	}, shapeOf),
	// Named so their refusal says why.
	"mcp_servers":  refused(ReasonConnector, "the provider would connect to the MCP servers named here"),
	"container":    refused(ReasonProviderState, "a code-execution container is provider-side state"),
	"thread":       refused(ReasonProviderState, "a message thread is provider-side state; send the whole conversation"),
	"fallbacks":    refused(ReasonForeignModel, "fallback models are other models than the route's"),
	"service_tier": refused(ReasonShape, "Pi sends no service tier"),
})

// ---- google-generative-ai ----
//
// What @google/genai puts on the wire for Pi's client (pi-ai 1.6.0
// api/google-generative-ai.js buildParams, api/google-shared.js
// convertMessages and convertTools; 0.84.2 builds the same members): the
// model is not in the body but in the path (/models/{model}:
// streamGenerateContent), which the route matches with its own model.
// A part is told by the member it holds, not by a tag.

// gInline is an inline image (a user's, or a tool result's).
var gInline = obj(fields{"mimeType": imageType, "data": str})

// imageType admits an image media type: Pi inlines images only.
func imageType(_ *checkCtx, n *node, path string) *Refusal {
	if n.kind != kindString || !strings.HasPrefix(n.str, "image/") {
		return refuseAt(ReasonShape, path, "Pi inlines images only (image/...)")
	}
	return nil
}

var gPart = obj(fields{
	"text":             str,
	"thought":          boolean,
	"thoughtSignature": str,
	"inlineData":       gInline,
	"functionCall":     obj(fields{"name": str, "args": freeObject, "id": str}),
	"functionResponse": obj(fields{"name": str, "id": str, "response": obj(fields{"output": str, "error": str}),
		"parts": arr(obj(fields{"inlineData": gInline}))}),
	// Named so their refusal says why.
	"fileData":            refused(ReasonRemoteContent, "a file by URI is fetched or looked up by the provider; Pi inlines its images"),
	"executableCode":      refused(ReasonHostedTool, "code the provider runs (code execution) is not Pi's"),
	"codeExecutionResult": refused(ReasonHostedTool, "code the provider runs (code execution) is not Pi's"),
	"toolCall":            refused(ReasonHostedTool, "a server-side tool call is not Pi's"),
	"toolResponse":        refused(ReasonHostedTool, "a server-side tool result is not Pi's"),
})

var gContent = obj(fields{"role": enum("user", "model"), "parts": arr(gPart)})

// gGoogleSearch is Google's search tool ({"googleSearch": {}}), granted
// as web_search.
var gGoogleSearch = obj(fields{"excludeDomains": arr(str), "timeRangeFilter": obj(fields{"startTime": str, "endTime": str})})

var gTool = obj(fields{
	"functionDeclarations": arr(obj(fields{"name": str, "description": str, "parametersJsonSchema": freeObject,
		"parameters": freeObject})),
	"googleSearch": granted("web_search", gGoogleSearch, refused(ReasonHostedTool, "the provider's web search is not granted to this deployment (registry model.hostedTools)")),
	// Named so their refusal says why.
	"googleSearchRetrieval": refused(ReasonHostedTool, "the provider's search retrieval is not Pi's"),
	"codeExecution":         refused(ReasonHostedTool, "the provider would run code (code execution is not Pi's)"),
	"urlContext":            refused(ReasonHostedTool, "the provider would fetch the URLs the prompt names (url context is not Pi's)"),
	"googleMaps":            refused(ReasonHostedTool, "the provider's maps grounding is not Pi's"),
	"fileSearch":            refused(ReasonProviderState, "a file search store is provider-side state"),
	"retrieval":             refused(ReasonRemoteContent, "retrieval from a store the provider reaches is not Pi's"),
	"enterpriseWebSearch":   refused(ReasonHostedTool, "the provider's web search is not Pi's"),
	"computerUse":           refused(ReasonHostedTool, "computer use is run by the provider"),
	"mcpServers":            refused(ReasonConnector, "the provider would connect to the MCP servers named here"),
})

var googleBody = obj(fields{
	"contents":          arr(gContent),
	"systemInstruction": byKind(map[kind]check{kindString: str, kindObject: obj(fields{"role": enum("user"), "parts": arr(obj(fields{"text": str}))})}),
	"tools":             arr(gTool),
	"toolConfig": obj(fields{"functionCallingConfig": obj(fields{"mode": enum("AUTO", "ANY", "NONE", "VALIDATED"),
		"allowedFunctionNames": arr(str)}),
		"retrievalConfig": refused(ReasonHostedTool, "a location for the provider's maps grounding is not Pi's")}),
	"generationConfig": obj(fields{"temperature": num, "maxOutputTokens": num,
		"thinkingConfig": obj(fields{"includeThoughts": boolean, "thinkingBudget": num, "thinkingLevel": str})}),
	// Named so their refusal says why.
	"model":         refused(ReasonForeignModel, "the model is the one in the route's path, never named in the body"),
	"cachedContent": refused(ReasonProviderState, "cached content is provider-side state"),
})

// ---- mistral-conversations ----
//
// Pi's own Mistral client (pi-ai api/mistral-conversations.js
// buildChatPayload, toChatMessages, toMistralWirePayload; the same wire
// form in 0.84.2 and 1.6.0): a chat completion at /v1/chat/completions,
// with Mistral's thinking chunks on the assistant and an image as a data
// URL string.

var mText = fields{"text": str}

var mUserParts = arr(tagged("type", map[string]fields{"text": mText, "image_url": {"image_url": dataURL}}, partKind))

var mMessage = tagged("role", map[string]fields{
	"system": {"content": byKind(map[kind]check{kindString: str, kindArray: arr(tagged("type", map[string]fields{"text": mText}, partKind))})},
	"user":   {"content": byKind(map[kind]check{kindString: str, kindArray: mUserParts})},
	"assistant": {"prefix": only(false, ReasonShape),
		"content": byKind(map[kind]check{kindNull: free, kindString: str, kindArray: arr(tagged("type", map[string]fields{
			"text":     mText,
			"thinking": {"thinking": arr(tagged("type", map[string]fields{"text": mText}, partKind))},
		}, partKind))}),
		"tool_calls": arr(tagged("type", map[string]fields{
			"function": {"id": str, "index": num, "function": obj(fields{"name": str, "arguments": str})},
		}, toolKind))},
	"tool": {"name": str, "tool_call_id": str, "content": byKind(map[kind]check{kindString: str, kindArray: mUserParts})},
}, shapeOf)

var mistralBody = obj(fields{
	"model":    theModel,
	"stream":   boolean,
	"messages": arr(mMessage),
	"tools": arr(tagged("type", map[string]fields{
		"function": {"function": obj(fields{"name": str, "description": str, "parameters": freeObject, "strict": boolean})},
	}, toolKind)),
	"temperature": num,
	"max_tokens":  num,
	"tool_choice": byKind(map[kind]check{kindString: enum("auto", "none", "any", "required"),
		kindObject: tagged("type", map[string]fields{"function": {"function": obj(fields{"name": str})}}, toolKind)}),
	"prompt_mode":      enum("reasoning"),
	"reasoning_effort": str,
	"prompt_cache_key": str,
	// Named so their refusal says why.
	"agent_id":        refused(ReasonProviderState, "an agent stored at the provider is provider-side state"),
	"conversation_id": refused(ReasonProviderState, "a stored conversation is provider-side state"),
	"document_url":    refused(ReasonRemoteContent, "a document by URL is fetched by the provider"),
})

// ---- pi-messages ----
//
// Pi's own message protocol (pi-ai 1.6.0 api/pi-messages.js, the Radius
// gateway's wire form): one POST of {model, context, options} to
// <baseUrl>/messages, context being Pi's own Context (types.d.ts: system,
// user, assistant and toolResult messages; text, image, thinking and
// toolCall parts; tools of name, description and JSON schema). Images are
// inline base64 (data and mimeType), never a URL; a tool has no type, so
// no hosted tool can be named in it.

var piText = fields{"text": str, "textSignature": str}

var piImage = fields{"data": str, "mimeType": imageType}

var piUserParts = arr(tagged("type", map[string]fields{"text": piText, "image": piImage}, partKind))

var piTool = obj(fields{"name": str, "description": str, "parameters": freeObject,
	"constrainedSampling": byKind(map[kind]check{kindBool: only(false, ReasonShape), kindObject: freeObject})})

var piMessage = tagged("role", map[string]fields{
	"system": {"content": byKind(map[kind]check{kindString: str, kindArray: arr(tagged("type", map[string]fields{"text": piText}, partKind))}),
		"sections":     freeObject,
		"toolsAdded":   arr(piTool),
		"toolsRemoved": arr(obj(fields{"name": str})),
		"timestamp":    num},
	"user": {"content": byKind(map[kind]check{kindString: str, kindArray: piUserParts}), "timestamp": num},
	// The assistant's turn as Pi recorded it: what the model answered,
	// with Pi's own bookkeeping (usage, stop reason, diagnostics).
	"assistant": {"content": arr(tagged("type", map[string]fields{
		"text":     piText,
		"thinking": {"thinking": str, "thinkingSignature": str, "redacted": boolean},
		"toolCall": {"id": str, "name": str, "arguments": freeObject, "thoughtSignature": str, "namespace": str, "argumentsError": str},
	}, partKind)),
		"api": str, "provider": str, "model": str, "responseModel": str, "responseId": str,
		"providerThinkingLevel": str, "thinkingLevel": str, "diagnostics": arr(freeObject), "usage": freeObject,
		"stopReason": str, "errorMessage": str, "rawStopReason": str, "endTurn": boolean, "timestamp": num, "durationMs": num,
		"deferred": refused(ReasonProviderState, "a deferred response is a handle to provider-side state")},
	"toolResult": {"toolCallId": str, "toolName": str, "content": piUserParts, "details": free, "usage": freeObject,
		"nestedCalls": freeObject, "isError": boolean, "timestamp": num, "durationMs": num},
}, shapeOf)

var piMessagesBody = obj(fields{
	"model": theModel,
	"context": obj(fields{
		"systemPrompt": str,
		"messages":     arr(piMessage),
		"tools":        arr(piTool),
	}),
	"options": obj(fields{
		"temperature":    num,
		"maxTokens":      num,
		"reasoning":      enum("minimal", "low", "medium", "high", "xhigh"),
		"cacheRetention": enum("none", "short", "long"),
		"sessionId":      str,
		"toolChoice": byKind(map[kind]check{kindString: enum("auto", "none", "required"),
			kindObject: tagged("type", map[string]fields{"function": {"function": obj(fields{"name": str})}}, toolKind)}),
	}),
})
