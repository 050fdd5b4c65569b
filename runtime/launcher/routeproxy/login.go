package routeproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The subscription login broker (credential mode oauth-broker). The
// login (Pi's auth.json entry: access token, refresh token, expiry) stays
// in the deployment's auth.json on the host; the sandbox's Pi holds
// bundle.ModelLoginPlaceholder. For each routed request the route reads
// the entry, and when it is about to expire refreshes it at the
// provider's token endpoint itself and writes the new tokens back, so
// the daemon's own Pi on the host, which reads the same file, stays
// logged in. Pi 1.6.0 (pi-coding-agent core/auth-storage.js) guards
// auth.json with proper-lockfile: a directory <auth.json>.lock made with
// mkdir, taken as stale when its mtime is older than 10 s (a synchronous
// lock) or 30 s (the lock it refreshes under), and kept fresh by its
// holder. The broker takes the same lock the same way, keeps its mtime
// fresh while it holds it, and decides under it whether to refresh (the
// entry may have been refreshed meanwhile, by the host's Pi or another
// sandbox's route), so one deployment's sandboxes share one refresh and
// no refresh token is spent twice.

// LoginMinValidity is how long an access token must still be valid to
// be used without a refresh: Pi's own margin (pi-ai auth/resolve.js
// DEFAULT_OAUTH_MINIMUM_VALIDITY_MS), so the host's Pi and the route
// agree on when a token needs one.
const LoginMinValidity = 5 * time.Minute

// loginExpiryMargin is what Pi subtracts from the provider's expires_in
// when it stores a refreshed login (pi-ai auth/oauth/anthropic.js).
const loginExpiryMargin = 5 * time.Minute

// loginLockStale is the age past which a lock directory is another
// holder's that died: Pi's longer stale time, so a live Pi holder
// (which refreshes its lock's mtime at half of it) is never taken over.
const loginLockStale = 30 * time.Second

// loginLockWait bounds the wait for another holder's lock.
const loginLockWait = 30 * time.Second

// loginFileBytes bounds the auth.json the broker reads.
const loginFileBytes = 64 << 10

// loginRefreshTimeout is Pi's timeout for a refresh request
// (DEFAULT_OAUTH_REFRESH_TIMEOUT_MS).
const loginRefreshTimeout = 15 * time.Second

// anthropicClientID is the public OAuth client id Pi 1.6.0 logs in and
// refreshes with for Anthropic's subscription (pi-ai
// auth/oauth/anthropic.js CLIENT_ID): a refresh token is bound to the
// client that obtained it.
const anthropicClientID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"

// codexClientID is the public OAuth client id Pi 1.6.0 logs in and
// refreshes with for OpenAI's ChatGPT subscription (pi-ai
// auth/oauth/openai-codex.js CLIENT_ID).
const codexClientID = "app_EMoamEEZ73f0CkXaXp7hrann"

// ErrLoginRevoked: the token endpoint refused the refresh token (the
// login was revoked, expired or used elsewhere), or the auth.json entry
// is gone. Only a new login on the host helps.
var ErrLoginRevoked = errors.New("the subscription login was refused by the provider's token endpoint or is missing")

// ErrLoginUnavailable: the login could not be read or refreshed now (the
// file, the lock, the token endpoint); a later request may succeed.
var ErrLoginUnavailable = errors.New("the subscription login is not available to the route")

// Login is one brokered subscription login: an auth.json entry on the
// host and the token endpoint it is refreshed at. Nothing of it is
// printed: errors name the entry and the file, never a token.
type Login struct {
	dir     int    // the auth.json's directory, by descriptor
	dirPath string // for messages only
	entry   string
	api     string
	refresh *url.URL
	client  *http.Client
	now     func() time.Time
	mu      sync.Mutex // one refresh at a time in this process
	// Refreshes counts the refreshes this route made.
	Refreshes atomic.Int64
}

