package launcher

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// hibernateScript counts the lines it reads (state only the sandbox's
// memory holds), writes each to the workspace and, on "net", asks the
// model for its models through the model route on the gateway, with the
// stand-in key the sandbox has (the route adds the real one). Its input
// stays open a while: a client that half-closes is one that went away,
// to Go's server, which then drops the request.
const hibernateScript = `n=0
while read line; do
  n=$((n+1))
  [ -n "$first" ] || first="kept:$line"
  echo "$line" >> "$PASEO_AGENT_CWD/lines.txt"
  if [ "$line" = net ]; then
    (printf 'GET /v1/models HTTP/1.0\r\nHost: paseo-gateway\r\nAuthorization: Bearer %s\r\n\r\n' "$FAKE_LLM_KEY"; /bin/busybox sleep 2) | /bin/busybox timeout 8 /bin/busybox nc -w 6 paseo-gateway 18080 | /bin/busybox head -n1 | /bin/busybox tr -d '\r' | /bin/busybox sed "s/^/net $n /"
  else
    echo "got $n $line key=$FAKE_LLM_KEY"
  fi
done`

// run is one Launch or Wake of the hibernate sandbox, with its own stdio.
type hibernateRun struct {
	in    *io.PipeWriter
	out   *bufio.Reader
	done  chan struct{}
	res   Result
	err   error
	netns *sandboxnet.Network
}

func (s *sandbox) startRun(t *testing.T, id string, secrets SecretSource, wakeUp bool) *hibernateRun {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &hibernateRun{in: inW, out: bufio.NewReader(outR), done: make(chan struct{})}
	started := make(chan struct{})
	opts := Options{BundleDir: s.bundle, ID: id, StateRoot: s.state, RunscPath: s.runsc, Secrets: secrets,
		Stdin: inR, Stdout: outW, Uplink: s.uplink, Resolve: s.resolve, ModelRoots: s.modelRoots,
		OnNetwork: func(n *sandboxnet.Network) { r.netns = n },
		OnStart:   func() { close(started) }}
	go func() {
		defer close(r.done)
		if wakeUp {
			r.res, r.err = Wake(context.Background(), opts)
		} else {
			r.res, r.err = Launch(context.Background(), opts)
		}
		outW.Close()
		inR.Close()
	}()
	select {
	case <-started:
	case <-r.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the sandbox did not start in 60 s")
	}
	return r
}

func (r *hibernateRun) line(t *testing.T, send string) string {
	t.Helper()
	if _, err := fmt.Fprintln(r.in, send); err != nil {
		t.Fatalf("writing %q: %v", send, err)
	}
	got := make(chan string, 1)
	go func() {
		l, _ := r.out.ReadString('\n')
		got <- strings.TrimSpace(l)
	}()
	select {
	case l := <-got:
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("no answer to %q", send)
		return ""
	}
}

func (r *hibernateRun) ended(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the launch did not end")
	}
	r.in.Close()
}

// hibernateSandbox is the hibernate script in api-key mode, with the fake
// model over TLS on its test host behind the model route.
func hibernateSandbox(t *testing.T) (*sandbox, *fakemodel.Server) {
	return modelRouteSandbox(t, hibernateScript, "", "s3cr3t-value")
}

// modelRouteSandbox is script in api-key mode (facts patched by
// factsPatch), with the fake model taking apiKey over TLS on its test
// host behind the model route.
func modelRouteSandbox(t *testing.T, script, factsPatch, apiKey string) (*sandbox, *fakemodel.Server) {
	world := testnet.New(t)
	model := world.Host("model")
	ca, err := fakemodel.NewTestCA("llm.example.test")
	if err != nil {
		t.Fatal(err)
	}
	fm := fakemodel.New(fakemodel.Options{APIKey: apiKey})
	l, err := model.Listen("tcp4", netip.AddrPortFrom(model.Addr, 8443).String())
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: fm.Handler(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Cert}}, ErrorLog: log.New(io.Discard, "", 0)}
	go hs.ServeTLS(l, "", "")
	t.Cleanup(func() { hs.Close() })
	s := compileScriptFacts(t, script, `{"network":{"mode":"sandbox"}}`, factsPatch)
	s.uplink, s.modelRoots = world.Uplink, ca.Roots
	s.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "llm.example.test" {
			return []netip.Addr{model.Addr}, nil
		}
		return nil, fmt.Errorf("unknown host %s", host)
	}
	return s, fm
}

