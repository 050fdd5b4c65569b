// Package fakemodel is a model provider that answers from a script of
// turns: OpenAI chat completions (POST <base>/chat/completions), OpenAI
// Responses (POST <base>/responses) and Anthropic Messages (POST
// <base>/messages, so Pi's baseUrl is the base without its /v1). It stands
// in for the model provider, which is outside the system under test, when
// end-to-end tests run the real Pi inside the sandbox. Responses and
// Messages stream only (Pi's clients always ask for a stream); their
// events are in apis.go.
//
// Each authorized POST <base>/chat/completions takes the next Turn of the
// script, whatever the request holds (a tool result included); once the
// script is exhausted every request gets a plain "done" text turn. Streaming
// requests get Server-Sent Events in the OpenAI chat.completion.chunk format:
// a role chunk, content or tool_calls deltas, a chunk carrying finish_reason,
// a usage chunk with empty choices, then "data: [DONE]". Every request is
// recorded (Requests) for assertions, including ones refused with 401 because
// the bearer key was wrong or missing: that is how a test proves the launcher
// injected the real secret. The key itself is never logged, echoed or
// recorded.
package fakemodel

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/chunks"
)

// DefaultModel is the model id served when Options.Model is empty.
const DefaultModel = "fake-1"

// DefaultChunks is how many pieces content and each tool call's arguments
// are streamed in when Turn.Chunks is zero.
const DefaultChunks = 3

// maxBody bounds a request body; Pi's requests are far smaller.
const maxBody = 32 << 20

// ToolCall is one function call in an assistant turn.
type ToolCall struct {
	// ID is the tool call id; empty means "call_fake_<n>", n counting from 1
	// over the server's lifetime.
	ID string
	// Name is the tool (function) name, e.g. Pi's "write" or "bash".
	Name string
	// Arguments is the call's arguments: a json.RawMessage is sent verbatim
	// (so a test can send invalid JSON), anything else is JSON-encoded.
	Arguments any
}

// Turn is one scripted assistant response.
type Turn struct {
	// Content is the assistant text; it may be empty when ToolCalls is not.
	Content string
	// ToolCalls are the function calls the assistant makes, in order.
	ToolCalls []ToolCall
	// Chunks is how many pieces Content, and each tool call's argument
	// string, are split into (fewer when the string is shorter); 0 means
	// DefaultChunks.
	Chunks int
	// Delay is the pause before each content or argument piece; a turn with
	// Chunks 50 and Delay 100ms streams for five seconds, long enough for a
	// test to abort it.
	Delay time.Duration
	// FinishReason overrides the finish_reason sent ("stop" for text,
	// "tool_calls" when there are tool calls), e.g. "length".
	FinishReason string
	// Reasoning is thinking streamed before the content, in
	// delta.reasoning_content (as llama.cpp and DeepSeek do); Pi keeps it
	// as a thinking block and sends it back on the assistant message.
	Reasoning string
	// PromptTokens, when not 0, is the prompt (input) token count the
	// turn's usage reports, e.g. a context near the model's window, which
	// makes Pi compact the session after the turn.
	PromptTokens int
}

// Text is a plain text turn.
func Text(s string) Turn { return Turn{Content: s} }

// WriteFile is a turn calling Pi's write tool, which makes Pi write content
// to path.
func WriteFile(path, content string) Turn {
	return Turn{ToolCalls: []ToolCall{{Name: "write", Arguments: map[string]string{"path": path, "content": content}}}}
}

// Bash is a turn calling Pi's bash tool with command.
func Bash(command string) Turn {
	return Turn{ToolCalls: []ToolCall{{Name: "bash", Arguments: map[string]string{"command": command}}}}
}

// Slow is a text turn streamed in chunks pieces over about total, for abort
// tests.
func Slow(s string, chunks int, total time.Duration) Turn {
	if chunks < 1 {
		chunks = 1
	}
	return Turn{Content: s, Chunks: chunks, Delay: total / time.Duration(chunks)}
}

// doneTurn answers every request after the script is exhausted.
var doneTurn = Text("done")

