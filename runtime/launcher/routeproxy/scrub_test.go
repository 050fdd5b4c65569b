package routeproxy

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
)

// scrubKey has characters every escaping changes.
const scrubKey = `sk-live/Key+wi=th&<chars>"0123456789abcdefXYZ`

// echoForm is one way an upstream could spell the key, and how a reader
// of the answer would decode that spelling again.
type echoForm struct {
	name   string
	text   string
	decode func(string) []byte
}

func echoForms(key string) []echoForm {
	var forms []echoForm
	forms = append(forms, echoForm{"raw", key, func(s string) []byte { return []byte(s) }})
	for _, e := range []struct {
		name string
		enc  *base64.Encoding
	}{{"std", base64.StdEncoding}, {"std-nopad", base64.RawStdEncoding}, {"url", base64.URLEncoding}, {"url-nopad", base64.RawURLEncoding}} {
		for a := range 3 {
			plain := append([]byte("xyz"[:a]), key...)
			raw := e.enc.WithPadding(base64.NoPadding)
			forms = append(forms, echoForm{fmt.Sprintf("base64-%s-align%d", e.name, a), e.enc.EncodeToString(plain), func(s string) []byte {
				// Read leniently, as an attacker would: masked characters as A.
				s = strings.TrimRight(strings.Map(func(r rune) rune {
					if r == '*' {
						return 'A'
					}
					return r
				}, s), "=")
				b, _ := raw.DecodeString(s)
				return b
			}})
		}
	}
	forms = append(forms,
		echoForm{"query-escaped", url.QueryEscape(key), func(s string) []byte { u, _ := url.QueryUnescape(s); return []byte(u) }},
		echoForm{"path-escaped", url.PathEscape(key), func(s string) []byte { u, _ := url.PathUnescape(s); return []byte(u) }})
	j, _ := json.Marshal(key)
	forms = append(forms, echoForm{"json-escaped", string(j[1 : len(j)-1]), func(s string) []byte {
		var u string
		_ = json.Unmarshal([]byte(`"`+s+`"`), &u)
		return []byte(u)
	}})
	minimal := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key)
	forms = append(forms, echoForm{"json-minimal", minimal, func(s string) []byte {
		var u string
		_ = json.Unmarshal([]byte(`"`+s+`"`), &u)
		return []byte(u)
	}}, echoForm{"json-slash", strings.ReplaceAll(minimal, "/", `\/`), func(s string) []byte {
		var u string
		_ = json.Unmarshal([]byte(`"`+s+`"`), &u)
		return []byte(u)
	}})
	return forms
}

// leaks reports whether b holds 12 bytes of key in a row.
func leaks(b []byte, key string) bool {
	for i := 0; i+12 <= len(key); i++ {
		if bytes.Contains(b, []byte(key[i:i+12])) {
			return true
		}
	}
	return false
}

// echoDoc is an answer spelling the key every way, each between text,
// and where each spelling is.
func echoDoc(key string) (string, []echoForm, []int) {
	var b strings.Builder
	forms := echoForms(key)
	offs := make([]int, len(forms))
	for i, f := range forms {
		fmt.Fprintf(&b, "data: {\"error\":\"invalid key: ")
		offs[i] = b.Len()
		b.WriteString(f.text)
		b.WriteString("\"}\n\n")
	}
	return b.String(), forms, offs
}

// checkScrubbed fails for any spelling in got that decodes to the key.
func checkScrubbed(t *testing.T, what, got, key string, forms []echoForm, offs []int, sentLen int) {
	t.Helper()
	if len(got) != sentLen {
		t.Fatalf("%s: %d bytes arrived of %d: the masking changed lengths", what, len(got), sentLen)
	}
	for i, f := range forms {
		seg := got[offs[i] : offs[i]+len(f.text)]
		if leaks(f.decode(seg), key) || leaks([]byte(seg), key) {
			t.Errorf("%s: %s: the key passed: %q", what, f.name, seg)
		}
	}
}

// The control: every spelling of the doc decodes to the key where
// nothing masks it.
func TestEchoFormsLeakUnmasked(t *testing.T) {
	doc, forms, offs := echoDoc(scrubKey)
	for i, f := range forms {
		if seg := doc[offs[i] : offs[i]+len(f.text)]; !leaks(f.decode(seg), scrubKey) {
			t.Errorf("%s: the unmasked spelling does not decode to the key (%q)", f.name, seg)
		}
	}
}

