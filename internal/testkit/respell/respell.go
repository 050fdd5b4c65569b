// Package respell is the corpus of the route proxy's differential tests
// (issue 18): one JSON-RPC tools/call spelled many ways, so that a reader
// of the bytes other than the proxy's (Paseo's daemon: body-parser with its
// charset handling, JavaScript's case-sensitive keys and last of duplicate
// keys, the MCP SDK's schemas) may see another tool than the proxy checked.
//
// Each spelling pairs an in-scope call (Cover, list_agents) with an
// out-of-scope one (one of Attacks) where the family allows, so that a
// reader that goes wrong runs the out-of-scope tool. Listed spellings cover
// each family by hand; Generated combines the mutations.
package respell

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
	"unicode/utf16"
)

// Spelling is one request body with its Content-Type.
type Spelling struct {
	Family, Name string
	ContentType  string
	Body         []byte
}

// Families in the order the tests report them. Keys and charset are the
// two the hostile agent of issue 18 found (key spellings, body encodings);
// batch and generated carry their mutations too. The rest cover what else
// two JSON readers may disagree on.
var Families = []string{"keys", "duplicates", "charset", "bom", "whitespace", "batch", "numbers", "unicode", "nesting", "size", "generated"}

// Attacking are the families some spelling of which must run an
// out-of-scope tool through a proxy that forwards the agent's own bytes:
// if none does, the corpus proves nothing against the product.
var Attacking = []string{"keys", "charset", "batch", "generated"}

// Cover is the in-scope tool a spelling shows the proxy.
const Cover = "list_agents"

// Attack is an out-of-scope tool of Paseo's catalog with arguments its
// schema accepts, so a call that reaches the daemon's handler runs.
type Attack struct{ Tool, Args string }

// Attacks are tools that run outside the sandbox: an unsandboxed agent, a
// host shell, keys typed into it, another agent killed.
var Attacks = []Attack{
	{"create_agent", `{"title":"helper","provider":"codex/gpt-5.4","initialPrompt":"work outside the sandbox"}`},
	{"create_terminal", `{"cwd":"/"}`},
	{"send_terminal_keys", `{"terminalId":"t1","keys":"id\r"}`},
	{"kill_agent", `{"agentId":"agent-other"}`},
}

const jsonType = "application/json"

// member is one object member: the key as written between its quotes (so
// escapes and case stay the caller's) and the raw JSON value.
type member struct{ key, value string }

// object writes members in order, sp between every token.
func object(sp string, ms ...member) string {
	var b strings.Builder
	b.WriteString("{")
	for i, m := range ms {
		if i > 0 {
			b.WriteString(sp + ",")
		}
		b.WriteString(sp + `"` + m.key + `"` + sp + ":" + sp + m.value)
	}
	b.WriteString(sp + "}")
	return b.String()
}

func quote(s string) string { return `"` + s + `"` }

// message is a request with the given id, method and raw params.
func message(sp, id, method, params string) string {
	return object(sp, member{"jsonrpc", `"2.0"`}, member{"id", id}, member{"method", quote(method)}, member{"params", params})
}

func call(sp, id string, params ...member) string {
	return message(sp, id, "tools/call", object(sp, params...))
}

// Control is the plain in-scope call the product must still run.
func Control() Spelling {
	return Spelling{"control", "list_agents", jsonType, []byte(coverCall("", "1"))}
}

func coverCall(sp, id string) string {
	return call(sp, id, member{"name", quote(Cover)}, member{"arguments", "{}"})
}

func plainAttack(sp, id string, a Attack) string {
	return call(sp, id, member{"name", quote(a.Tool)}, member{"arguments", a.Args})
}

// respelled is a call naming the attack under "name" and the cover under
// key, which a reader matching keys case-insensitively (Go's
// encoding/json) takes for name too; coverLast puts the cover after, where
// such a reader takes it for the last name.
func respelled(sp, id, key string, coverLast bool, a Attack) string {
	atk := []member{{"name", quote(a.Tool)}, {"arguments", a.Args}}
	cov := member{key, quote(Cover)}
	if coverLast {
		return call(sp, id, append(atk, cov)...)
	}
	return call(sp, id, append([]member{cov}, atk...)...)
}

// smuggled is a cover call whose arguments hold a string that, in UTF-7
// (or UTF-7-IMAP), closes the arguments and names the attack: plain ASCII
// to a reader that ignores the charset, a second name and arguments to one
// that honours it (body-parser), where the last of each wins.
func smuggled(sp, id, key string, a Attack, imap bool) string {
	hidden := `"},"name":"` + a.Tool + `","arguments":` + a.Args + `,"_meta":{"y":"`
	return call(sp, id, member{key, quote(Cover)}, member{"arguments", object(sp, member{"x", quote(UTF7(hidden, imap))})})
}

// UTF7 encodes s as one shifted run of UTF-7 (RFC 2152: "+", base64 of
// UTF-16BE without padding, "-"), or of IMAP's modified UTF-7 (RFC 3501:
// "&" and "," for "/").
func UTF7(s string, imap bool) string {
	var raw []byte
	for _, u := range utf16.Encode([]rune(s)) {
		raw = binary.BigEndian.AppendUint16(raw, u)
	}
	enc := base64.RawStdEncoding.EncodeToString(raw)
	if imap {
		return "&" + strings.ReplaceAll(enc, "/", ",") + "-"
	}
	return "+" + enc + "-"
}

// UTF16 encodes s in UTF-16, little- or big-endian, with an optional BOM.
func UTF16(s string, big, bom bool) []byte {
	var order binary.AppendByteOrder = binary.LittleEndian
	if big {
		order = binary.BigEndian
	}
	var out []byte
	if bom {
		out = order.AppendUint16(out, 0xFEFF)
	}
	for _, u := range utf16.Encode([]rune(s)) {
		out = order.AppendUint16(out, u)
	}
	return out
}

// UTF32LE encodes s in UTF-32, little-endian.
func UTF32LE(s string) []byte {
	var out []byte
	for _, r := range s {
		out = binary.LittleEndian.AppendUint32(out, uint32(r))
	}
	return out
}

func batch(sp string, msgs ...string) string {
	return "[" + sp + strings.Join(msgs, sp+","+sp) + sp + "]"
}