// Options configures a Server.
type Options struct {
	// Script is the turns served, one per authorized chat request.
	Script []Turn
	// Scripts are scripts of their own, by prompt: a request whose last
	// user message's text begins with a key takes the next turn of that
	// key's script (the done turn once it is exhausted), not of Script, so
	// tests that share one model cannot take each other's turns.
	Scripts map[string][]Turn
	// APIKey is the bearer key every request must carry. Empty disables the
	// check (every request counts as authorized).
	APIKey string
	// Model is the model id listed by GET <base>/models and echoed in chunks;
	// empty means DefaultModel.
	Model string
	// BasePath is the path the provider's baseUrl points at; empty means
	// "/v1", so Pi's baseUrl is "http(s)://host:port/v1".
	BasePath string
}

// Recorded is one request as the server saw it.
type Recorded struct {
	At     time.Time
	Method string
	Path   string
	// Authorized reports whether the bearer key matched; false requests were
	// answered 401 and took no turn.
	Authorized bool
	// Status is the HTTP status sent.
	Status int
	// TLS and ServerName: whether the request came over TLS (ServeTLS),
	// and the name the client asked for in its handshake (SNI).
	TLS        bool
	ServerName string
	// Headers are the request's header names, canonical and sorted: what
	// the client (Pi, or the route proxy) chose to send.
	Headers []string
	// Body is the raw request body of a chat request (nil otherwise). It
	// never holds the key: that travels only in the Authorization header.
	Body json.RawMessage
	// Parsed from Body.
	Model    string
	Stream   bool
	Messages int
	LastRole string
	Tools    []string
	// Turn is the index in the script of the turn served, -1 when none was
	// (refused, not a chat request, or the script was exhausted and "done"
	// was served: then Done is true).
	Turn int
	Done bool
	// Completed is set once the whole response, [DONE] included, was written.
	Completed bool
	// Aborted is set when the client went away before the response was
	// complete (Pi's abort closes the connection mid-stream).
	Aborted bool
}

// Server is the fake endpoint. It is safe for concurrent use.
type Server struct {
	opts    Options
	base    string
	model   string
	handler http.Handler

	mu       sync.Mutex
	next     int
	nextFor  map[string]int
	nCall    int
	nComp    int
	reqs     []*Recorded
	servers  []*http.Server
	closed   bool
	changed  chan struct{}
	closedCh chan struct{}
}

// New returns a Server for opts. The script is copied.
func New(opts Options) *Server {
	s := &Server{
		opts:     opts,
		base:     strings.TrimRight(opts.BasePath, "/"),
		model:    opts.Model,
		changed:  make(chan struct{}),
		closedCh: make(chan struct{}),
	}
	s.opts.Script = append([]Turn(nil), opts.Script...)
	s.opts.Scripts = map[string][]Turn{}
	for k, v := range opts.Scripts {
		s.opts.Scripts[k] = append([]Turn(nil), v...)
	}
	if opts.BasePath == "" {
		s.base = "/v1"
	}
	if s.model == "" {
		s.model = DefaultModel
	}
	s.handler = http.HandlerFunc(s.serveHTTP)
	return s
}

// Handler returns the HTTP handler, for httptest or a caller's own server.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves plain HTTP on l until Close.
func (s *Server) Serve(l net.Listener) error {
	srv, err := s.newHTTPServer()
	if err != nil {
		return err
	}
	return ignoreClosed(srv.Serve(l))
}

// ServeTLS serves HTTPS with cert on l until Close.
func (s *Server) ServeTLS(l net.Listener, cert tls.Certificate) error {
	srv, err := s.newHTTPServer()
	if err != nil {
		return err
	}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	return ignoreClosed(srv.ServeTLS(l, "", ""))
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) newHTTPServer() (*http.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, http.ErrServerClosed
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 30 * time.Second}
	s.servers = append(s.servers, srv)
	return srv, nil
}

