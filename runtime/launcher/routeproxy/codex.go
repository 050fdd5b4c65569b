package routeproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// OpenAI's ChatGPT subscription (Codex), as Pi 1.6.0 speaks it (pi-ai
// api/openai-codex-responses.js): a turn is tried over a WebSocket to
// <baseUrl>/codex/responses first, and when that fails before the stream
// starts Pi sends it as POST <baseUrl>/codex/responses with the JSON body
// compressed by zstd (Content-Encoding: zstd), and keeps to that request
// for the rest of the session. The route refuses every upgrade (so each
// turn is a request it reads), decompresses a zstd body within the body
// limit, checks the result against the body policy and forwards the
// checked value re-encoded and uncompressed, with its own Content-Length:
// the provider accepts an uncompressed body (Pi sends one when its Node
// has no zstd), and a body the route did not compress is the one it
// checked. The bearer and the chatgpt-account-id header are the login's.

// codexAPI is the provider API of Pi's Codex subscription.
const codexAPI = "openai-codex-responses"

// codexClaim is the access token's claim that holds the ChatGPT account.
const codexClaim = "https://api.openai.com/auth"

// errZstdTooLarge: a zstd body that would be larger than the body limit
// once decompressed (or declares a window that large).
var errZstdTooLarge = errors.New("the decompressed body is larger than the route's limit")

// unzstd decompresses body, refusing a frame that declares more than max
// bytes (content or window) before it is decoded, and stopping a frame
// that declares nothing at max+1 decoded bytes: a zstd bomb never expands
// past the limit. Only one frame's worth of memory is held.
func unzstd(body []byte, max int64) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(body); err != nil {
		return nil, err
	}
	if (h.HasFCS && h.FrameContentSize > uint64(max)) || h.WindowSize > uint64(max) {
		return nil, errZstdTooLarge
	}
	dec, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(uint64(max)), zstd.WithDecoderMaxWindow(uint64(max)), zstd.WithDecoderLowmem(true))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	out, err := io.ReadAll(io.LimitReader(dec, max+1))
	if err != nil {
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrFrameSizeExceeded) {
			return nil, errZstdTooLarge
		}
		return nil, err
	}
	if int64(len(out)) > max {
		return nil, errZstdTooLarge
	}
	return out, nil
}

// codexAccount reads the ChatGPT account id from an access token's claim,
// as Pi does (the JWT's payload, not its signature: the provider checks
// that). "" when the token carries none.
func codexAccount(token []byte) string {
	parts := strings.Split(string(token), ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		if payload, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(parts[1], "=")); err != nil {
			return ""
		}
	}
	var claims map[string]json.RawMessage
	if json.Unmarshal(payload, &claims) != nil {
		return ""
	}
	var auth struct {
		Account string `json:"chatgpt_account_id"`
	}
	if json.Unmarshal(claims[codexClaim], &auth) != nil || !plainID(auth.Account) {
		return ""
	}
	return auth.Account
}

// plainID reports whether v is a short identifier: letters, digits and
// - _ . : only, at most 64 of them (a header value with nothing else).
func plainID(v string) bool {
	if v == "" || len(v) > 64 {
		return false
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.:", c)) {
			return false
		}
	}
	return true
}

// codexIdentity passes on the headers Pi sends a Codex turn with besides
// the bearer, the account and the feature header (pi-ai
// api/openai-codex-responses.js buildSSEHeaders): originator "pi", and
// the session's id as session-id and x-client-request-id, each in that
// form only.
func codexIdentity(in, out http.Header) {
	if o := in.Values("Originator"); len(o) == 1 && o[0] == "pi" {
		out.Set("Originator", "pi")
	}
	for _, name := range []string{"Session-Id", "X-Client-Request-Id"} {
		if v := in.Values(name); len(v) == 1 && plainID(v[0]) {
			out.Set(name, v[0])
		}
	}
}
