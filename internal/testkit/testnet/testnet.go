// Package testnet builds small private networks for tests: an uplink
// namespace that stands in for the host's network (the launcher puts the
// sandbox's veth peer there) and test hosts in namespaces of their own,
// each linked to the uplink on addresses the test assigns. Tests send
// traffic only to servers they start on these hosts; nothing here touches
// the host's own namespace, routes or sysctls.
package testnet

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/nsutil"
	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// T is what testnet needs of its caller. testing.TB has it, and so can a
// program that runs a world outside `go test` (test/cmd/paseo-demo).
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// World is an uplink namespace with forwarding on and test hosts around it.
type World struct {
	t      T
	dir    string
	Uplink string // pinned namespace path of the uplink
	fd     int
	hosts  []*Host
	prefix string
}

// Host is one test host: its own namespace, one address, servers on it.
type Host struct {
	Name string
	Addr netip.Addr
	// Gateway is the uplink's address on this host's link: an address of
	// "the host itself" from the sandbox's point of view.
	Gateway netip.Addr
	ns      string
	fd      int
}

// New creates a world. Its host links use 10.77.<n>.0/30; sandbox links
// come from the launcher's own pool, which does not overlap.
func New(t T) *World {
	t.Helper()
	if tb, ok := t.(skip.TB); ok {
		skip.UnlessRoot(tb, "it creates network namespaces, veths and nftables rules")
	}
	dir, err := os.MkdirTemp("", "paseo-testnet-")
	if err != nil {
		t.Fatal(err)
	}
	w := &World{t: t, dir: dir, Uplink: filepath.Join(dir, "uplink")}
	w.prefix = fmt.Sprintf("pt%04x", os.Getpid()&0xffff)
	if w.fd, err = nsutil.Create(w.Uplink); err != nil {
		t.Fatalf("test world uplink namespace: %v", err)
	}
	t.Cleanup(w.close)
	if err := nsutil.Sysctl(w.fd, "ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	w.up(w.fd, "lo")
	return w
}

func (w *World) up(fd int, name string) {
	h := w.handle(fd)
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		w.t.Fatal(err)
	}
}

func (w *World) handle(fd int) *netlink.Handle {
	h, err := netlink.NewHandleAt(netns.NsHandle(fd))
	if err != nil {
		w.t.Fatal(err)
	}
	return h
}

// Host adds a test host linked to the uplink.
func (w *World) Host(name string) *Host {
	w.t.Helper()
	k := len(w.hosts) + 1
	h := &Host{Name: name, ns: filepath.Join(w.dir, "host-"+name),
		Gateway: netip.AddrFrom4([4]byte{10, 77, byte(k), 1}),
		Addr:    netip.AddrFrom4([4]byte{10, 77, byte(k), 2})}
	var err error
	if h.fd, err = nsutil.Create(h.ns); err != nil {
		w.t.Fatal(err)
	}
	w.hosts = append(w.hosts, h)
	upName, hostName := fmt.Sprintf("%s%du", w.prefix, k), fmt.Sprintf("%s%dh", w.prefix, k)
	uh := w.handle(w.fd)
	defer uh.Close()
	if err := uh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: upName}, PeerName: hostName, PeerNamespace: netlink.NsFd(h.fd)}); err != nil {
		w.t.Fatalf("test host %s link: %v", name, err)
	}
	w.addr(uh, upName, h.Gateway)
	hh := w.handle(h.fd)
	defer hh.Close()
	w.addr(hh, hostName, h.Addr)
	w.up(h.fd, "lo")
	l, _ := hh.LinkByName(hostName)
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(h.Gateway.AsSlice()),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		w.t.Fatal(err)
	}
	return h
}

// Alias gives h the extra address a (a /32 on its loopback) and routes a
// to h in the uplink: a test can stand a server at a well-known address,
// such as the cloud metadata service's 169.254.169.254, so that reaching
// it would be seen instead of being merely unroutable.
func (w *World) Alias(h *Host, a netip.Addr) {
	w.t.Helper()
	hh := w.handle(h.fd)
	defer hh.Close()
	lo, err := hh.LinkByName("lo")
	if err != nil {
		w.t.Fatal(err)
	}
	if err := hh.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}}); err != nil {
		w.t.Fatalf("alias %s on test host %s: %v", a, h.Name, err)
	}
	uh := w.handle(w.fd)
	defer uh.Close()
	if err := uh.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}, Gw: net.IP(h.Addr.AsSlice())}); err != nil {
		w.t.Fatalf("uplink route to %s: %v", a, err)
	}
}

func (w *World) addr(h *netlink.Handle, name string, a netip.Addr) {
	l, err := h.LinkByName(name)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(30, 32)}}); err != nil {
		w.t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		w.t.Fatal(err)
	}
}