// Close stops every server started by Serve or ServeTLS, dropping open
// connections. Requests() stays readable.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closedCh)
	srvs := s.servers
	s.servers = nil
	s.mu.Unlock()
	var errs []error
	for _, srv := range srvs {
		if err := srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Requests returns a copy of every request recorded so far, oldest first.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = *r
		out[i].Tools = append([]string(nil), r.Tools...)
		out[i].Headers = append([]string(nil), r.Headers...)
		out[i].Body = append(json.RawMessage(nil), r.Body...)
	}
	return out
}

// WaitFor blocks until cond holds for the recorded requests, ctx ends or
// the server is closed. cond is called with a fresh copy after every change.
func (s *Server) WaitFor(ctx context.Context, cond func([]Recorded) bool) error {
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond(s.Requests()) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closedCh:
			if cond(s.Requests()) {
				return nil
			}
			return http.ErrServerClosed
		}
	}
}

// update applies f to rec under the lock and wakes WaitFor.
func (s *Server) update(rec *Recorded, f func(*Recorded)) {
	s.mu.Lock()
	f(rec)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *Server) record(rec *Recorded) {
	s.mu.Lock()
	s.reqs = append(s.reqs, rec)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// authorized checks the bearer key in constant time. The key is never
// logged or copied anywhere.
func (s *Server) authorized(r *http.Request) (ok, present bool) {
	s.mu.Lock()
	want := s.opts.APIKey
	s.mu.Unlock()
	if want == "" {
		return true, true
	}
	if _, google := s.googleModel(r.URL.Path); google {
		// Google's credential header, on Google's path only.
		k := r.Header.Get("X-Goog-Api-Key")
		return k != "" && subtle.ConstantTimeCompare([]byte(k), []byte(want)) == 1, k != ""
	}
	if k := r.Header.Get("Api-Key"); k != "" && r.URL.Path == s.base+"/responses" {
		// Azure OpenAI's credential header, on the Responses path only.
		return subtle.ConstantTimeCompare([]byte(k), []byte(want)) == 1, true
	}
	if k := r.Header.Get("X-Api-Key"); k != "" && r.URL.Path == s.base+"/messages" {
		// Anthropic's credential header, on Anthropic's path only.
		return subtle.ConstantTimeCompare([]byte(k), []byte(want)) == 1, true
	}
	h := r.Header.Get("Authorization")
	scheme, key, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return false, h != ""
	}
	key = strings.TrimSpace(key)
	return subtle.ConstantTimeCompare([]byte(key), []byte(want)) == 1, true
}

// SetAPIKey makes k the key every request from now on must carry (a key
// rotated at the provider).
func (s *Server) SetAPIKey(k string) {
	s.mu.Lock()
	s.opts.APIKey = k
	s.mu.Unlock()
}

