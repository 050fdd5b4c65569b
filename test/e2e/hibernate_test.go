package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// hibernateRounds is how many times the test hibernates and wakes Pi.
const hibernateRounds = 10

// The real Pi through the supervisor, hibernated between turns and woken
// by the next prompt, ten times: every turn's reply arrives once and in
// order in one gapless transcript, Pi's session log holds every prompt once
// and in order (the same file throughout), a write tool call after a wake
// lands in the workspace, the injected key still reaches the model, a
// supervisor restart while hibernated adopts it hibernated and an attach
// wakes it, and a delete while hibernated leaves no image, container,
// netns, veth, nftables table, lease, cgroup, run dir, record, bundle or
// holder.
func TestPiHibernateMidSession(t *testing.T) {
	var script []fakemodel.Turn
	for i := 0; i < hibernateRounds; i++ {
		script = append(script, fakemodel.Text(fmt.Sprintf("reply %d.", i)))
	}
	script = append(script, fakemodel.WriteFile("after-wake.txt", "written after a wake\n"),
		fakemodel.Text(fmt.Sprintf("reply %d.", hibernateRounds)), fakemodel.Text("after the restart."))
	e := newEnv(t, script...)
	sc := e.scene(t, "pi-session", "")
	h := e.hibernateHarness(t, sc.Registry, sc.State, sc.Runsc)
	h.create(t, sc.Facts)

	h.turn(t, 0)
	for round := 1; round <= hibernateRounds; round++ {
		h.hibernate(t)
		if fi, err := os.Stat(statedir.HibernateDir(sc.State, h.id)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("round %d: checkpoint dir %v %v, want root's 0700", round, fi, err)
		}
		if ents, _ := os.ReadDir(filepath.Join(sc.State, "run")); len(ents) > 0 {
			t.Errorf("round %d: a hibernated sandbox keeps its run dir: %v", round, ents)
		}
		start := time.Now()
		h.turn(t, round) // the prompt's write wakes it
		t.Logf("round %d: prompt → settled after wake in %v", round, time.Since(start).Round(time.Millisecond))
		if statedir.Hibernated(sc.State, h.id) {
			t.Fatalf("round %d: the image outlived the wake", round)
		}
	}

	var want strings.Builder
	for i := 0; i <= hibernateRounds; i++ {
		fmt.Fprintf(&want, "reply %d.", i)
	}
	if got := allAssistantText(t, h.tr.Stdout.String()); got != want.String() {
		t.Errorf("assistant text across %d wakes:\n got %q\nwant %q", hibernateRounds, got, want.String())
	}
	if data, err := os.ReadFile(filepath.Join(sc.Workspace(), "after-wake.txt")); err != nil || string(data) != "written after a wake\n" {
		t.Errorf("the write tool call after a wake: %q %v", data, err)
	}
	logs, _ := filepath.Glob(filepath.Join(sc.Host, "srv/paseo/state/pi-sessions/agent-7f3c", "*.jsonl"))
	if len(logs) != 1 {
		t.Fatalf("session logs: %v (one session throughout)", logs)
	}
	if got := sessionPrompts(t, logs[0]); len(got) != hibernateRounds+1 || strings.Join(got, ",") != strings.Join(prompts(hibernateRounds), ",") {
		t.Errorf("session log prompts %v, want %v", got, prompts(hibernateRounds))
	}
	for _, r := range e.requests() {
		if !r.Authorized {
			t.Errorf("the model saw a request without the injected key after a wake: %s %s", r.Method, r.Path)
		}
	}

	// A supervisor restart while hibernated.
	h.hibernate(t)
	h.restart(t)
	if st := h.status(t); st != supervisor.StatusHibernated {
		t.Fatalf("after a supervisor restart: %s, want hibernated", st)
	}
	h.attach(t) // wakes it
	h.turnText(t, "after the restart", "after the restart.")

	// Delete while hibernated leaves nothing.
	h.hibernate(t)
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "delete", Sandbox: h.id}, nil); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, sc.State, sc.Runsc, e.world.Uplink, h.id)
}

func prompts(n int) []string {
	var out []string
	for i := 0; i <= n; i++ {
		out = append(out, fmt.Sprintf("prompt %d", i))
	}
	return out
}

