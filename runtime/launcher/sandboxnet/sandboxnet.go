// Package sandboxnet builds the network a sandbox in runsc's sandbox mode
// gets: a fresh network namespace per container (runsc strips the veth's
// addresses and routes when it takes the interface over, so a namespace is
// never reused), a veth pair whose peer lives in the uplink namespace, a
// default route via that peer, and one nftables table in the uplink that
// allows exactly the egress rules of the bundle and drops everything else.
// Host names in the rules are resolved here, on the trusted side, and
// pinned: the sandbox gets them through its generated /etc/hosts and needs
// no DNS. Everything is done through netlink; nothing shells out.
package sandboxnet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/netdest"
	"paseo.dev/paseo-policy/internal/nsutil"
	"paseo.dev/paseo-policy/policy/bundle"
)

// Resolver maps a host name to its IPv4 addresses.
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// SystemResolver resolves with the launcher's own resolver configuration.
func SystemResolver(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
}

// Config describes one sandbox network.
type Config struct {
	ID     string
	Egress bundle.Egress
	// StateDir holds the pinned namespace files and address leases.
	StateDir string
	// Uplink is the network namespace the veth peer lives in; empty means
	// the launcher's own (the host's). Forwarding to egress destinations
	// needs net.ipv4.ip_forward=1 there.
	Uplink string
	// Pool is the range sandbox links come from; zero means DefaultPool.
	Pool netip.Prefix
	// Link, when set, is the one /30 of Pool this network may take (a wake
	// rebuilds the link a checkpointed sandbox was configured with); taken
	// or busy, Setup fails.
	Link    netip.Prefix
	Resolve Resolver
	// Caps bounds the connections the sandbox may open; zero fields take
	// DefaultCaps.
	Caps Caps
	// GatewayPorts are TCP ports on the gateway the launcher serves itself
	// beside the routes (the workspace monitor): admitted from this
	// sandbox's address only, as the routes' ports are. A port a route
	// already has, or out of range, fails Setup.
	GatewayPorts []int
}

// Caps bounds what one sandbox can take of the host's connection tracking
// and of the masquerade ports toward destinations sandboxes share.
type Caps struct {
	// Conns is how many connections the sandbox may hold open at once
	// (conntrack entries it created that are not closed).
	Conns uint32
	// NewPerMinute and Burst bound how fast it may open new ones: closed
	// TCP connections stay in conntrack (TIME_WAIT, two minutes) and keep
	// their masquerade port, which the live cap does not count.
	NewPerMinute uint64
	Burst        uint32
}

// DefaultCaps are the launcher's caps. An agent talks to a model provider
// and a few tools over keep-alive connections: a dozen live ones is
// typical, so 256 leaves room for a package install's parallel fetches
// while 1000 sandboxes still fit the kernel's default conntrack size
// (262144 on a 24 GiB host). 20 new connections a second (burst 100) keep
// a sandbox's closed connections below about 2,400 (two minutes of
// TIME_WAIT), a tenth of the masquerade ports toward one shared provider
// address and port.
var DefaultCaps = Caps{Conns: 256, NewPerMinute: 1200, Burst: 100}

func (c Caps) withDefaults() Caps {
	if c.Conns == 0 {
		c.Conns = DefaultCaps.Conns
	}
	if c.NewPerMinute == 0 {
		c.NewPerMinute = DefaultCaps.NewPerMinute
	}
	if c.Burst == 0 {
		c.Burst = DefaultCaps.Burst
	}
	return c
}

// Pin is a resolved egress host name.
type Pin struct {
	Host  string       `json:"host"`
	Addrs []netip.Addr `json:"addrs"`
}

// Network is a sandbox's network, ready for runsc to join.
type Network struct {
	// NetnsPath is the pinned namespace file runsc joins.
	NetnsPath string     `json:"netns"`
	Peer      string     `json:"peer"`
	Inner     string     `json:"inner"`
	Table     string     `json:"table"`
	Gateway   netip.Addr `json:"gateway"`
	Address   netip.Addr `json:"address"`
	Pins      []Pin      `json:"pins"`
	Allowed   []Allow    `json:"allowed"`
	Uplink    string     `json:"uplink"`

	lease    *lease
	uplinkFD int
	// What this Network created, so teardown after a failed setup never
	// removes objects of another sandbox that happen to share a name.
	ownNetns, ownLink, ownTable bool
}

