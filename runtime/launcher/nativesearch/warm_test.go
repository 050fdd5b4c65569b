package nativesearch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// confinement reads what /proc says of pid's main thread (the one the
// jail's init ran on and the tool is exec'd from): no_new_privs, the
// seccomp mode, the effective and permitted capabilities, the uid, and the
// names at its root.
func confinement(t *testing.T, pid int) (status map[string]string, root []string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	status = map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			status[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		root = append(root, e.Name())
	}
	return status, root
}

func confined(status map[string]string, root []string) bool {
	return status["NoNewPrivs"] == "1" && status["Seccomp"] == "2" && status["CapEff"] == "0000000000000000" &&
		status["CapPrm"] == "0000000000000000" && status["Uid"] == "1000 1000 1000 1000" &&
		slices.Equal(root, []string{"bin", "lib", "lib64", "srv", "usr"})
}

// TestWarmJailConfinedBeforeItsRequest: a jail made before its request
// (the server's warm one) is, while it waits, already what the tool runs
// in: its own root (the image's /usr and the workspace only), the agent's
// uid, no capability, no_new_privs, seccomp; its request has not been
// written. Control: the same reading of a process the server starts
// without a jail (this test's) says not confined.
func TestWarmJailConfinedBeforeItsRequest(t *testing.T) {
	f := newJail(t)
	if st, root := confinement(t, os.Getpid()); confined(st, root) {
		t.Fatalf("control: this test's own process reads as confined: %v %v", st, root)
	}
	for _, tool := range []Tool{Rg, Fd, Find} {
		p, err := f.j.prepare(tool)
		if err != nil {
			t.Fatal(err)
		}
		st, root := confinement(t, p.pid)
		if !confined(st, root) {
			t.Errorf("%s: the waiting jail is not confined: %v, root %v", tool, st, root)
		}
		if !p.alive() {
			t.Errorf("%s: the jail did not wait for its request", tool)
		}
		p.discard()
	}
}

// TestJailNotBuiltGetsNoRequest: a jail that could not complete its
// confinement (here Landlock: the image lacks the tool it would execute)
// never reports ready, so no request is written to it: the search is not
// answered. Control: the same request with the image's /usr is.
func TestJailNotBuiltGetsNoRequest(t *testing.T) {
	f := newJail(t)
	r := Request{Cwd: ".", Pattern: pat("func "), Options: []Option{{Name: "count"}}}
	if _, err := f.j.Run(context.Background(), r); err != nil {
		t.Fatalf("control: %v", err)
	}
	broken := f.j
	broken.Usr = t.TempDir()
	if err := os.MkdirAll(filepath.Join(broken.Usr, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := broken.prepare(Rg)
	if !errors.Is(err, ErrFallback) || !strings.Contains(err.Error(), "landlock rule") {
		t.Errorf("a jail without its tool: %v, want ErrFallback at its Landlock rule", err)
	}
}

// TestServerWarmJails: the server answers the first search in a new jail
// and then makes the next jail of every tool (rg's, and fd's and find's,
// which no request asked for yet); a later request is answered by a warm
// jail, with the same answer, and every jail serves one request (each
// answer from another process; a used jail is gone). Close ends the jails
// still waiting.
func TestServerWarmJails(t *testing.T) {
	f := newJail(t)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	req := Request{Cwd: ".", Pattern: pat("func "), Options: []Option{{Name: "count"}, {Name: "sort=path"}}}.Encode()
	ask := func() string {
		c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(req)
		c.(*net.TCPConn).CloseWrite()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	waitWarm := func(tools ...Tool) *prepared {
		if len(tools) == 0 {
			tools = []Tool{Rg}
		}
		for range 200 {
			s.mu.Lock()
			p := s.warm[tools[0]]
			for _, t := range tools[1:] {
				if s.warm[t] == nil {
					p = nil
				}
			}
			s.mu.Unlock()
			if p != nil {
				return p
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no warm jail made after a request")
		return nil
	}
	first := ask()
	if !strings.HasPrefix(first, magic+" ok 0 ") || !strings.Contains(first, "a.go:1") {
		t.Fatalf("the first answer: %q", first)
	}
	if st := s.Stats(); st.Answered != 1 || st.Warm != 0 {
		t.Errorf("after the first: %+v, want one answer from a new jail", st)
	}
	waitWarm(Rg, Fd, Find)
	var pids []int
	for i := range 3 {
		p := waitWarm()
		pids = append(pids, p.pid)
		if got := ask(); got != first {
			t.Errorf("answer %d from a warm jail: %q, want %q", i+2, got, first)
		}
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			t.Errorf("the warm jail %d still runs after its answer", p.pid)
		}
	}
	if st := s.Stats(); st.Answered != 4 || st.Warm != 3 {
		t.Errorf("stats %+v, want 4 answered, 3 of them warm", st)
	}
	if slices.Sort(pids); len(slices.Compact(pids)) != 3 {
		t.Errorf("jails %v: one served more than one request", pids)
	}
	last := waitWarm()
	s.Close()
	select {
	case <-last.exited:
	case <-time.After(5 * time.Second):
		t.Errorf("Close left the waiting jail %d", last.pid)
	}
	if err := unix.Kill(last.pid, 0); err == nil {
		t.Errorf("the waiting jail %d lives after Close", last.pid)
	}
}
