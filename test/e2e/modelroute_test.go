package e2e

import (
	"strings"
	"sync/atomic"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
)

// The provider key rotated while Pi runs (issue 24): the key changes at
// the provider and in the deployment's secrets between two turns; the
// second turn carries the new one, with nothing restarted, because the
// model route reads the key at every request and the sandbox never had
// it.
func TestPiModelKeyRotation(t *testing.T) {
	e := newEnv(t, fakemodel.Text("before the rotation"), fakemodel.Text("after the rotation"))
	var key atomic.Pointer[string]
	k := apiKey
	key.Store(&k)
	e.secrets = func(deployment, ref string) ([]byte, error) {
		if ref == "alice/fake-llm" {
			return []byte(*key.Load()), nil
		}
		return secrets(deployment, ref)
	}
	sc := e.scene(t, "pi-session", "")
	p := e.launch(t, sc)
	c := ctx(t)
	p.turn(t, c, "first")
	rotated := "sk-e2e-rotated-5e19b2"
	e.mu.Lock()
	e.fm.SetAPIKey(rotated)
	e.mu.Unlock()
	key.Store(&rotated)
	events := p.turn(t, c, "second")
	res := p.stop(t)
	var raw strings.Builder
	for _, f := range events {
		raw.Write(f.Raw)
	}
	if !strings.Contains(raw.String(), "after the rotation") {
		t.Errorf("the turn after the rotation did not get the model's answer: %.400s", raw.String())
	}
	chats := 0
	for _, r := range e.requests() {
		if !r.Authorized {
			t.Errorf("%s %s reached the model without the current key", r.Method, r.Path)
		}
		if strings.HasSuffix(r.Path, "/chat/completions") {
			chats++
		}
	}
	if chats != 2 {
		t.Errorf("%d chat requests, want 2", chats)
	}
	if rs, n := res.Routes["model"], len(e.requests()); rs.Forwarded != int64(n) || rs.Refused != 0 {
		t.Errorf("model route %+v, want the model's %d requests forwarded and none refused", rs, n)
	}
}
