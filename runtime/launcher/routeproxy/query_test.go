package routeproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// A request that lists a fixed query (Pi 1.6.0's Anthropic SDK posts its
// turns to /v1/messages?beta=true) is forwarded with that query as the
// route spells it; any other query on that path, or a query on a path
// that lists none, is out of scope and never reaches the provider.
func TestModelRouteFixedQuery(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	route := apiRoutes["anthropic-messages"]
	route.Requests = []string{"POST /v1/messages?beta=true", "GET /v1/models"}
	w := newModelWorldFor(t, route, upstream, nil)
	w.url = strings.TrimSuffix(w.url, "/v1") // the route's path is the host's root
	body := `{"model":"m-1","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"POST", "/v1/messages?beta=true", 200},
		{"POST", "/v1/messages", 404}, // the route lists the query: the bare path is another request
		{"POST", "/v1/messages?beta=false", 404},
		{"POST", "/v1/messages?beta=true&x=1", 404},
		{"POST", "/v1/messages?x=1&beta=true", 404},
		{"POST", "/v1/messages?beta=%74rue", 404},
		{"POST", "/v1/messages?beta=true#frag", 200}, // a fragment never leaves the client
		{"POST", "/v1/messages?", 404},
		{"POST", "/v1/messages/count_tokens?beta=true", 404},
		{"GET", "/v1/models", 200},
		{"GET", "/v1/models?beta=true", 404},
		{"GET", "/v1/messages?beta=true", 405},
	} {
		b := body
		if c.method == "GET" {
			b = ""
		}
		resp, got := w.do(t, c.method, c.path, b, piHeaders("anthropic-messages"))
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.StatusCode, got, c.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"POST /v1/messages?beta=true", "GET /v1/models", "POST /v1/messages?beta=true"}
	if len(seen) != 3 || seen[0] != want[0] || seen[1] != want[0] || seen[2] != want[1] {
		t.Errorf("the provider saw %q, want the listed requests only: %q twice, then %q", seen, want[0], want[1])
	}
}

// A route whose request names a query that is not one fixed name=value
// is refused when the proxy is made, as the grant's check refuses it.
func TestModelRouteQueryShape(t *testing.T) {
	for _, rq := range []string{"POST /v1/messages?", "POST /v1/messages?beta", "POST /v1/messages?beta=true&x=1",
		"POST /v1/messages?beta=%74rue", "POST /v1/messages?Beta=true", "POST /v1/messages?beta=true?x=y", "POST /v1/messages?beta=tr ue"} {
		route := apiRoutes["anthropic-messages"]
		route.Requests = []string{rq}
		o := ModelOptions{Key: func() ([]byte, error) { return nil, nil },
			Dial: func(context.Context, string, string) (net.Conn, error) {
				return nil, errors.New("no dial in this test")
			}}
		if _, err := NewModel(route, o); err == nil || !strings.Contains(err.Error(), "fixed name=value query") {
			t.Errorf("%q: %v, want the request's shape refused", rq, err)
		}
	}
	// The control: the profile's spelling makes a proxy.
	route := apiRoutes["anthropic-messages"]
	route.Requests = []string{"POST /v1/messages?beta=true"}
	if _, err := NewModel(route, ModelOptions{Key: func() ([]byte, error) { return nil, nil },
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no dial in this test")
		}}); err != nil {
		t.Errorf("the profile's request: %v", err)
	}
}