// A checkpointed sandbox (network sandbox, staged binds, EROFS layers)
// restores with new stdio pipes, the same id, its memory (the line count),
// a rebuilt network on the same link whose model route adds the key as it
// is at each wake (rotated while the sandbox slept: the next request
// carries the new one), and a workspace that still takes writes;
// the image is root-only while it exists and gone after the wake; after
// the last run nothing is left.
func TestHibernateWake(t *testing.T) {
	s, fm := hibernateSandbox(t)
	key := staticSecret("s3cr3t-value")
	id := "pp-hib-" + fmt.Sprint(os.Getpid())
	r := s.startRun(t, id, key, false)
	if got := r.line(t, "one"); got != "got 1 one key="+bundle.ModelRoutePlaceholder {
		t.Fatalf("first run answered %q", got)
	}
	link := r.netns.Gateway
	for round := 2; round <= 4; round++ {
		img, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc})
		if err != nil {
			t.Fatalf("round %d: checkpoint: %v", round, err)
		}
		r.ended(t)
		t.Logf("round %d: the checkpointed launch ended with %+v (%v); image %d files", round, r.res, r.err, len(img.Files))
		// No secret is in the sandbox, so the image records none to
		// compare: a rotated key wakes.
		if img.LegacySecretsDigest != "" {
			t.Fatalf("round %d: the image records a secrets digest %q", round, img.LegacySecretsDigest)
		}
		// Rotated at the provider and in the secrets while it sleeps.
		rotated := fmt.Sprintf("s3cr3t-value-%d", round)
		fm.SetAPIKey(rotated)
		key = staticSecret(rotated)
		fi, err := os.Stat(statedir.HibernateDir(s.state, id))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("hibernate dir: %v %v, want 0700", fi, err)
		}
		if ents, _ := os.ReadDir(filepath.Join(s.state, "run")); len(ents) > 0 {
			t.Errorf("round %d: a hibernated sandbox keeps run dirs: %v", round, ents)
		}
		// The link stays the sandbox's while it is hibernated, gc or not.
		if rep, err := (inventory.Inventory{StateRoot: s.state, RunscPath: s.runsc}).GC(); err != nil || len(rep.Removed) > 0 {
			t.Errorf("round %d: gc of a hibernated sandbox: %+v %v", round, rep, err)
		}
		if kept, ok, err := sandboxnet.LeasedLink(filepath.Join(s.state, "net"), netip.Prefix{}, id); err != nil || !ok || kept != img.Link {
			t.Errorf("round %d: hibernated, the sandbox holds lease %v (%v %v), want its link %v", round, kept, ok, err, img.Link)
		}
		r = s.startRun(t, id, key, true)
		if r.err != nil {
			t.Fatalf("round %d: wake: %v", round, r.err)
		}
		if r.netns.Gateway != link {
			t.Errorf("round %d: woke on gateway %s, hibernated on %s", round, r.netns.Gateway, link)
		}
		if statedir.Hibernated(s.state, id) {
			t.Errorf("round %d: the image outlived the wake", round)
		}
		want := fmt.Sprintf("got %d w%d key=%s", 2*round-2, round, bundle.ModelRoutePlaceholder)
		if got := r.line(t, fmt.Sprintf("w%d", round)); got != want {
			t.Fatalf("round %d: woken sandbox answered %q, want %q", round, got, want)
		}
		if got, want := r.line(t, "net"), fmt.Sprintf("net %d HTTP/1.0 200 OK", 2*round-1); got != want {
			t.Fatalf("round %d: the model route after wake: %q, want %q (the model saw %d requests)", round, got, want, len(fm.Requests()))
		}
	}
	r.in.Close()
	r.ended(t)
	data, err := os.ReadFile(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/lines.txt"))
	if want := "one\nw2\nnet\nw3\nnet\nw4\nnet\n"; err != nil || string(data) != want {
		t.Errorf("workspace lines %q (%v), want %q", data, err, want)
	}
	s.assertClean(t)
	if ents, _ := os.ReadDir(filepath.Join(s.state, "hibernate")); len(ents) > 0 {
		t.Errorf("images left behind: %v", ents)
	}
}

