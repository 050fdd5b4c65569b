package supervisor

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// A refused createSandbox carries every diagnostic the compiler gave, as
// data (PP-* code, fact path, message), the same list a compile of the
// same facts gives, sorted; the secret-looking value in the facts is in
// none of it, and nothing was made.
func TestRefusedDiagnosticsAsData(t *testing.T) {
	f := newFixture(t, 200)
	const secret = "sk-live-Abcdefghijklmnop1234"
	facts, err := testtree.MergePatch(f.sc.Facts, []byte(`{"workspace":{"cwd":"relative/path"},"model":{"baseURL":"http://127.0.0.1:9/v1"},"credential":{"secretRef":"`+secret+`"},"extra":true}`))
	if err != nil {
		t.Fatal(err)
	}
	_, want := compiler.Compile(compiler.Inputs{Facts: schema.Input{Name: "facts.json", Data: facts}, Registry: f.cfg.Registry}, compiler.Options{})
	if len(want) < 3 {
		t.Fatalf("the facts should be refused several times over: %v", want)
	}
	c := f.dial(t)
	err = c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: facts}, nil)
	var e *Error
	if !asError(err, &e) || e.Code != rpcerr.Refused {
		t.Fatalf("createSandbox: %v, want refused", err)
	}
	if diff := cmp.Diff([]byte(mustJSON(t, want.Sorted())), []byte(mustJSON(t, e.Diagnostics))); diff != "" {
		t.Errorf("diagnostics over the socket (-compiler +wire):\n%s", diff)
	}
	for _, d := range e.Diagnostics {
		if !strings.HasPrefix(string(d.Code), "PP-") || d.Message == "" {
			t.Errorf("diagnostic without a PP-* code or message: %+v", d)
		}
	}
	if bytes.Contains([]byte(mustJSON(t, e)), []byte(secret)) || strings.Contains(e.Error(), secret) {
		t.Error("the refusal echoes the secret-looking value")
	}
	var list []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 0 {
		t.Errorf("after the refusal: %v %v", list, err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
