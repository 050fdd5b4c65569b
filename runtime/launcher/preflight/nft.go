package preflight

import (
	"fmt"
	"net/netip"
	"runtime"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// How nftables usability is checked
//
// Listing tables in the host namespace would only prove that the netlink
// socket opens; it would not show that the kernel accepts the objects the
// launcher programs (an inet table, a named set, a base chain with a drop
// policy on the output hook, payload/meta matches, lookup, counter, verdict).
// Creating those in the host namespace would modify host rules, even if only
// briefly. So the probe creates a fresh, empty network namespace (unshare
// CLONE_NEWNET on a locked OS thread that is thrown away afterwards), builds
// that ruleset there in one batch, reads it back, deletes it, and closes the
// namespace, which the kernel then destroys. The host's namespace and rules
// are never touched; no process or thread is left in the private namespace.

const (
	probeTable = "paseo_preflight"
	probeSet   = "allow4"
	probeChain = "output"
)

// checkNftables runs the probe and returns what it proved.
func checkNftables() (string, error) {
	nsFD, err := newNetNS()
	if err != nil {
		return "", fmt.Errorf("cannot create a private network namespace for the nftables probe: %w", err)
	}
	defer unix.Close(nsFD)
	if err := probeNftables(nsFD); err != nil {
		return "", fmt.Errorf("nftables probe in a private network namespace: %w", err)
	}
	return "created an inet table, named set, output base chain (policy drop) and a meta/payload/lookup/counter/accept rule in a private network namespace, read them back and deleted them; host rules untouched", nil
}

// newNetNS returns an fd for a new, empty network namespace. The unshare
// happens on a dedicated goroutine that locks its OS thread and exits
// without unlocking it, so the Go runtime discards that thread instead of
// returning a thread in the wrong namespace to the scheduler.
func newNetNS() (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately never unlocked; see above.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{-1, fmt.Errorf("unshare(CLONE_NEWNET): %w", err)}
			return
		}
		fd, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{-1, fmt.Errorf("opening the new namespace: %w", err)}
			return
		}
		ch <- result{fd, nil}
	}()
	r := <-ch
	return r.fd, r.err
}

// probeNftables programs and removes a small egress-style ruleset in the
// network namespace nsFD. nsFD must not be the host namespace.
func probeNftables(nsFD int) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsFD), nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer c.CloseLasting()

	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: probeTable})
	set := &nftables.Set{Table: table, Name: probeSet, KeyType: nftables.TypeIPAddr}
	addr := netip.MustParseAddr("192.0.2.1").As4() // TEST-NET-1
	if err := c.AddSet(set, []nftables.SetElement{{Key: addr[:]}}); err != nil {
		return fmt.Errorf("adding set: %w", err)
	}
	policy := nftables.ChainPolicyDrop
	chain := c.AddChain(&nftables.Chain{
		Name: probeChain, Table: table,
		Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput,
		Priority: nftables.ChainPriorityFilter, Policy: &policy,
	})
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(443)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("committing the probe ruleset: %w", err)
	}

	rules, err := c.GetRules(table, chain)
	if err != nil {
		return fmt.Errorf("reading rules back: %w", err)
	}
	if len(rules) != 1 {
		return fmt.Errorf("read back %d rules, want 1", len(rules))
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		return fmt.Errorf("reading set elements back: %w", err)
	}
	if len(elems) != 1 {
		return fmt.Errorf("read back %d set elements, want 1", len(elems))
	}

	c.DelTable(table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("deleting the probe table: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("listing tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == probeTable {
			return fmt.Errorf("probe table still present after delete")
		}
	}
	return nil
}