// A wake refuses, keeping the image for the caller to delete, when a bind
// source was swapped for a symlink, when an image file changed, and when
// there is no image; nothing starts and nothing is left but the image. (A
// rotated provider key is no refusal any more: the key is not in the
// image, and the woken route adds the new one, TestHibernateWake.)
func TestWakeFailsClosed(t *testing.T) {
	s, _ := hibernateSandbox(t)
	key := staticSecret("s3cr3t-value")
	id := "pp-hibfc-" + fmt.Sprint(os.Getpid())
	r := s.startRun(t, id, key, false)
	if got := r.line(t, "one"); !strings.HasPrefix(got, "got 1 one") {
		t.Fatalf("first run answered %q", got)
	}
	if _, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc}); err != nil {
		t.Fatal(err)
	}
	r.ended(t)

	// reason is a code or sentinel in the refusal's chain.
	wantRefused := func(what string, src SecretSource, reason error) {
		t.Helper()
		r := s.startRun(t, id, src, true)
		r.ended(t)
		var ue *UnavailableError
		ok := errors.As(r.err, &ue) && errors.Is(r.err, reason) && len(ue.Diagnostics()) > 0
		if !ok {
			t.Fatalf("%s: wake returned %v, want sandbox-unavailable with %v", what, r.err, reason)
		}
		if ents, _ := os.ReadDir(filepath.Join(s.state, "run")); len(ents) > 0 {
			t.Errorf("%s: run dirs left: %v", what, ents)
		}
	}
	// A bind source swapped for a symlink while hibernated: the pin is
	// checked again, as at launch.
	ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	restore := swapForSymlink(t, ws, t.TempDir())
	wantRefused("workspace swapped for a symlink", key, diag.PathSymlink)
	restore()

	ents, err := os.ReadDir(statedir.ImageDir(s.state, id))
	if err != nil || len(ents) == 0 {
		t.Fatalf("image: %v %v", ents, err)
	}
	victim := filepath.Join(statedir.ImageDir(s.state, id), ents[0].Name())
	f, err := os.OpenFile(victim, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0})
	f.Close()
	wantRefused("changed image", key, diag.LaunchWake)

	if err := RemoveHibernation(s.state, id); err != nil {
		t.Fatal(err)
	}
	wantRefused("no image", key, diag.LaunchWake)
	s.assertClean(t)
	if ents, _ := os.ReadDir(filepath.Join(s.state, "hibernate")); len(ents) > 0 {
		t.Errorf("images left behind: %v", ents)
	}
}

