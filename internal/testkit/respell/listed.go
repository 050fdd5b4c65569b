package respell

import (
	"fmt"
	"strings"
)

// Listed is the hand-made corpus, family by family.
func Listed() []Spelling {
	var out []Spelling
	add := func(family, name, ct string, body any) {
		var b []byte
		switch v := body.(type) {
		case string:
			b = []byte(v)
		case []byte:
			b = v
		}
		out = append(out, Spelling{family, name, ct, b})
	}
	ca, ct := Attacks[0], Attacks[1]

	// keys: case variants and escapes of keys, next to the exact key (a
	// duplicate only to a case-insensitive reader) or alone.
	for _, k := range []string{"Name", "NAME", "nAME", "naMe", `N\u0061ME`, `\u004eame`, `\u004E\u0041\u004D\u0045`, `n\u0041me`} {
		add("keys", "cover-last-"+k, jsonType, respelled("", "1", k, true, ca))
		add("keys", "cover-first-"+k, jsonType, respelled("", "1", k, false, ct))
	}
	add("keys", "variant-alone-attack", jsonType, call("", "1", member{"NAME", quote(ca.Tool)}, member{"arguments", ca.Args}))
	add("keys", "variant-alone-cover", jsonType, call("", "1", member{"Name", quote(Cover)}, member{"arguments", "{}"}))
	add("keys", "escaped-exact", jsonType, call("", "1", member{`n\u0061me`, quote(Cover)}, member{`\u0061rguments`, "{}"}))
	for _, top := range []struct{ name, key, value string }{
		{"Method-ping", "Method", `"ping"`}, {"METHOD-tools-list", "METHOD", `"tools/list"`},
		{"Params-cover", "Params", object("", member{"name", quote(Cover)})},
		{"PARAMS-cover", "PARAMS", object("", member{"name", quote(Cover)})},
		{"JSONRPC", "JSONRPC", `"2.0"`}, {"ID", "ID", "2"},
	} {
		add("keys", "top-"+top.name, jsonType, object("", member{"jsonrpc", `"2.0"`}, member{"id", "1"}, member{"method", `"tools/call"`},
			member{"params", object("", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args})}, member{top.key, top.value}))
	}
	add("keys", "method-case-only", jsonType, object("", member{"jsonrpc", `"2.0"`}, member{"id", "1"}, member{"Method", `"tools/call"`}, member{"params", object("", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args})}))
	add("keys", "method-value-escaped", jsonType, message("", "1", `tools\/c\u0061ll`, object("", member{"name", quote(Cover)}, member{"arguments", "{}"})))
	add("keys", "tool-value-escaped", jsonType, call("", "1", member{"name", `"list\u005fagents"`}, member{"arguments", "{}"}))

	// duplicates: the same key twice, as written or after unescaping.
	add("duplicates", "name-cover-last", jsonType, call("", "1", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args}, member{"name", quote(Cover)}))
	add("duplicates", "name-attack-last", jsonType, call("", "1", member{"name", quote(Cover)}, member{"arguments", ca.Args}, member{"name", quote(ca.Tool)}))
	add("duplicates", "name-escaped", jsonType, call("", "1", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args}, member{`n\u0061me`, quote(Cover)}))
	add("duplicates", "params", jsonType, object("", member{"jsonrpc", `"2.0"`}, member{"id", "1"}, member{"method", `"tools/call"`},
		member{"params", object("", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args})}, member{"params", object("", member{"name", quote(Cover)})}))
	add("duplicates", "method", jsonType, object("", member{"jsonrpc", `"2.0"`}, member{"id", "1"}, member{"method", `"tools/call"`}, member{"method", `"ping"`},
		member{"params", object("", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args})}))
	add("duplicates", "id", jsonType, object("", member{"jsonrpc", `"2.0"`}, member{"id", "1"}, member{"id", "2"}, member{"method", `"tools/call"`}, member{"params", object("", member{"name", quote(Cover)}, member{"arguments", "{}"})}))
	add("duplicates", "arguments-member", jsonType, call("", "1", member{"name", quote(Cover)}, member{"arguments", `{"limit":1,"limit":2}`}))

	// charset: the Content-Type's charset, which body-parser honours.
	for _, c := range []struct{ name, ct string }{{"utf-7", "application/json; charset=utf-7"}, {"UTF-7", "application/json;charset=UTF-7"}, {"quoted-utf-7", `application/json; charset="utf-7"`}} {
		add("charset", "smuggled-"+c.name, c.ct, smuggled("", "1", "name", ca, false))
	}
	add("charset", "smuggled-utf-7-imap", "application/json; charset=utf-7-imap", smuggled("", "1", "name", ct, true))
	add("charset", "smuggled-utf-8", "application/json; charset=utf-8", smuggled("", "1", "name", ca, false))
	add("charset", "smuggled-no-charset", jsonType, smuggled("", "1", "name", ca, false))
	add("charset", "ascii-as-utf-16le", "application/json; charset=utf-16le", coverCall("", "1"))
	add("charset", "utf-16le-cover", "application/json; charset=utf-16le", UTF16(coverCall("", "1"), false, false))
	add("charset", "utf-16be-attack", "application/json; charset=utf-16be", UTF16(plainAttack("", "1", ca), true, false))
	add("charset", "utf-16-cover", "application/json; charset=utf-16", UTF16(coverCall("", "1"), false, false))
	add("charset", "utf-32-cover", "application/json; charset=utf-32", UTF32LE(coverCall("", "1")))
	add("charset", "latin1-cover", "application/json; charset=latin1", []byte(strings.Replace(coverCall("", "1"), "{}", "{\"cwd\":\"/caf\xe9\"}", 1)))
	add("charset", "iso-8859-1-attack", "application/json; charset=iso-8859-1", plainAttack("", "1", ca))
	add("charset", "utf8-unhyphenated", "application/json; charset=utf8", coverCall("", "1"))
	add("charset", "two-charsets", "application/json; charset=utf-8; charset=utf-7", smuggled("", "1", "name", ca, false))

	// bom: byte order marks, which body-parser's decoder strips.
	bom8 := "\xef\xbb\xbf"
	add("bom", "utf-8-bom-cover", jsonType, bom8+coverCall("", "1"))
	add("bom", "utf-8-bom-attack", jsonType, bom8+plainAttack("", "1", ca))
	add("bom", "utf-8-bom-respelled", jsonType, bom8+respelled("", "1", "NAME", true, ca))
	add("bom", "utf-8-bom-after-space", jsonType, " "+bom8+coverCall("", "1"))
	add("bom", "utf-16le-bom-cover", "application/json; charset=utf-16", UTF16(coverCall("", "1"), false, true))
	add("bom", "utf-16be-bom-attack", "application/json; charset=utf-16", UTF16(plainAttack("", "1", ca), true, true))
	add("bom", "utf-16le-bom-as-utf-8", jsonType, UTF16(coverCall("", "1"), false, true))
	add("bom", "utf-7-bom-cover", "application/json; charset=utf-7", "+/v8-"+coverCall("", "1"))
	add("bom", "bom-in-key", jsonType, call("", "1", member{"name", quote(Cover)}, member{`\ufeffname`, quote(ca.Tool)}, member{"arguments", "{}"}))

	// whitespace: JSON's four, and characters that are whitespace elsewhere.
	for _, w := range []struct{ name, sp string }{{"none", ""}, {"space", " "}, {"tab", "\t"}, {"crlf", "\r\n"}, {"mixed", "\n\n\t  "}} {
		add("whitespace", w.name+"-cover", jsonType, coverCall(w.sp, "1"))
		add("whitespace", w.name+"-respelled", jsonType, respelled(w.sp, "1", "Name", true, ca))
	}
	add("whitespace", "leading-trailing", jsonType, " \r\n\t"+coverCall("", "1")+"\n\t \r")
	for _, w := range []struct{ name, sp string }{{"formfeed", "\f"}, {"vtab", "\v"}, {"nbsp", "\u00a0"}, {"line-separator", "\u2028"}, {"nul", "\x00"}} {
		add("whitespace", w.name, jsonType, coverCall(w.sp, "1"))
	}

	// batch: several messages in one body.
	add("batch", "two-covers", jsonType, batch("", coverCall("", "1"), coverCall("", "2")))
	add("batch", "cover-then-respelled", jsonType, batch("", coverCall("", "1"), respelled("", "2", "NAME", true, ca)))
	add("batch", "respelled-alone", jsonType, batch("", respelled("", "1", "Name", true, ct)))
	add("batch", "cover-then-plain-attack", jsonType, batch("", coverCall("", "1"), plainAttack("", "2", ca)))
	add("batch", "cover-then-smuggled", "application/json; charset=utf-7", batch("", coverCall("", "1"), smuggled("", "2", "name", ca, false)))
	add("batch", "nested", jsonType, batch("", batch("", coverCall("", "1"))))
	add("batch", "nested-attack", jsonType, batch("", coverCall("", "1"), batch("", plainAttack("", "2", ca))))
	add("batch", "empty", jsonType, "[]")
	add("batch", "cover-and-notification", jsonType, batch("", coverCall("", "1"), `{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	add("batch", "attack-as-notification", jsonType, batch("", coverCall("", "1"), `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"create_agent","arguments":`+ca.Args+`}}`))
	many := make([]string, 33)
	for i := range many {
		many[i] = coverCall("", fmt.Sprint(i+1))
	}
	add("batch", "33-covers", jsonType, batch("", many...))

	// numbers: ids a JSON reader may take apart differently.
	for _, id := range []string{"1.0", "1e0", "1E+0", "-0", "0.1e1", "9007199254740993", "123456789012345678901234567890", "1e400", `"1"`, `""`, "null", "true"} {
		add("numbers", "id-"+id, jsonType, coverCall("", id))
	}
	add("numbers", "id-1.0-plain-attack", jsonType, plainAttack("", "1.0", ca))
	add("numbers", "argument-numbers", jsonType, call("", "1", member{"name", quote(Cover)}, member{"arguments", `{"limit":1e0,"sinceHours":2.0e1}`}))

	// unicode: surrogates, NUL, invalid and overlong UTF-8, look-alikes.
	for _, u := range []struct{ name, tool string }{
		{"cover-lone-surrogate", `list_agents\ud800`}, {"attack-lone-surrogate", `create_agent\udfff`},
		{"cover-nul-escape", `list_agents\u0000`}, {"attack-nul-escape", `create_agent\u0000`},
		{"cover-invalid-utf8", "list_agents\xff"}, {"attack-invalid-utf8", "create_agent\xfe"},
		{"cover-overlong-underscore", "list\xc1\x9fagents"}, {"cover-replacement-char", "list_agents\ufffd"},
		{"cover-cyrillic-a", "list_\u0430gents"}, {"cover-fullwidth", "\uff4cist_agents"},
		{"cover-surrogate-pair", `list_agents\ud83d\ude00`},
	} {
		add("unicode", u.name, jsonType, call("", "1", member{"name", quote(u.tool)}, member{"arguments", "{}"}))
	}
	add("unicode", "folded-top-key", jsonType, object("", member{"jsonrpc", `"2.0"`}, member{"id", "1"}, member{"method", `"tools/call"`},
		member{"params", object("", member{"name", quote(ca.Tool)}, member{"arguments", ca.Args})}, member{"param\u017f", object("", member{"name", quote(Cover)})}))
	add("unicode", "kelvin-in-key", jsonType, call("", "1", member{"name", quote(Cover)}, member{"arguments", `{"\u212aey":"v"}`}))
	add("unicode", "invalid-utf8-key", jsonType, call("", "1", member{"name", quote(Cover)}, member{"n\xffame", quote(ca.Tool)}, member{"arguments", "{}"}))
	add("unicode", "raw-nul-in-string", jsonType, call("", "1", member{"name", quote("list_agents\x00")}, member{"arguments", "{}"}))
	add("unicode", "overlong-slash-in-method", jsonType, message("", "1", "tools\xc0\xafcall", object("", member{"name", quote(Cover)}, member{"arguments", "{}"})))
	add("unicode", "lone-surrogate-argument", jsonType, call("", "1", member{"name", quote(Cover)}, member{"arguments", `{"cwd":"\udc00"}`}))

	// nesting: deep values in the arguments and deep batches.
	for _, d := range []int{8, 48, 64, 1000, 9999, 10001, 60000} {
		pad := strings.Repeat("[", d) + strings.Repeat("]", d)
		add("nesting", fmt.Sprintf("arguments-depth-%d", d), jsonType, call("", "1", member{"name", quote(Cover)}, member{"arguments", `{"pad":` + pad + `}`}))
	}
	add("nesting", "batch-depth-100", jsonType, strings.Repeat("[", 100)+coverCall("", "1")+strings.Repeat("]", 100))

	// size: around body-parser's 100 kB limit and the proxy's 1 MiB.
	for _, n := range []int{100 << 10, 100<<10 + 1, 1<<20 - 1, 1 << 20, 1<<20 + 1} {
		add("size", fmt.Sprintf("string-pad-%d", n), jsonType, padded(n, false))
		add("size", fmt.Sprintf("space-pad-%d", n), jsonType, padded(n, true))
	}
	return out
}

// padded is a cover call of exactly n bytes, padded inside a string
// argument or with trailing whitespace.
func padded(n int, space bool) string {
	if space {
		c := coverCall("", "1")
		return c + strings.Repeat(" ", max(0, n-len(c)))
	}
	c := call("", "1", member{"name", quote(Cover)}, member{"arguments", `{"cwd":""}`})
	return strings.Replace(c, `"cwd":""`, `"cwd":"`+strings.Repeat("a", max(0, n-len(c)))+`"`, 1)
}