// OpenLogin opens the login a login model route names: the directory of
// r.LoginFile is opened without following any link (the broker writes
// there as root), and the token endpoint is reached with dial over TLS
// verified against its own name (roots: nil is the system store).
func OpenLogin(r bundle.Route, dial func(ctx context.Context, network, addr string) (net.Conn, error), roots *x509.CertPool) (*Login, error) {
	u, err := url.Parse(r.LoginRefresh)
	switch {
	case grant.ModelLoginAPIs[r.API] == "" || r.Credential != grant.ModelLoginCredential:
		return nil, fmt.Errorf("route %s: API %q has no subscription login the route brokers", r.Purpose, r.API)
	case err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("route %s: the token endpoint must be https://host[:port]/path", r.Purpose)
	case !filepath.IsAbs(r.LoginFile) || filepath.Clean(r.LoginFile) != r.LoginFile || filepath.Base(r.LoginFile) != "auth.json":
		return nil, fmt.Errorf("route %s: the login file must be an absolute, clean path to an auth.json", r.Purpose)
	case r.LoginEntry == "" || dial == nil:
		return nil, fmt.Errorf("route %s: no login entry or dialer", r.Purpose)
	}
	dirPath := filepath.Dir(r.LoginFile)
	fd, err := unix.Openat2(unix.AT_FDCWD, dirPath, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, fmt.Errorf("route %s: the login's directory %s: %w", r.Purpose, dirPath, err)
	}
	tr := &http.Transport{Proxy: nil, DialContext: dial, ForceAttemptHTTP2: false,
		TLSClientConfig:     &tls.Config{RootCAs: roots, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		TLSHandshakeTimeout: 10 * time.Second, MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}
	client := &http.Client{Transport: tr, Timeout: loginRefreshTimeout,
		// The endpoint is the one the grant names: a redirect is refused.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Login{dir: fd, dirPath: dirPath, entry: r.LoginEntry, api: r.API, refresh: u, client: client, now: time.Now}, nil
}

// Close releases the directory.
func (l *Login) Close() error {
	l.client.CloseIdleConnections()
	return unix.Close(l.dir)
}

// Key is l as a model route's key source: the current access token,
// refreshed first when it is about to expire.
func (l *Login) Key() func() ([]byte, error) {
	return func() ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), loginLockWait+loginRefreshTimeout)
		defer cancel()
		return l.Access(ctx)
	}
}

// oauthEntry is the part of a Pi OAuth credential the broker reads.
type oauthEntry struct {
	Type    string  `json:"type"`
	Access  string  `json:"access"`
	Refresh string  `json:"refresh"`
	Expires float64 `json:"expires"` // ms since the epoch
	// Account is a Codex login's ChatGPT account id (Pi's accountId),
	// from the access token's claim.
	Account string `json:"accountId,omitempty"`
}