// Names derives the interface and table names for a container id. They are
// fixed by the id so that gc can find what a crashed launcher left.
func Names(id string) (peer, inner, table string) {
	sum := sha256.Sum256([]byte(id))
	h := hex.EncodeToString(sum[:])[:8]
	return "ppu" + h, "pps" + h, "paseo-" + h
}

// NetnsPath is where the namespace of container id is pinned.
func NetnsPath(stateDir, id string) string { return filepath.Join(stateDir, "netns", id) }

// LeaseDir is where address leases are kept.
func LeaseDir(stateDir string) string { return filepath.Join(stateDir, "leases") }

// Setup builds the sandbox network. On error everything it made is removed.
func Setup(ctx context.Context, cfg Config) (n *Network, err error) {
	if cfg.Egress.Mode != "sandbox" {
		return nil, fmt.Errorf("egress mode %q needs no sandbox network", cfg.Egress.Mode)
	}
	if cfg.Pool == (netip.Prefix{}) {
		cfg.Pool = DefaultPool
	}
	if cfg.Resolve == nil {
		cfg.Resolve = SystemResolver
	}
	peer, inner, table := Names(cfg.ID)
	n = &Network{Peer: peer, Inner: inner, Table: table, Uplink: cfg.Uplink, uplinkFD: -1,
		NetnsPath: NetnsPath(cfg.StateDir, cfg.ID)}
	defer func() {
		if err != nil {
			_ = n.Teardown()
			n = nil
		}
	}()

	if n.uplinkFD, err = nsutil.Open(cfg.Uplink); err != nil {
		return n, err
	}
	up, err := netlink.NewHandleAt(netns.NsHandle(n.uplinkFD))
	if err != nil {
		return n, fmt.Errorf("netlink in the uplink: %w", err)
	}
	defer up.Close()

	// Resolve before anything is created: a name that cannot be pinned
	// safely refuses the launch.
	if n.Pins, n.Allowed, err = resolveRules(ctx, cfg, cfg.Egress.Rules); err != nil {
		return n, err
	}
	if len(n.Allowed) > 0 {
		fwd, err := nsutil.ReadSysctl(n.uplinkFD, "ipv4/ip_forward")
		if err != nil || fwd != "1" {
			return n, fmt.Errorf("egress needs forwarding in the uplink namespace, but net.ipv4.ip_forward is %q; enable it there (the launcher does not change host routing on its own)", fwd)
		}
	}

	busy := func(link netip.Prefix) bool { return prefixInUse(up, link) }
	if n.lease, err = takeLease(LeaseDir(cfg.StateDir), cfg.Pool, cfg.ID, cfg.Link, busy); err != nil {
		return n, err
	}
	n.Gateway, n.Address = n.lease.gateway, n.lease.sandbox
	for _, a := range n.Allowed {
		if cfg.Pool.Contains(a.Addr) {
			return n, fmt.Errorf("egress address %s lies inside the sandbox address pool %s", a.Addr, cfg.Pool)
		}
	}

	sbFD, err := nsutil.Create(n.NetnsPath)
	if err != nil {
		return n, err
	}
	n.ownNetns = true
	defer unix.Close(sbFD)
	sb, err := netlink.NewHandleAt(netns.NsHandle(sbFD))
	if err != nil {
		return n, fmt.Errorf("netlink in the sandbox namespace: %w", err)
	}
	defer sb.Close()

	if err := up.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: inner, PeerNamespace: netlink.NsFd(sbFD)}); err != nil {
		return n, fmt.Errorf("creating veth %s/%s: %w", peer, inner, err)
	}
	n.ownLink = true
	if err := configureSandboxSide(sb, sbFD, inner, n.Address, n.Gateway); err != nil {
		return n, err
	}
	if err := configurePeer(up, n.uplinkFD, peer, n.Gateway); err != nil {
		return n, err
	}

	nft, err := nftables.New(nftables.WithNetNSFd(n.uplinkFD))
	if err != nil {
		return n, fmt.Errorf("nftables in the uplink: %w", err)
	}
	rs := &ruleset{table: table, peer: peer, sandbox: n.Address, gateway: n.Gateway, allow: n.Allowed, caps: cfg.Caps.withDefaults()}
	for _, r := range cfg.Egress.Routes {
		if r.Listen != "gateway" {
			return n, fmt.Errorf("route %s listens on %q; only the gateway is supported", r.Purpose, r.Listen)
		}
		rs.gatewayPorts = append(rs.gatewayPorts, r.Port)
	}
	for _, p := range cfg.GatewayPorts {
		if p < 1 || p > 65535 || slices.Contains(rs.gatewayPorts, p) {
			return n, fmt.Errorf("gateway port %d: out of range or already a route's", p)
		}
		rs.gatewayPorts = append(rs.gatewayPorts, p)
	}
	if tables, err := nft.ListTablesOfFamily(nftables.TableFamilyINet); err != nil {
		return n, fmt.Errorf("listing nftables tables: %w", err)
	} else if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table }) {
		return n, fmt.Errorf("nftables table %s already exists (is the id in use?)", table)
	}
	n.ownTable = true
	if err := rs.apply(nft); err != nil {
		return n, fmt.Errorf("programming egress rules: %w", err)
	}
	return n, nil
}

