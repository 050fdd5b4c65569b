package sandboxnet

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultPool is the private range sandbox links are carved from, one /30
// per sandbox: .1 is the gateway (the veth peer), .2 the sandbox.
var DefaultPool = netip.MustParsePrefix("10.213.0.0/16")

// lease is one /30 taken from the pool, recorded as a file named by its
// index whose content is the container id. Files are created with O_EXCL,
// so two launchers sharing a state root never hand out the same link.
type lease struct {
	path    string
	link    netip.Prefix
	gateway netip.Addr
	sandbox netip.Addr
}

// slots is how many /30 links fit in pool.
func slots(pool netip.Prefix) int {
	if !pool.Addr().Is4() || pool.Bits() > 30 {
		return 0
	}
	return 1 << (30 - pool.Bits())
}

func linkAt(pool netip.Prefix, i int) netip.Prefix {
	base := pool.Masked().Addr().As4()
	n := binary.BigEndian.Uint32(base[:]) + uint32(i)*4
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], n)
	return netip.PrefixFrom(netip.AddrFrom4(a), 30)
}

// takeLease reserves a free /30 for id. It starts at a slot derived from
// the id (so concurrent launches rarely contend) and skips slots that are
// leased or that busy reports as already in use in the uplink.
// want, when valid, is the only link taken: a wake needs the link the
// checkpointed netstack was configured with.
func takeLease(dir string, pool netip.Prefix, id string, want netip.Prefix, busy func(netip.Prefix) bool) (*lease, error) {
	n := slots(pool)
	if n == 0 {
		return nil, fmt.Errorf("address pool %s must be IPv4 and at least a /30", pool)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(id))
	start := int(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
	tries := n
	if want.IsValid() {
		i, ok := linkIndex(pool, want)
		if !ok {
			return nil, fmt.Errorf("link %s is not a /30 of the address pool %s", want, pool)
		}
		start, tries = i, 1
	}
	for k := 0; k < tries; k++ {
		i := (start + k) % n
		link := linkAt(pool, i)
		if busy(link) {
			continue
		}
		p := filepath.Join(dir, strconv.Itoa(i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			if owner, _ := os.ReadFile(p); want.IsValid() && strings.TrimSpace(string(owner)) == id {
				// The lease a hibernated sandbox kept (KeepLease): its wake's.
				gw := link.Addr().Next()
				return &lease{path: p, link: link, gateway: gw, sandbox: gw.Next()}, nil
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		_, werr := f.WriteString(id + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			_ = os.Remove(p)
			return nil, werr
		}
		gw := link.Addr().Next()
		return &lease{path: p, link: link, gateway: gw, sandbox: gw.Next()}, nil
	}
	if want.IsValid() {
		return nil, fmt.Errorf("link %s is leased or in use by another sandbox", want)
	}
	return nil, fmt.Errorf("address pool %s is exhausted", pool)
}

// linkIndex is the slot of link in pool, if link is one of its /30s.
func linkIndex(pool netip.Prefix, link netip.Prefix) (int, bool) {
	if slots(pool) == 0 || link.Bits() != 30 || !pool.Contains(link.Addr()) {
		return 0, false
	}
	base, a := pool.Masked().Addr().As4(), link.Masked().Addr().As4()
	i := int((binary.BigEndian.Uint32(a[:]) - binary.BigEndian.Uint32(base[:])) / 4)
	return i, linkAt(pool, i) == link.Masked()
}

// LeasedLink is the /30 leased to container id, if it holds one.
func LeasedLink(stateDir string, pool netip.Prefix, id string) (netip.Prefix, bool, error) {
	if pool == (netip.Prefix{}) {
		pool = DefaultPool
	}
	leases, err := Leases(LeaseDir(stateDir))
	if err != nil {
		return netip.Prefix{}, false, err
	}
	for idx, owner := range leases {
		if owner != id {
			continue
		}
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i >= slots(pool) {
			return netip.Prefix{}, false, fmt.Errorf("lease %s of %s is not a slot of %s", idx, id, pool)
		}
		return linkAt(pool, i), true, nil
	}
	return netip.Prefix{}, false, nil
}

func (l *lease) release() error {
	if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Leases lists the lease files under dir as index -> container id, for gc.
func Leases(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		out[e.Name()] = strings.TrimSpace(string(b))
	}
	return out, nil
}