// Access returns the login's access token, valid for LoginMinValidity
// at least, refreshing it (under Pi's lock) when it is not.
func (l *Login) Access(ctx context.Context) ([]byte, error) {
	// Unlocked first: the common case, a fresh token, costs one read.
	// Pi writes auth.json in place under its lock, so a read that finds
	// no JSON may have met a write half done: it is decided again under
	// the lock, as is a token about to expire.
	if e, err := l.read(); err == nil && l.fresh(e) {
		return []byte(e.Access), nil
	} else if errors.Is(err, ErrLoginRevoked) {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	unlock, err := l.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	doc, e, err := l.readDoc()
	if err != nil {
		return nil, err
	}
	if l.fresh(e) {
		return []byte(e.Access), nil // refreshed meanwhile, by Pi or another route
	}
	next, err := l.refreshToken(ctx, e.Refresh)
	if err != nil {
		return nil, err
	}
	if err := l.write(doc, next); err != nil {
		// The provider has rotated the refresh token; without the write
		// the login is lost. Say so: the operator must log in again.
		return nil, fmt.Errorf("%w: writing the refreshed login back to %s/auth.json: %v", ErrLoginUnavailable, l.dirPath, err)
	}
	l.Refreshes.Add(1)
	return []byte(next.Access), nil
}

func (l *Login) fresh(e oauthEntry) bool {
	return float64(l.now().Add(LoginMinValidity).UnixMilli()) < e.Expires
}

// read reads the entry without the lock: Pi writes auth.json in place,
// so a torn read is possible (Access then reads again under the lock);
// the broker's own writes are atomic.
func (l *Login) read() (oauthEntry, error) {
	_, e, err := l.readDoc()
	return e, err
}

func (l *Login) readDoc() (map[string]json.RawMessage, oauthEntry, error) {
	var e oauthEntry
	fd, err := unix.Openat(l.dir, "auth.json", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, e, fmt.Errorf("%w: %s/auth.json: %v", ErrLoginUnavailable, l.dirPath, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > loginFileBytes {
		return nil, e, fmt.Errorf("%w: %s/auth.json is not a regular file of at most %d bytes", ErrLoginUnavailable, l.dirPath, loginFileBytes)
	}
	buf := make([]byte, loginFileBytes+1)
	n, err := io.ReadFull(fdReader(fd), buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, e, fmt.Errorf("%w: reading %s/auth.json: %v", ErrLoginUnavailable, l.dirPath, err)
	}
	data := buf[:n]
	defer clear(buf)
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")), &doc); err != nil || doc == nil {
		return nil, e, fmt.Errorf("%w: %s/auth.json is not a JSON object", ErrLoginUnavailable, l.dirPath)
	}
	raw, ok := doc[l.entry]
	if !ok {
		return nil, e, fmt.Errorf("%w: %s/auth.json has no login %q", ErrLoginRevoked, l.dirPath, l.entry)
	}
	if json.Unmarshal(raw, &e) != nil || e.Type != "oauth" || !ValidToken([]byte(e.Access)) || e.Refresh == "" {
		return nil, e, fmt.Errorf("%w: %s/auth.json's entry %q is not an OAuth login", ErrLoginRevoked, l.dirPath, l.entry)
	}
	return doc, e, nil
}

// fdReader reads a raw descriptor.
type fdReader int

func (f fdReader) Read(p []byte) (int, error) {
	n, err := unix.Read(int(f), p)
	if n == 0 && err == nil && len(p) > 0 {
		return 0, io.EOF
	}
	if n < 0 {
		n = 0
	}
	return n, err
}

// lock takes Pi's lock on auth.json (proper-lockfile's directory) and
// keeps its mtime fresh until the returned func releases it.
func (l *Login) lock(ctx context.Context) (func(), error) {
	const name = "auth.json.lock"
	deadline := time.Now().Add(loginLockWait)
	delay := 10 * time.Millisecond
	for {
		err := unix.Mkdirat(l.dir, name, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%w: locking %s/auth.json: %v", ErrLoginUnavailable, l.dirPath, err)
		}
		var st unix.Stat_t
		if unix.Fstatat(l.dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR &&
			time.Since(time.Unix(st.Mtim.Unix())) > loginLockStale {
			// A holder that died: take it over, as proper-lockfile does.
			_ = unix.Unlinkat(l.dir, name, unix.AT_REMOVEDIR)
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %s/auth.json stayed locked for %s", ErrLoginUnavailable, l.dirPath, loginLockWait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: waiting for the lock of %s/auth.json: %v", ErrLoginUnavailable, l.dirPath, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
	// The lock belongs to the file's owner, as Pi's own would.
	var st unix.Stat_t
	if unix.Fstatat(l.dir, "auth.json", &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		_ = unix.Fchownat(l.dir, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = unix.UtimesNanoAt(l.dir, name, nil, unix.AT_SYMLINK_NOFOLLOW)
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		_ = unix.Unlinkat(l.dir, name, unix.AT_REMOVEDIR)
	}, nil
}

// tokenAnswer is the token endpoint's answer to a refresh.
type tokenAnswer struct {
	AccessToken  string  `json:"access_token"`
	RefreshToken string  `json:"refresh_token"`
	ExpiresIn    float64 `json:"expires_in"`
	Error        string  `json:"error"`
}

// refreshToken runs the provider's refresh as Pi 1.6.0 does: for
// Anthropic (pi-ai auth/oauth/anthropic.js refreshAnthropicToken) a JSON
// POST of grant_type refresh_token, Pi's client id and the refresh token;
// for Codex (auth/oauth/openai-codex.js refreshAccessToken) the same
// three form-encoded.
func (l *Login) refreshToken(ctx context.Context, refresh string) (oauthEntry, error) {
	var body []byte
	ctype := "application/json"
	if l.api == codexAPI {
		ctype = "application/x-www-form-urlencoded"
		body = []byte(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {codexClientID}}.Encode())
	} else {
		body, _ = json.Marshal(map[string]string{"grant_type": "refresh_token", "client_id": anthropicClientID, "refresh_token": refresh})
	}
	defer clear(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.refresh.String(), bytes.NewReader(body))
	if err != nil {
		return oauthEntry{}, fmt.Errorf("%w: the token endpoint: %v", ErrLoginUnavailable, err)
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "paseo-policy-model-route")
	resp, err := l.client.Do(req)
	if err != nil {
		// The cause is a name, an address or a certificate: no token.
		return oauthEntry{}, fmt.Errorf("%w: the token endpoint %s: %v", ErrLoginUnavailable, l.refresh.Host, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, loginFileBytes))
	defer clear(data)
	if err != nil {
		return oauthEntry{}, fmt.Errorf("%w: the token endpoint %s: reading its answer", ErrLoginUnavailable, l.refresh.Host)
	}
	var a tokenAnswer
	_ = json.Unmarshal(data, &a)
	switch {
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		// OAuth's invalid_grant (RFC 6749 5.2) and its kin: the refresh
		// token is no good any more. The provider's words are not
		// repeated: only the error code, if it is a plain word.
		code := ""
		if isWord(a.Error) {
			code = " (" + a.Error + ")"
		}
		return oauthEntry{}, fmt.Errorf("%w: the token endpoint %s answered %d%s", ErrLoginRevoked, l.refresh.Host, resp.StatusCode, code)
	case resp.StatusCode != http.StatusOK:
		return oauthEntry{}, fmt.Errorf("%w: the token endpoint %s answered %d", ErrLoginUnavailable, l.refresh.Host, resp.StatusCode)
	case !ValidToken([]byte(a.AccessToken)) || a.RefreshToken == "" || !ValidToken([]byte(a.RefreshToken)) || a.ExpiresIn <= 0:
		return oauthEntry{}, fmt.Errorf("%w: the token endpoint %s answered without a usable access token, refresh token and expires_in", ErrLoginUnavailable, l.refresh.Host)
	}
	exp := l.now().Add(time.Duration(a.ExpiresIn * float64(time.Second)))
	account := ""
	if l.api == codexAPI {
		// Pi keeps a Codex login's expiry as given, and refuses an
		// access token that names no account (credentialsFromToken).
		if account = codexAccount([]byte(a.AccessToken)); account == "" {
			return oauthEntry{}, fmt.Errorf("%w: the token endpoint %s answered with an access token that names no ChatGPT account", ErrLoginUnavailable, l.refresh.Host)
		}
	} else {
		exp = exp.Add(-loginExpiryMargin)
	}
	return oauthEntry{Type: "oauth", Access: a.AccessToken, Refresh: a.RefreshToken, Expires: float64(exp.UnixMilli()), Account: account}, nil
}

func isWord(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// write replaces the entry with next (keeping its other members, and
// every other entry) and writes auth.json atomically: a new file beside
// it, owned and moded as the old one, renamed over it. The caller holds
// the lock.
func (l *Login) write(doc map[string]json.RawMessage, next oauthEntry) error {
	var entry map[string]json.RawMessage
	if err := json.Unmarshal(doc[l.entry], &entry); err != nil || entry == nil {
		return errors.New("the entry is not an object")
	}
	for k, v := range map[string]any{"type": next.Type, "access": next.Access, "refresh": next.Refresh, "expires": int64(next.Expires)} {
		b, _ := json.Marshal(v)
		entry[k] = b
	}
	if next.Account != "" {
		entry["accountId"], _ = json.Marshal(next.Account)
	}
	eb, err := marshalOrdered(entry)
	if err != nil {
		return err
	}
	doc[l.entry] = eb
	out, err := marshalOrdered(doc)
	if err != nil {
		return err
	}
	defer clear(out)
	var st unix.Stat_t
	if err := unix.Fstatat(l.dir, "auth.json", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.New("auth.json is no longer a regular file")
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".auth.json.paseo-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(l.dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			_ = unix.Unlinkat(l.dir, tmp, 0)
		}
	}()
	err = func() error {
		defer unix.Close(fd)
		if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := unix.Fchmod(fd, st.Mode&0o777); err != nil {
			return err
		}
		for b := out; len(b) > 0; {
			n, err := unix.Write(fd, b)
			if err != nil {
				return err
			}
			b = b[n:]
		}
		return unix.Fsync(fd)
	}()
	if err != nil {
		return err
	}
	if err := unix.Renameat(l.dir, tmp, l.dir, "auth.json"); err != nil {
		return err
	}
	ok = true
	return nil
}

// marshalOrdered encodes an object with its members in sorted order and
// Pi's two-space indent.
func marshalOrdered(m map[string]json.RawMessage) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("{")
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteString(",")
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteString(":")
		b.Write(m[k])
	}
	b.WriteString("}")
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	clear(b.Bytes())
	return out.Bytes(), nil
}

// loginIdentity are the request headers a login route passes on from Pi
// besides the feature headers: Pi 1.6.0 sends an OAuth token with the
// Claude Code identity (pi-ai api/anthropic-messages.js createClient:
// user-agent claude-cli/<version>, x-app cli), which the subscription
// API expects; each passes only in that form.
func loginIdentity(api string, in, out http.Header) {
	if api == codexAPI {
		codexIdentity(in, out)
		return
	}
	if api != "anthropic-messages" {
		return
	}
	if ua := in.Values("User-Agent"); len(ua) == 1 && claudeCLI(ua[0]) {
		out.Set("User-Agent", ua[0])
	}
	if app := in.Values("X-App"); len(app) == 1 && app[0] == "cli" {
		out.Set("X-App", "cli")
	}
}

// claudeCLI reports whether v is "claude-cli/<digits and dots>".
func claudeCLI(v string) bool {
	ver, ok := strings.CutPrefix(v, "claude-cli/")
	if !ok || ver == "" || len(ver) > 32 || ver[0] == '.' || strings.HasSuffix(ver, ".") {
		return false
	}
	for _, c := range ver {
		if c != '.' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