func configureSandboxSide(h *netlink.Handle, nsFD int, name string, addr, gw netip.Addr) error {
	// Without IPv6 on the link, runsc copies no link-local address into
	// netstack; the uplink drops non-IPv4 from the peer anyway.
	_ = nsutil.Sysctl(nsFD, "ipv6/conf/"+name+"/disable_ipv6", "1")
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("sandbox veth: %w", err)
	}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipnet(addr, 30)}); err != nil {
		return fmt.Errorf("sandbox address: %w", err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("sandbox veth up: %w", err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	def := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.IP(gw.AsSlice()), Dst: ipnet(netip.IPv4Unspecified(), 0)}
	if err := h.RouteAdd(def); err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	return nil
}

func configurePeer(h *netlink.Handle, nsFD int, name string, gw netip.Addr) error {
	_ = nsutil.Sysctl(nsFD, "ipv6/conf/"+name+"/disable_ipv6", "1")
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("peer veth: %w", err)
	}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipnet(gw, 30)}); err != nil {
		return fmt.Errorf("gateway address: %w", err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("peer veth up: %w", err)
	}
	return nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// prefixInUse reports whether the uplink already routes or owns addresses
// overlapping link; a sandbox link there would shadow or hijack them.
func prefixInUse(h *netlink.Handle, link netip.Prefix) bool {
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return true
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue // the default route overlaps everything by design
		}
		p, ok := netipPrefix(r.Dst)
		if ok && p.Bits() > 0 && p.Overlaps(link) {
			return true
		}
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return true
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && link.Contains(ip) {
			return true
		}
	}
	return false
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	ip, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip, ones), true
}

// resolveRules turns egress rules into address-level allows, resolving names
// on the trusted side. Hosts and addresses that would turn an egress grant
// into access to the host, its link or the cloud's metadata service
// (netdest: loopback, link-local, metadata, unspecified, multicast,
// broadcast, reserved, non-canonical notations) refuse the launch.
func resolveRules(ctx context.Context, cfg Config, rules []bundle.EgressRule) ([]Pin, []Allow, error) {
	var pins []Pin
	var allows []Allow
	resolved := map[string][]netip.Addr{}
	for _, r := range rules {
		if r.Proto != "tcp" && r.Proto != "udp" {
			return nil, nil, fmt.Errorf("egress rule for %s: protocol %q is not supported", r.Host, r.Proto)
		}
		if r.Port < 1 || r.Port > 65535 {
			return nil, nil, fmt.Errorf("egress rule for %s: port %d out of range", r.Host, r.Port)
		}
		addrs, ok := resolved[r.Host]
		if !ok {
			// The compiler refused these hosts already; a bundle that
			// still names one was not compiled here, so it fails closed
			// before anything is resolved.
			if v := netdest.Host(r.Host); v.Unsafe() {
				return nil, nil, &ResolveError{Err: fmt.Errorf("egress host %s: unsafe destination: %s", r.Host, v.Why)}
			}
			if a, err := netip.ParseAddr(r.Host); err == nil {
				addrs = []netip.Addr{a.Unmap()}
			} else {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				got, err := cfg.Resolve(rctx, r.Host)
				cancel()
				if err != nil {
					return nil, nil, &ResolveError{Err: fmt.Errorf("resolving egress host %s: %w", r.Host, err)}
				}
				for _, g := range got {
					if g = g.Unmap(); g.Is4() {
						addrs = append(addrs, g)
					}
				}
				slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
				addrs = slices.Compact(addrs)
				if len(addrs) == 0 {
					return nil, nil, &ResolveError{Err: fmt.Errorf("egress host %s has no IPv4 address", r.Host)}
				}
				pins = append(pins, Pin{Host: r.Host, Addrs: addrs})
			}
			for _, a := range addrs {
				if err := checkDestination(a); err != nil {
					return nil, nil, &ResolveError{Err: fmt.Errorf("egress host %s: %w", r.Host, err)}
				}
			}
			resolved[r.Host] = addrs
		}
		for _, a := range addrs {
			allows = append(allows, Allow{Addr: a, Proto: r.Proto, Port: r.Port, Purpose: r.Purpose})
		}
	}
	return pins, allows, nil
}