// apiError is OpenAI's error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func strp(s string) *string { return &s }

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	body := apiError{Error: apiErrorBody{Message: msg, Type: typ}}
	if code != "" {
		body.Error.Code = strp(code)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &Recorded{At: time.Now(), Method: r.Method, Path: r.URL.Path, Turn: -1, TLS: r.TLS != nil}
	if r.TLS != nil {
		rec.ServerName = r.TLS.ServerName
	}
	for h := range r.Header {
		rec.Headers = append(rec.Headers, h)
	}
	sort.Strings(rec.Headers)
	ok, present := s.authorized(r)
	rec.Authorized = ok

	chatPath := s.base + "/chat/completions"
	modelsPath := s.base + "/models"

	responsesPath := s.base + "/responses"
	messagesPath := s.base + "/messages"

	googleModel, google := s.googleModel(r.URL.Path)

	var body []byte
	if (r.URL.Path == chatPath || r.URL.Path == responsesPath || r.URL.Path == messagesPath || google) && r.Method == http.MethodPost {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err == nil && len(b) <= maxBody {
			body = b
			rec.Body = json.RawMessage(b)
		}
	}

	if !ok {
		rec.Status = http.StatusUnauthorized
		s.record(rec)
		msg := "Incorrect API key provided."
		code := "invalid_api_key"
		if !present {
			msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
			code = ""
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="fakemodel"`)
		writeError(w, http.StatusUnauthorized, "invalid_request_error", code, msg)
		return
	}

	switch {
	case google:
		s.googleStream(w, r, rec, body, googleModel)
	case r.URL.Path == chatPath:
		if r.Method != http.MethodPost {
			rec.Status = http.StatusMethodNotAllowed
			s.record(rec)
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "Method not allowed.")
			return
		}
		s.chat(w, r, rec, body)
	case r.URL.Path == messagesPath && r.Method == http.MethodPost && isPiMessages(body):
		s.piMessages(w, r, rec, body)
	case (r.URL.Path == responsesPath || r.URL.Path == messagesPath) && r.Method == http.MethodPost:
		s.streamAPI(w, r, rec, body)
	case r.URL.Path == modelsPath || strings.HasPrefix(r.URL.Path, modelsPath+"/"):
		if r.Method != http.MethodGet {
			rec.Status = http.StatusMethodNotAllowed
			s.record(rec)
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "Method not allowed.")
			return
		}
		s.models(w, r, rec)
	default:
		rec.Status = http.StatusNotFound
		s.record(rec)
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path))
	}
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) models(w http.ResponseWriter, r *http.Request, rec *Recorded) {
	m := modelObject{ID: s.model, Object: "model", Created: 1700000000, OwnedBy: "fakemodel"}
	w.Header().Set("Content-Type", "application/json")
	if id, ok := strings.CutPrefix(r.URL.Path, s.base+"/models/"); ok {
		if id != s.model {
			rec.Status = http.StatusNotFound
			s.record(rec)
			writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", fmt.Sprintf("The model `%s` does not exist.", id))
			return
		}
		rec.Status = http.StatusOK
		rec.Completed = true
		s.record(rec)
		_ = json.NewEncoder(w).Encode(m)
		return
	}
	rec.Status = http.StatusOK
	rec.Completed = true
	s.record(rec)
	_ = json.NewEncoder(w).Encode(struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", []modelObject{m}})
}

// chatRequest is the part of a chat-completions request the server reads.
type chatRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// lastUserText is the text of the request's last user message (a string,
// or the text parts of an array).
func (req *chatRequest) lastUserText() string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != "user" {
			continue
		}
		var str string
		if json.Unmarshal(m.Content, &str) == nil {
			return str
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(m.Content, &parts)
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	return ""
}

// take returns the next turn for a request whose last user message is
// prompt, its script index (-1 for the "done" turn) and the count of
// completions.
func (s *Server) take(prompt string) (Turn, int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nComp++
	keys := make([]string, 0, len(s.opts.Scripts))
	for k := range s.opts.Scripts {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the longest matching key wins, whatever the map's order
	best := ""
	for _, k := range keys {
		if strings.HasPrefix(prompt, k) && len(k) > len(best) {
			best = k
		}
	}
	if best != "" {
		script := s.opts.Scripts[best]
		if s.nextFor == nil {
			s.nextFor = map[string]int{}
		}
		if i := s.nextFor[best]; i < len(script) {
			s.nextFor[best]++
			return script[i], i, s.nComp
		}
		return doneTurn, -1, s.nComp
	}
	if s.next < len(s.opts.Script) {
		i := s.next
		s.next++
		return s.opts.Script[i], i, s.nComp
	}
	return doneTurn, -1, s.nComp
}

func (s *Server) callID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nCall++
	return fmt.Sprintf("call_fake_%d", s.nCall)
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request, rec *Recorded, body []byte) {
	var req chatRequest
	if body == nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "Request body too large or unreadable.")
		return
	}
	if err := json.Unmarshal(body, &req); err != nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "We could not parse the JSON body of your request.")
		return
	}
	rec.Model = req.Model
	rec.Stream = req.Stream
	rec.Messages = len(req.Messages)
	if n := len(req.Messages); n > 0 {
		rec.LastRole = req.Messages[n-1].Role
	}
	for _, t := range req.Tools {
		rec.Tools = append(rec.Tools, t.Function.Name)
	}

	turn, idx, n := s.take(req.lastUserText())
	rec.Turn = idx
	rec.Done = idx < 0
	rec.Status = http.StatusOK
	s.record(rec)

	calls, err := s.buildCalls(turn)
	if err != nil {
		// A script error is the test's bug: say so loudly in the response.
		s.update(rec, func(r *Recorded) { r.Status = http.StatusInternalServerError })
		writeError(w, http.StatusInternalServerError, "server_error", "", "fakemodel script: "+err.Error())
		return
	}
	id := fmt.Sprintf("chatcmpl-fake%06d", n)
	created := time.Now().Unix()
	model := s.model
	usage := usageFor(req, turn, calls)
	if !req.Stream {
		s.respondWhole(w, r, rec, id, created, model, turn, calls, usage)
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	s.stream(w, r, rec, id, created, model, turn, calls, usage, includeUsage)
}

type builtCall struct {
	id, name, args string
}

func (s *Server) buildCalls(t Turn) ([]builtCall, error) {
	var out []builtCall
	for i, c := range t.ToolCalls {
		if c.Name == "" {
			return nil, fmt.Errorf("tool call %d has no name", i)
		}
		var args string
		switch a := c.Arguments.(type) {
		case json.RawMessage:
			args = string(a)
		case nil:
			args = "{}"
		default:
			b, err := json.Marshal(a)
			if err != nil {
				return nil, fmt.Errorf("tool call %d arguments: %w", i, err)
			}
			args = string(b)
		}
		id := c.ID
		if id == "" {
			id = s.callID()
		}
		out = append(out, builtCall{id: id, name: c.Name, args: args})
	}
	return out, nil
}

func finishReason(t Turn, calls []builtCall) string {
	if t.FinishReason != "" {
		return t.FinishReason
	}
	if len(calls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

// Usage is OpenAI's usage object.
type Usage struct {
	PromptTokens            int                 `json:"prompt_tokens"`
	CompletionTokens        int                 `json:"completion_tokens"`
	TotalTokens             int                 `json:"total_tokens"`
	PromptTokensDetails     *promptTokenDetails `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *compTokenDetails   `json:"completion_tokens_details,omitempty"`
}

type promptTokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
	AudioTokens  int `json:"audio_tokens"`
}

type compTokenDetails struct {
	ReasoningTokens          int `json:"reasoning_tokens"`
	AudioTokens              int `json:"audio_tokens"`
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}

// usageFor makes deterministic token counts: about four bytes a token.
func usageFor(req chatRequest, t Turn, calls []builtCall) Usage {
	out := len(t.Content)
	for _, c := range calls {
		out += len(c.name) + len(c.args)
	}
	u := Usage{
		PromptTokens:            10 * max(1, len(req.Messages)),
		CompletionTokens:        max(1, out/4),
		PromptTokensDetails:     &promptTokenDetails{},
		CompletionTokensDetails: &compTokenDetails{},
	}
	if t.PromptTokens != 0 {
		u.PromptTokens = t.PromptTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// The streaming chunk, field for field as OpenAI sends it.
type chunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int             `json:"index"`
	Delta        delta           `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type delta struct {
	Role      string          `json:"role,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	Refusal   json.RawMessage `json:"refusal,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
	Reasoning string          `json:"reasoning_content,omitempty"`
}

type toolCallDelta struct {
	Index    int           `json:"index"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function functionDelta `json:"function"`
}

type functionDelta struct {
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

var jsonNull = json.RawMessage("null")

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

const fingerprint = "fp_fakemodel"

// stream writes the turn as SSE, pausing t.Delay before each piece and
// stopping as soon as the client goes away.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, rec *Recorded, id string, created int64, model string, t Turn, calls []builtCall, usage Usage, includeUsage bool) {
	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Request-Id", "req_"+id)
	w.WriteHeader(http.StatusOK)

	var usageNull json.RawMessage
	if includeUsage {
		usageNull = jsonNull
	}
	ctx := r.Context()
	aborted := func() {
		s.update(rec, func(r *Recorded) { r.Aborted = true })
	}
	send := func(c chunk) bool {
		b, err := json.Marshal(c)
		if err != nil {
			panic(err) // fixed types: cannot fail
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return ctx.Err() == nil
	}
	mk := func(d delta, finish *string) chunk {
		return chunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			SystemFingerprint: fingerprint,
			Choices:           []chunkChoice{{Index: 0, Delta: d, Logprobs: jsonNull, FinishReason: finish}},
			Usage:             usageNull,
		}
	}
	wait := func() bool {
		if t.Delay <= 0 {
			return ctx.Err() == nil
		}
		timer := time.NewTimer(t.Delay)
		defer timer.Stop()
		select {
		case <-timer.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	n := t.Chunks
	if n <= 0 {
		n = DefaultChunks
	}

	// Role chunk: content "" for a text turn, null when the turn is only
	// tool calls (as OpenAI does), tool call headers riding on it then.
	first := delta{Role: "assistant", Refusal: jsonNull}
	if t.Content != "" || len(calls) == 0 {
		first.Content = jsonString("")
	} else {
		first.Content = jsonNull
	}
	if !send(mk(first, nil)) {
		aborted()
		return
	}
	for _, piece := range chunks.Split(t.Reasoning, n) {
		if !wait() || !send(mk(delta{Reasoning: piece}, nil)) {
			aborted()
			return
		}
	}
	for _, piece := range chunks.Split(t.Content, n) {
		if !wait() || !send(mk(delta{Content: jsonString(piece)}, nil)) {
			aborted()
			return
		}
	}
	for i, c := range calls {
		empty := ""
		head := toolCallDelta{Index: i, ID: c.id, Type: "function", Function: functionDelta{Name: c.name, Arguments: &empty}}
		if !send(mk(delta{ToolCalls: []toolCallDelta{head}}, nil)) {
			aborted()
			return
		}
		for _, piece := range chunks.Split(c.args, n) {
			p := piece
			if !wait() || !send(mk(delta{ToolCalls: []toolCallDelta{{Index: i, Function: functionDelta{Arguments: &p}}}}, nil)) {
				aborted()
				return
			}
		}
	}
	fr := finishReason(t, calls)
	if !send(mk(delta{}, &fr)) {
		aborted()
		return
	}
	ub, _ := json.Marshal(usage)
	if !send(chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
		SystemFingerprint: fingerprint, Choices: []chunkChoice{}, Usage: ub}) {
		aborted()
		return
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil || ctx.Err() != nil {
		aborted()
		return
	}
	if flusher != nil {
		flusher.Flush()
	}
	s.update(rec, func(r *Recorded) { r.Completed = true })
}

// respondWhole answers a non-streaming request with one chat.completion.
func (s *Server) respondWhole(w http.ResponseWriter, r *http.Request, rec *Recorded, id string, created int64, model string, t Turn, calls []builtCall, usage Usage) {
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type tc struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	type message struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		Refusal   json.RawMessage `json:"refusal"`
		ToolCalls []tc            `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int             `json:"index"`
		Message      message         `json:"message"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	}
	msg := message{Role: "assistant", Content: jsonNull, Refusal: jsonNull}
	if t.Content != "" || len(calls) == 0 {
		msg.Content = jsonString(t.Content)
	}
	for _, c := range calls {
		msg.ToolCalls = append(msg.ToolCalls, tc{ID: c.id, Type: "function", Function: fn{Name: c.name, Arguments: c.args}})
	}
	body := struct {
		ID                string   `json:"id"`
		Object            string   `json:"object"`
		Created           int64    `json:"created"`
		Model             string   `json:"model"`
		SystemFingerprint string   `json:"system_fingerprint"`
		Choices           []choice `json:"choices"`
		Usage             Usage    `json:"usage"`
	}{id, "chat.completion", created, model, fingerprint,
		[]choice{{Index: 0, Message: msg, Logprobs: jsonNull, FinishReason: finishReason(t, calls)}}, usage}
	if t.Delay > 0 {
		timer := time.NewTimer(t.Delay)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			s.update(rec, func(r *Recorded) { r.Aborted = true })
			return
		}
	}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(body)
	w.Header().Set("Content-Type", "application/json")
	if _, err := w.Write(buf.Bytes()); err != nil {
		s.update(rec, func(r *Recorded) { r.Aborted = true })
		return
	}
	s.update(rec, func(r *Recorded) { r.Completed = true })
}
