package sandboxnet

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Where the filter sits
//
// runsc's netstack writes frames straight onto the sandbox end of the veth,
// so rules inside the sandbox namespace never see its traffic (measured).
// Every rule therefore lives in the uplink namespace, keyed on the peer
// interface: traffic the sandbox sends arrives there as input (to the
// gateway itself) or forward (to anywhere else). One inet table per sandbox
// holds all of it, so teardown is one table delete and two sandboxes never
// share a rule. Base chains accept by default so other traffic on the
// uplink is untouched; everything from or to the peer interface that no
// rule allows is dropped.

// Allow is one resolved egress destination.
type Allow struct {
	Addr  netip.Addr
	Proto string // tcp | udp
	Port  int
	// Purpose names the grant in rule user data, so counters can be read
	// back per purpose.
	Purpose string
}

// ruleset is what one sandbox's table contains.
type ruleset struct {
	table   string
	peer    string // peer interface name in the uplink
	sandbox netip.Addr
	gateway netip.Addr
	allow   []Allow
	// gatewayPorts are TCP ports on the gateway address the sandbox may
	// reach: the launcher's private route proxies.
	gatewayPorts []int
	caps         Caps
}

// Rule tags (user data) that tests and `ps` read counters by.
const (
	TagSpoof        = "drop-spoofed"
	TagNotIPv4      = "drop-not-ipv4"
	TagEgressDrop   = "drop-egress"
	TagInboundDrop  = "drop-inbound"
	TagGatewayDrop  = "drop-gateway"
	TagAllowPrefix  = "allow-"
	TagRoutePrefix  = "route-"
	TagEstablished  = "established"
	TagMasquerade   = "masquerade"
	TagOutboundDrop = "drop-host-to-sandbox"
	// New connections refused because the sandbox already holds its cap
	// of live connections, or opens them faster than its rate.
	TagConnLimit = "drop-conn-limit"
	TagConnRate  = "drop-conn-rate"
)

func (r *ruleset) apply(c *nftables.Conn) error {
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: r.table})
	accept := nftables.ChainPolicyAccept
	chain := func(name string, hook *nftables.ChainHook, typ nftables.ChainType, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
	}
	add := func(ch *nftables.Chain, tag string, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(tag), Exprs: exprs})
	}
	in, out := iif(r.peer), oif(r.peer)

	// Every new connection the sandbox opens, to the gateway or beyond,
	// passes the caps first: prerouting sees both before routing splits
	// them into input and forward, and runs after conntrack, so "new" and
	// the count are conntrack's own. The count is this rule's list of the
	// sandbox's live connections (closed TCP ones drop out of it), so no
	// sandbox's flood touches another's allowance.
	pre := chain("prerouting", nftables.ChainHookPrerouting, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	add(pre, TagConnLimit, cat(in, ctNew(), &expr.Connlimit{Count: r.caps.Conns, Flags: expr.NFT_CONNLIMIT_F_INV}, counter(), drop())...)
	add(pre, TagConnRate, cat(in, ctNew(), &expr.Limit{Type: expr.LimitTypePkts, Rate: r.caps.NewPerMinute, Unit: expr.LimitTimeMinute,
		Burst: r.caps.Burst, Over: true}, counter(), drop())...)

	// Traffic from the sandbox to anywhere but the gateway.
	fwd := chain("forward", nftables.ChainHookForward, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	add(fwd, TagNotIPv4, cat(in, notIPv4(), drop())...)
	add(fwd, TagSpoof, cat(in, saddrNot(r.sandbox), drop())...)
	add(fwd, TagEstablished, cat(in, established(), acceptV())...)
	for _, a := range r.allow {
		add(fwd, TagAllowPrefix+a.Purpose, cat(in, daddr(a.Addr), l4(a.Proto), dport(a.Port), counter(), acceptV())...)
	}
	add(fwd, TagEgressDrop, cat(in, counter(), drop())...)
	// Nothing outside may open a connection to the sandbox.
	add(fwd, TagEstablished, cat(out, established(), acceptV())...)
	add(fwd, TagInboundDrop, cat(out, counter(), drop())...)

	// Traffic from the sandbox to the gateway (the uplink host itself).
	input := chain("input", nftables.ChainHookInput, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	add(input, TagNotIPv4, cat(in, notIPv4(), drop())...)
	add(input, TagSpoof, cat(in, saddrNot(r.sandbox), drop())...)
	add(input, TagEstablished, cat(in, established(), acceptV())...)
	for _, p := range r.gatewayPorts {
		add(input, fmt.Sprintf("%s%d", TagRoutePrefix, p), cat(in, daddr(r.gateway), l4("tcp"), dport(p), counter(), acceptV())...)
	}
	add(input, TagGatewayDrop, cat(in, counter(), drop())...)

	// The uplink host may answer the sandbox but not open connections to it.
	output := chain("output", nftables.ChainHookOutput, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	add(output, TagEstablished, cat(out, established(), acceptV())...)
	add(output, TagOutboundDrop, cat(out, counter(), drop())...)

	if len(r.allow) > 0 {
		post := chain("postrouting", nftables.ChainHookPostrouting, nftables.ChainTypeNAT, nftables.ChainPriorityNATSource)
		add(post, TagMasquerade, cat(ipv4(), saddr(r.sandbox), oifNot(r.peer), &expr.Masq{})...)
	}
	return c.Flush()
}

func cat(parts ...any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case []expr.Any:
			out = append(out, v...)
		case expr.Any:
			out = append(out, v)
		}
	}
	return out
}

func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func iif(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)}}
}

func oif(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)}}
}

func oifNot(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(name)}}
}

func ipv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

func notIPv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

// The address matches come after an IPv4 check in every chain (non-IPv4
// from the peer is dropped first), so the network-header offsets are
// IPv4's: saddr at 12, daddr at 16.
func saddr(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]}}
}

func saddrNot(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: b[:]}}
}

func daddr(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]}}
}

func l4(proto string) []expr.Any {
	p := byte(unix.IPPROTO_TCP)
	if proto == "udp" {
		p = unix.IPPROTO_UDP
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func dport(port int) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))}}
}

func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ctNew matches a packet that opens a connection (conntrack state new).
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func counter() expr.Any { return &expr.Counter{} }
func drop() expr.Any    { return &expr.Verdict{Kind: expr.VerdictDrop} }
func acceptV() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }

// readCounters sums packet counters per rule tag in the sandbox's table.
func readCounters(c *nftables.Conn, table string) (map[string]uint64, error) {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: table}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					out[string(r.UserData)] += ctr.Packets
				}
			}
		}
	}
	return out, nil
}

// deleteTable removes a sandbox's table if it exists.
func deleteTable(c *nftables.Conn, table string) error {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if t.Name == table {
			c.DelTable(t)
			return c.Flush()
		}
	}
	return nil
}