// checkDestination refuses what a name resolved to, with the classifier
// the compiler uses on the names themselves: a name may resolve (or be
// rebound) to the metadata service or the host's loopback.
func checkDestination(a netip.Addr) error {
	if !a.Is4() {
		return fmt.Errorf("%s is not IPv4; the sandbox network is IPv4 only", a)
	}
	if v := netdest.Addr(a); v.Unsafe() {
		return fmt.Errorf("unsafe destination: %s", v.Why)
	}
	return nil
}

// Hosts renders the sandbox's /etc/hosts: the compiled file with every
// "# pin: NAME" marker followed by the addresses resolved for NAME, then,
// when the bundle names a gateway (egress.json's), the gateway's address
// under its name. A marker without a resolved name, or a pinned name
// without a marker, is an error: what the sandbox resolves must be
// exactly what the rules allow.
func (n *Network) Hosts(compiled []byte, gateway *bundle.Gateway) ([]byte, error) {
	byHost := map[string][]netip.Addr{}
	for _, p := range n.Pins {
		byHost[p.Host] = p.Addrs
	}
	var b strings.Builder
	seen := map[string]bool{}
	for _, line := range strings.SplitAfter(string(compiled), "\n") {
		b.WriteString(line)
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "# pin: ")
		if !ok {
			continue
		}
		addrs, ok := byHost[name]
		if !ok {
			// An address literal needs no pin; a name must have one.
			if _, err := netip.ParseAddr(name); err == nil {
				continue
			}
			return nil, fmt.Errorf("hosts file pins %s, which no egress rule resolved", name)
		}
		if !strings.HasSuffix(line, "\n") {
			b.WriteString("\n")
		}
		for _, a := range addrs {
			fmt.Fprintf(&b, "%s\t%s\n", a, name)
		}
		seen[name] = true
	}
	for h := range byHost {
		if !seen[h] {
			return nil, fmt.Errorf("egress host %s has no pin marker in the compiled hosts file", h)
		}
	}
	if gateway != nil {
		if s := b.String(); s != "" && !strings.HasSuffix(s, "\n") {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "%s\t%s\n", n.Gateway, gateway.Name)
	}
	return []byte(b.String()), nil
}

// Counters reads the packet counters of the sandbox's rules by tag.
func (n *Network) Counters() (map[string]uint64, error) {
	c, err := nftables.New(nftables.WithNetNSFd(n.uplinkFD))
	if err != nil {
		return nil, err
	}
	return readCounters(c, n.Table)
}

// ListenGateway opens a TCP listener on the gateway address inside the
// uplink namespace, for the launcher's route proxies.
func (n *Network) ListenGateway(port int) (net.Listener, error) {
	var l net.Listener
	err := nsutil.Do(n.uplinkFD, func() error {
		var err error
		l, err = net.Listen("tcp4", netip.AddrPortFrom(n.Gateway, uint16(port)).String())
		return err
	})
	return l, err
}