// Wall time counts the time a sandbox ran, over every launch and wake: a
// checkpoint records the running total, and a wake whose total has used up
// wallSeconds is refused rather than given the limit afresh.
func TestWakeKeepsWallTime(t *testing.T) {
	s := compileScript(t, "while read line; do echo \"got $line\"; done", `{"limits":{"wallSeconds":300}}`)
	key := staticSecret("v")
	id := "pp-hibwall-" + fmt.Sprint(os.Getpid())
	checkpoint := func() *statedir.Image {
		t.Helper()
		img, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	r := s.startRun(t, id, key, false)
	r.line(t, "one")
	time.Sleep(time.Second)
	first := checkpoint()
	r.ended(t)
	if first.Ran < time.Second {
		t.Fatalf("the first run ran %v, recorded %v", time.Second, first.Ran)
	}
	// An image as the launcher wrote it while it filled secret slots (the
	// digest of no secret, as every launch without a slot recorded) still
	// decodes and wakes: the field is read and ignored.
	first.LegacySecretsDigest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	old, _ := json.Marshal(first)
	if !strings.Contains(string(old), `"secretsDigest":"e3b0`) {
		t.Fatalf("the old image form: %s", old)
	}
	if err := os.WriteFile(filepath.Join(statedir.HibernateDir(s.state, id), statedir.ImageFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	r = s.startRun(t, id, key, true)
	if got := r.line(t, "two"); got != "got two" {
		t.Fatalf("woken: %q", got)
	}
	time.Sleep(time.Second)
	second := checkpoint()
	r.ended(t)
	if second.Ran < first.Ran+time.Second {
		t.Fatalf("after a second run of 1 s the total is %v, was %v", second.Ran, first.Ran)
	}

	// A total past the limit (rewritten here; a real one would have been
	// stopped at the limit) refuses the wake.
	second.Ran = 301 * time.Second
	data, _ := json.Marshal(second)
	if err := os.WriteFile(filepath.Join(statedir.HibernateDir(s.state, id), statedir.ImageFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	r = s.startRun(t, id, key, true)
	r.ended(t)
	var ue *UnavailableError
	if !errors.As(r.err, &ue) || !errors.Is(r.err, diag.LaunchWake) {
		t.Fatalf("a wake past the wall time: %v", r.err)
	}
	if err := RemoveHibernation(s.state, id); err != nil {
		t.Fatal(err)
	}
	s.assertClean(t)
}

// outputBytes counts what a sandbox wrote before a wake (Options.
// OutputBefore, which the execution backend keeps across hibernations).
func TestOutputBeforeCounts(t *testing.T) {
	s := compileScript(t, "echo 0123456789abcdef0123456789abcdef; /bin/busybox sleep 30", `{"limits":{"outputBytes":65536}}`)
	var out strings.Builder
	res, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, OutputBefore: 65536 - 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != "output limit exceeded" || out.Len() != 0 {
		t.Errorf("reason %q, %d bytes passed, want the limit reached by the earlier output", res.Reason, out.Len())
	}
	s.assertClean(t)
}

// Issue 24, inverted from TestCheckpointHoldsTheKey: with the model route
// the provider key is nowhere in the sandbox, so no checkpoint can hold
// it. The sandbox uses the route (the route proxy, outside, holds and
// sends the key) and is then checkpointed; no image file, nor the image
// description, holds a byte sequence of the key, and the sandbox's own
// environment and files named only the stand-in. The control: the same
// scan finds a value the sandbox did hold (sent to it on stdin, so it
// sits in the shell's memory) in clear, in the pinned runsc's image.
func TestCheckpointHoldsNoKey(t *testing.T) {
	s, fm := hibernateSandbox(t)
	const theKey = "s3cr3t-value"
	const held = "held-value-in-sandbox-memory-51c7"
	key := staticSecret(theKey)
	id := "pp-hibkey-" + fmt.Sprint(os.Getpid())
	r := s.startRun(t, id, key, false)
	if got := r.line(t, held); got != "got 1 "+held+" key="+bundle.ModelRoutePlaceholder {
		t.Fatalf("the sandbox answered %q, want the route's stand-in as its key", got)
	}
	if got := r.line(t, "net"); got != "net 2 HTTP/1.0 200 OK" {
		t.Fatalf("the model route: %q (the model saw %d requests)", got, len(fm.Requests()))
	}
	if reqs := fm.Requests(); len(reqs) != 1 || !reqs[0].Authorized {
		t.Fatalf("the model did not get the key through the route: %+v", reqs)
	}
	img, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc})
	if err != nil {
		t.Fatal(err)
	}
	r.ended(t)
	scan := func(value string) (holding []string) {
		for name := range img.Files {
			data, err := os.ReadFile(filepath.Join(statedir.ImageDir(s.state, id), name))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(data, []byte(value)) {
				holding = append(holding, name)
			}
		}
		return holding
	}
	if holding := scan(theKey); len(holding) > 0 {
		t.Errorf("image files hold the provider key: %v", holding)
	}
	if holding := scan("kept:" + held); len(holding) == 0 {
		t.Errorf("control: no image file holds the value the sandbox held (files %v): the scan proves nothing; the pinned runsc changed (threat 66)", img.Files)
	}
	data, _ := os.ReadFile(filepath.Join(statedir.HibernateDir(s.state, id), statedir.ImageFile))
	if bytes.Contains(data, []byte(theKey)) {
		t.Error("the image description holds the key")
	}
	for _, f := range []string{bundle.ConfigFile, bundle.ModelsFile} {
		if b, _ := os.ReadFile(filepath.Join(s.bundle, f)); bytes.Contains(b, []byte(theKey)) {
			t.Errorf("the bundle's %s holds the key", f)
		}
	}
	ws, _ := os.ReadFile(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/lines.txt"))
	if bytes.Contains(ws, []byte(theKey)) {
		t.Error("the workspace holds the key")
	}
	if err := RemoveHibernation(s.state, id); err != nil {
		t.Fatal(err)
	}
	s.assertClean(t)
}
