// Package mcpstandin runs test/mcpstandin, a stand-in of Paseo's agent MCP
// endpoint on Paseo's own Node stack (express 4's express.json(), the MCP
// SDK's streamable HTTP transport, zod), so a test can see what the daemon
// itself makes of the bytes the route proxy forwards: which tools it ran,
// with which arguments, for which caller.
//
// Its npm dependencies are installed once per lock file: `npm ci` into a
// cache directory named by the lock's sha256, reused by later runs and
// shared by concurrent test processes (each installs into a directory of
// its own and renames it into place; the first rename wins). npm fetches
// from the registry this machine's npm is configured for; the lock names
// none. node and npm come from scripts/deps.sh; without them Start fails,
// saying so.
package mcpstandin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Run is one tool call the stand-in ran: the tool, the arguments after its
// zod schema (defaults filled in) and the session's callerAgentId.
type Run struct {
	Tool          string          `json:"tool"`
	Arguments     json.RawMessage `json:"arguments"`
	CallerAgentID string          `json:"callerAgentId"`
}

// StandIn is a running stand-in.
type StandIn struct {
	// URL is the MCP endpoint, http://127.0.0.1:<port>/mcp/agents.
	URL     string
	control string
	client  *http.Client
}

// Bounds on the set-up, so a broken registry or node fails the test with
// a reason instead of hanging it; they are no claim about speed.
const (
	installBound = 10 * time.Minute
	startBound   = time.Minute
)

// Start installs the stand-in's dependencies if needed, starts it with
// token as the only bearer it accepts, and stops it when the test ends.
func Start(t testing.TB, token string) *StandIn {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("mcpstandin: %s is not on PATH; scripts/deps.sh (make deps) installs node and npm", tool)
		}
	}
	if out, err := exec.Command("node", "--version").Output(); err != nil || nodeMajor(string(out)) < minNode {
		t.Fatalf("mcpstandin: node --version says %q (%v); the stand-in's pinned packages need Node %d or later", strings.TrimSpace(string(out)), err, minNode)
	}
	src := sourceDir()
	modules, err := install(src)
	if err != nil {
		t.Fatalf("mcpstandin: %v", err)
	}
	// The server runs from a directory of its own whose node_modules is the
	// cached install, so Node resolves its imports there.
	dir := t.TempDir()
	server, err := os.ReadFile(filepath.Join(src, "server.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "server.mjs"), server, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("node", filepath.Join(dir, "server.mjs"))
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "PASEO_STANDIN_TOKEN=" + token}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("mcpstandin: starting node: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// Closing stdin ends the stand-in; a kill is the fallback.
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("mcpstandin stderr:\n%s", stderr.String())
		}
	})

	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		l, _ := r.ReadString('\n')
		line <- l
		_, _ = io.Copy(io.Discard, r)
	}()
	var first string
	select {
	case first = <-line:
	case <-time.After(startBound):
		t.Fatalf("mcpstandin: node printed no ports within %v; stderr:\n%s", startBound, stderr.String())
	}
	var ports struct{ MCP, Control int }
	if err := json.Unmarshal([]byte(first), &ports); err != nil || ports.MCP == 0 || ports.Control == 0 {
		t.Fatalf("mcpstandin: node did not start (first line %q); stderr:\n%s", first, stderr.String())
	}
	s := &StandIn{URL: "http://127.0.0.1:" + strconv.Itoa(ports.MCP) + "/mcp/agents",
		control: "http://127.0.0.1:" + strconv.Itoa(ports.Control), client: &http.Client{Timeout: 30 * time.Second}}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

// Runs is every tool run since the start or the last Reset, in order.
func (s *StandIn) Runs() ([]Run, error) {
	resp, err := s.client.Get(s.control + "/runs")
	if err != nil {
		return nil, fmt.Errorf("mcpstandin: reading runs: %w", err)
	}
	defer resp.Body.Close()
	var runs []Run
	if err := json.NewDecoder(resp.Body).Decode(&runs); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("mcpstandin: reading runs: status %d, %v", resp.StatusCode, err)
	}
	return runs, nil
}

// Reset forgets the runs so far.
func (s *StandIn) Reset() error {
	resp, err := s.client.Post(s.control+"/reset", "", nil)
	if err != nil {
		return fmt.Errorf("mcpstandin: reset: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("mcpstandin: reset: status %d", resp.StatusCode)
	}
	return nil
}

// minNode is the oldest Node the pinned MCP SDK supports (its engines field).
const minNode = 18

// nodeMajor reads the major version of "v20.20.2".
func nodeMajor(v string) int {
	major, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(v), "v"), ".")
	n, _ := strconv.Atoi(major)
	return n
}

// sourceDir is test/mcpstandin in this repository.
func sourceDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "test", "mcpstandin")
}

var installMu sync.Mutex

// install returns the node_modules directory of the stand-in's lock,
// running npm ci first if no earlier run left one.
func install(src string) (string, error) {
	installMu.Lock()
	defer installMu.Unlock()
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		return "", err
	}
	pkg, err := os.ReadFile(filepath.Join(src, "package.json"))
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the npm install: %w", err)
	}
	sum := sha256.Sum256(lock)
	parent := filepath.Join(base, "paseo-policy", "mcpstandin")
	final := filepath.Join(parent, hex.EncodeToString(sum[:]))
	modules := filepath.Join(final, "node_modules")
	if _, err := os.Stat(modules); err == nil {
		return modules, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(parent, ".install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // empty after a successful rename
	for name, data := range map[string][]byte{"package.json": pkg, "package-lock.json": lock} {
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), installBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund",
		"--no-update-notifier", "--loglevel=warn")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %v\n%s", tmp, err, out)
	}
	// npm's hidden lockfile records where each tarball came from; nothing
	// reads it, and the cache keeps no registry's name.
	_ = os.Remove(filepath.Join(tmp, "node_modules", ".package-lock.json"))
	if err := os.Rename(tmp, final); err != nil {
		// Another process got there first: its install is as good.
		if _, serr := os.Stat(modules); serr == nil {
			return modules, nil
		}
		return "", err
	}
	return modules, nil
}

// lockedBuffer collects node's stderr while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}