// Teardown removes the table, the veth (both ends), the namespace and the
// lease. It is safe on a partly built network and reports every failure.
func (n *Network) Teardown() error {
	var errs []error
	if n.uplinkFD >= 0 {
		if c, err := nftables.New(nftables.WithNetNSFd(n.uplinkFD)); err == nil && n.ownTable {
			if err := deleteTable(c, n.Table); err != nil {
				errs = append(errs, fmt.Errorf("deleting table %s: %w", n.Table, err))
			}
		} else if err != nil {
			errs = append(errs, err)
		}
		if h, err := netlink.NewHandleAt(netns.NsHandle(n.uplinkFD)); err == nil && n.ownLink {
			if l, err := h.LinkByName(n.Peer); err == nil {
				if err := h.LinkDel(l); err != nil {
					errs = append(errs, fmt.Errorf("deleting veth %s: %w", n.Peer, err))
				}
			}
			h.Close()
		}
		unix.Close(n.uplinkFD)
		n.uplinkFD = -1
	}
	if n.ownNetns {
		if err := nsutil.Remove(n.NetnsPath); err != nil {
			errs = append(errs, err)
		}
	}
	if n.lease != nil {
		if err := n.lease.release(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// KeepLease makes Teardown leave the address lease in place: a hibernated
// sandbox keeps its link for the wake (Config.Link takes it over).
func (n *Network) KeepLease() { n.lease = nil }

// ReleaseLeases removes the address leases of container id (a hibernated
// sandbox that is deleted).
func ReleaseLeases(stateDir, id string) error {
	leases, err := Leases(LeaseDir(stateDir))
	errs := []error{err}
	for idx, owner := range leases {
		if owner == id {
			errs = append(errs, os.Remove(filepath.Join(LeaseDir(stateDir), idx)))
		}
	}
	return errors.Join(errs...)
}

// Remove deletes whatever a sandbox network of id left in the uplink and
// the state dir: its table, peer veth, pinned namespace and leases. gc
// uses it for launches whose launcher is gone; missing pieces are fine.
func Remove(stateDir, id, uplink string) error {
	n := &Network{uplinkFD: -1, NetnsPath: NetnsPath(stateDir, id), ownNetns: true, ownLink: true, ownTable: true}
	n.Peer, n.Inner, n.Table = Names(id)
	fd, err := nsutil.Open(uplink)
	if err != nil {
		return err
	}
	n.uplinkFD = fd
	errs := []error{n.Teardown()}
	leases, err := Leases(LeaseDir(stateDir))
	errs = append(errs, err)
	for idx, owner := range leases {
		if owner == id {
			errs = append(errs, os.Remove(filepath.Join(LeaseDir(stateDir), idx)))
		}
	}
	return errors.Join(errs...)
}

// CheckHost resolves host as Dialer does and refuses it unless it has an
// address egress could be allowed to.
func (n *Network) CheckHost(ctx context.Context, resolve Resolver, host string) error {
	addrs, err := resolveSafe(ctx, resolve, host)
	if err == nil && len(addrs) == 0 {
		err = fmt.Errorf("%s has no IPv4 address", host)
	}
	if err != nil {
		return &ResolveError{Err: err}
	}
	return nil
}

// ResolveError is a host name (an egress rule's, or CheckHost's) that
// cannot be pinned: it does not resolve, has no IPv4 address, or names or
// resolves to an unsafe destination. Its text is Err's.
type ResolveError struct{ Err error }

func (e *ResolveError) Error() string { return e.Err.Error() }

func (e *ResolveError) Unwrap() error { return e.Err }

// resolveSafe is host's IPv4 addresses, each held to checkDestination.
func resolveSafe(ctx context.Context, resolve Resolver, host string) ([]netip.Addr, error) {
	if resolve == nil {
		resolve = SystemResolver
	}
	if v := netdest.Host(host); v.Unsafe() {
		return nil, fmt.Errorf("%s: unsafe destination: %s", host, v.Why)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := resolve(rctx, host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", host, err)
		}
		for _, g := range got {
			addrs = append(addrs, g.Unmap())
		}
	}
	for _, a := range addrs {
		if err := checkDestination(a); err != nil {
			return nil, fmt.Errorf("%s: %w", host, err)
		}
	}
	return addrs, nil
}

// Dialer connects from the uplink namespace (the host's network) to a
// host:port on the trusted side: a name is resolved with resolve (nil:
// SystemResolver), and every address is held to the classifier egress
// rules are (no loopback, link-local, metadata, ...), so a name rebound
// to the host itself or the metadata service is refused. The model
// route's proxy reaches the provider through it.
func (n *Network) Dialer(resolve Resolver) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		// Every address is checked before any is dialled: a name that
		// resolves to one unsafe address is refused whole.
		addrs, err := resolveSafe(ctx, resolve, host)
		if err != nil {
			return nil, err
		}
		var errs []error
		for _, a := range addrs {
			var c net.Conn
			err := nsutil.Do(n.uplinkFD, func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, "tcp4", net.JoinHostPort(a.String(), port))
				return err
			})
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return nil, fmt.Errorf("%s has no address", host)
		}
		return nil, errors.Join(errs...)
	}
}