// sessionPrompts lists the user messages in a Pi session log, in order.
func sessionPrompts(t *testing.T, path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var line struct {
			Type    string `json:"type"`
			Message struct {
				Role    string `json:"role"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"message"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Type != "message" || line.Message.Role != "user" {
			continue
		}
		for _, c := range line.Message.Content {
			out = append(out, c.Text)
		}
	}
	return out
}

// allAssistantText concatenates every text delta in the transcript.
func allAssistantText(t *testing.T, transcript string) string {
	return assistantDeltas(t, transcript, false)
}

// hibernateHarness is a supervisor over the test's state and one attached
// daemon connection.
type hibernateHarness struct {
	e      *env
	cfg    supervisor.Config
	socket string
	stop   func()
	cl     *supervisor.Client
	id     string
	epoch  uint64
	tr     *stream
	n      int
}

func (e *env) hibernateHarness(t *testing.T, registry []byte, state, runsc string) *hibernateHarness {
	dir, err := os.MkdirTemp("/run", "paseo-e2e-hibernate-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	h := &hibernateHarness{e: e, socket: filepath.Join(dir, "supervisor.sock"), tr: &stream{}}
	h.cfg = supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: registry},
		Socket: h.socket, SocketGID: 0, StateRoot: state, RunscPath: runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM}
	h.supervise(t)
	return h
}

func (h *hibernateHarness) supervise(t *testing.T) {
	srv, err := supervisor.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = srv.Listen(sctx); close(served) }()
	t.Cleanup(func() { cancel(); srv.Shutdown() })
	h.stop = func() { cancel(); <-served; srv.Close() }
	h.cl = dialSupervisor(t, h.socket)
}

func (h *hibernateHarness) restart(t *testing.T) {
	h.cl.Close()
	h.stop()
	h.supervise(t)
}

func (h *hibernateHarness) create(t *testing.T, facts []byte) {
	var in supervisor.Info
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: facts}, &in); err != nil {
		t.Fatal(err)
	}
	h.id = in.Sandbox
	h.attach(t)
}

func (h *hibernateHarness) attach(t *testing.T) {
	var att struct{ Epoch uint64 }
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "attach", Sandbox: h.id, Cursor: h.tr.Cursor}, &att); err != nil {
		t.Fatalf("attach: %v", err)
	}
	h.epoch = att.Epoch
}

func (h *hibernateHarness) write(t *testing.T, line string) {
	h.n++
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "write", Sandbox: h.id, Epoch: h.epoch, InputID: fmt.Sprintf("in-%d", h.n), Data: []byte(line + "\n")}, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// turn sends "prompt <i>" and waits for it to settle with "reply <i>.".
func (h *hibernateHarness) turn(t *testing.T, i int) {
	h.turnText(t, fmt.Sprintf("prompt %d", i), fmt.Sprintf("reply %d.", i))
}

func (h *hibernateHarness) turnText(t *testing.T, prompt, reply string) {
	t.Helper()
	h.tr.from = h.tr.Stdout.Len()
	msg, _ := json.Marshal(prompt)
	h.write(t, fmt.Sprintf(`{"id":"p-%d","type":"prompt","message":%s}`, h.n, msg))
	if !h.tr.until(t, h.cl, h.id, `"agent_settled"`, 90*time.Second) {
		t.Fatalf("%q did not settle: %q", prompt, h.tr.tail())
	}
	if got := allAssistantText(t, h.tr.Stdout.String()[h.tr.from:]); got != reply {
		t.Fatalf("%q answered %q, want %q", prompt, got, reply)
	}
}

func (h *hibernateHarness) hibernate(t *testing.T) {
	t.Helper()
	var in supervisor.Info
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "hibernate", Sandbox: h.id}, &in); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	if in.Status != supervisor.StatusHibernated {
		t.Fatalf("hibernate answered %+v", in)
	}
}

func (h *hibernateHarness) status(t *testing.T) string {
	var in supervisor.Info
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "inspect", Sandbox: h.id}, &in); err != nil {
		t.Fatalf("inspect: %v", err)
	}
	return in.Status
}

// assertNoTrace checks that nothing of sandbox id is left: its checkpoint,
// container, network namespace, veth, nftables table, lease, cgroups, run
// dir, record, bundle, holder socket, and no mount under the state root.
func assertNoTrace(t *testing.T, state, runsc, uplink, id string) {
	t.Helper()
	if entries, err := (inventory.Inventory{StateRoot: state, RunscPath: runsc}).PS(); err != nil || len(entries) != 0 {
		t.Errorf("sandboxes left: %+v %v", entries, err)
	}
	for _, d := range []string{"hibernate", "run", "records", "net/netns", "net/leases", "bundles", "holders"} {
		if ents, _ := os.ReadDir(filepath.Join(state, d)); len(ents) > 0 {
			t.Errorf("%s left: %v", d, ents)
		}
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), state) {
		t.Errorf("mounts left under %s", state)
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/paseo-sandbox/" + id)
	if more, _ := filepath.Glob("/sys/fs/cgroup/paseo-sandbox/" + id); len(more) > 0 {
		cgs = append(cgs, more...)
	}
	if len(cgs) > 0 {
		t.Errorf("cgroups left: %v", cgs)
	}
	peer, _, table := sandboxnet.Names(id)
	fd, err := unix.Open(uplink, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("uplink namespace: %v", err)
	}
	defer unix.Close(fd)
	nft, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := nft.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == table {
			t.Errorf("nftables table %s left in the uplink", table)
		}
	}
	nl, err := netlink.NewHandleAt(netns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	if _, err := nl.LinkByName(peer); err == nil {
		t.Errorf("veth %s left in the uplink", peer)
	}
}