// Split at every chunk size, including one byte at a time, every
// spelling is masked, and the stream keeps its length.
func TestScrubBodyAcrossChunks(t *testing.T) {
	doc, forms, offs := echoDoc(scrubKey)
	for _, size := range []int{1, 2, 3, 5, 7, 13, 31, 64, 4096} {
		var n atomic.Int64
		s := newScrubber([]byte(scrubKey), &n)
		chunks := &chunked{data: []byte(doc), size: size}
		b := &scrubBody{s: s, src: io.NopCloser(chunks), readBuf: make([]byte, 32<<10)}
		got, err := io.ReadAll(iotest.OneByteReader(b))
		if err != nil {
			t.Fatal(err)
		}
		checkScrubbed(t, fmt.Sprintf("chunks of %d", size), string(got), scrubKey, forms, offs, len(doc))
		if n.Load() < int64(len(forms)) {
			t.Errorf("chunks of %d: %d spellings counted, want at least %d", size, n.Load(), len(forms))
		}
	}
}

// An SSE event's end is never held back: the bytes of one event pass
// before the next is read.
func TestScrubBodyHoldsOnlyAPrefix(t *testing.T) {
	var n atomic.Int64
	s := newScrubber([]byte(scrubKey), &n)
	for _, c := range []struct {
		tail string
		hold int
	}{{"data: x\n\n", 0}, {"data: " + scrubKey[:10], 10}, {"text sk", 2}, {"text s", 1}, {"text", 0}} {
		if got := s.hold([]byte(c.tail)); got != c.hold {
			t.Errorf("hold(%q) = %d, want %d", c.tail, got, c.hold)
		}
	}
}

// chunked reads data size bytes at a time.
type chunked struct {
	data []byte
	size int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.data[:min(c.size, len(c.data))])
	c.data = c.data[n:]
	return n, nil
}

// A provider that echoes the key it got, in headers and an SSE stream
// split at odd boundaries, reaches the sandbox with every spelling
// masked. Control: the same answer read from the provider directly.
func TestModelRouteScrubsTheKey(t *testing.T) {
	doc, forms, offs := echoDoc(scrubKey)
	up := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.Header().Set("X-Echo", got)
		rw.Header().Set("X-Echo-B64", base64.StdEncoding.EncodeToString([]byte(got)))
		rw.Header().Set("Www-Authenticate", `Bearer error="invalid_token", token="`+url.QueryEscape(got)+`"`)
		rw.WriteHeader(http.StatusUnauthorized)
		d, _, _ := echoDoc(got)
		for i := 0; i < len(d); i += 7 {
			io.WriteString(rw, d[i:min(i+7, len(d))])
			rw.(http.Flusher).Flush()
		}
	})
	w := newModelWorld(t, up, nil)
	k := scrubKey
	w.key.Store(&k)
	resp, body := w.do(t, "POST", "/chat/completions", chatBody, nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d", resp.StatusCode)
	}
	checkScrubbed(t, "through the route", body, scrubKey, forms, offs, len(doc))
	for name, vals := range resp.Header {
		for _, v := range vals {
			b64, _ := base64.StdEncoding.DecodeString(strings.ReplaceAll(v, "*", "A"))
			u, _ := url.QueryUnescape(v)
			if leaks([]byte(v), scrubKey) || leaks(b64, scrubKey) || leaks([]byte(u), scrubKey) {
				t.Errorf("header %s passed the key: %q", name, v)
			}
		}
	}
	if w.proxy.Stats.Scrubbed.Load() < int64(len(forms)+3) {
		t.Errorf("scrubbed %d spellings, want at least %d", w.proxy.Stats.Scrubbed.Load(), len(forms)+3)
	}
	// Control: the provider's answer itself carries the key.
	rec := &httpRecorder{header: http.Header{}}
	req, _ := http.NewRequest("POST", "/", nil)
	req.Header.Set("Authorization", "Bearer "+scrubKey)
	up.ServeHTTP(rec, req)
	if !leaks(rec.body.Bytes(), scrubKey) || !leaks([]byte(rec.header.Get("X-Echo")), scrubKey) {
		t.Fatal("control: the echoing provider does not echo the key")
	}
}

// httpRecorder is a minimal flushing ResponseWriter for the control.
type httpRecorder struct {
	header http.Header
	body   bytes.Buffer
}

func (r *httpRecorder) Header() http.Header         { return r.header }
func (r *httpRecorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *httpRecorder) WriteHeader(int)             {}
func (r *httpRecorder) Flush()                      {}

// An answer in an encoding the route did not ask for (the masking could
// not see the key in it) is refused, not passed on. Control: the gzip
// answer holds the key for a client that decompresses it.
func TestModelRouteRefusesEncodedAnswers(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, `{"error":"bad key `+testModelKey+`"}`)
	zw.Close()
	up := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Encoding", "gzip")
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusUnauthorized)
		rw.Write(gz.Bytes())
	})
	w := newModelWorld(t, up, nil)
	resp, body := w.do(t, "POST", "/chat/completions", chatBody, nil)
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, testModelKey) {
		t.Errorf("gzip answer: %d %q, want 502", resp.StatusCode, body)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if plain, _ := io.ReadAll(zr); !bytes.Contains(plain, []byte(testModelKey)) {
		t.Error("control: the gzip answer does not hold the key")
	}
}