// Server is a TCP server on a test host that writes a banner to every
// connection and counts them.
type Server struct {
	Addr   netip.AddrPort
	Banner string
	mu     sync.Mutex
	conns  int
	l      net.Listener
}

// Conns is how many connections the server accepted.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// Serve starts a banner server on the host at port.
func (h *Host) Serve(t T, port int, banner string) *Server {
	t.Helper()
	return h.ServeAt(t, netip.AddrPortFrom(h.Addr, uint16(port)), banner)
}

// ServeAt starts a banner server on the host at addr, one of its own
// addresses (Addr, or one Alias gave it).
func (h *Host) ServeAt(t T, addr netip.AddrPort, banner string) *Server {
	t.Helper()
	s := &Server{Addr: addr, Banner: banner}
	l, err := h.Listen("tcp4", s.Addr.String())
	if err != nil {
		t.Fatalf("test server on %s: %v", s.Addr, err)
	}
	s.l = l
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
			go func() {
				defer c.Close()
				fmt.Fprintln(c, banner)
				_, _ = bufio.NewReader(c).ReadString('\n')
			}()
		}
	}()
	return s
}

// Listen opens a listener inside the host's namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	return listenIn(h.fd, network, addr)
}

// ListenPacket opens a packet listener inside the host's namespace.
func (h *Host) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := nsutil.Do(h.fd, func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// Start starts cmd inside the host's network namespace: the fork happens
// on a thread that joined the namespace, and the child keeps it.
func (h *Host) Start(cmd *exec.Cmd) error {
	return nsutil.Do(h.fd, cmd.Start)
}

// Dial dials addr from inside the host's namespace.
func (h *Host) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	return dialIn(h.fd, network, addr, timeout)
}

// ListenUplink opens a listener in the uplink namespace: a service of "the
// host itself" as the sandbox sees it.
func (w *World) ListenUplink(network, addr string) (net.Listener, error) {
	return listenIn(w.fd, network, addr)
}

// listenIn opens a listener from a thread inside the namespace fd; the
// socket keeps that namespace after the thread leaves it.
func listenIn(fd int, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := nsutil.Do(fd, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// DialFrom dials addr from inside the namespace at nsPath.
func DialFrom(nsPath, network, addr string, timeout time.Duration) (net.Conn, error) {
	fd, err := nsutil.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return dialIn(fd, network, addr, timeout)
}

func dialIn(fd int, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := nsutil.Do(fd, func() error {
		d := net.Dialer{Timeout: timeout}
		var err error
		c, err = d.Dial(network, addr)
		return err
	})
	return c, err
}

func (w *World) close() {
	_ = nsutil.Remove(w.Uplink)
	unix.Close(w.fd)
	for _, h := range w.hosts {
		unix.Close(h.fd)
	}
	ents, _ := os.ReadDir(w.dir)
	for _, e := range ents {
		_ = nsutil.Remove(filepath.Join(w.dir, e.Name()))
	}
	_ = os.RemoveAll(w.dir)
}

// ServeDNS answers A queries on the host's port 53 (UDP) from names; other
// names get NXDOMAIN. It counts the queries it saw.
func (h *Host) ServeDNS(t T, names map[string]netip.Addr) *DNSServer {
	t.Helper()
	pc, err := h.ListenPacket("udp4", netip.AddrPortFrom(h.Addr, 53).String())
	if err != nil {
		t.Fatalf("test DNS server on %s: %v", h.Addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	s := &DNSServer{}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.queries++
			s.mu.Unlock()
			if resp, ok := answer(buf[:n], names); ok {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
	return s
}

// DNSServer is a test resolver.
type DNSServer struct {
	mu      sync.Mutex
	queries int
}

// Queries is how many queries arrived.
func (s *DNSServer) Queries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

func answer(query []byte, names map[string]netip.Addr) ([]byte, bool) {
	var p dnsmessage.Parser
	hdr, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true, RecursionDesired: hdr.RecursionDesired})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	name := strings.TrimSuffix(q.Name.String(), ".")
	if a, ok := names[name]; ok && q.Type == dnsmessage.TypeA {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a.As4()})
	} else if !ok {
		b = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, RCode: dnsmessage.RCodeNameError})
		_ = b.StartQuestions()
		_ = b.Question(q)
	}
	out, err := b.Finish()
	return out, err == nil
}

// Leftovers names which of the inet table and the link are still present
// in the namespace at nsPath (the uplink a sandbox network used).
func Leftovers(t T, nsPath, link, table string) []string {
	t.Helper()
	fd, err := nsutil.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var out []string
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == table {
			out = append(out, "table "+table)
		}
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName(link); err == nil {
		out = append(out, "link "+link)
	}
	return out
}
