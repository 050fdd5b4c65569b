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
func takeLease(dir string, pool netip.Prefix, id string, busy func(netip.Prefix) bool) (*lease, error) {
	n := slots(pool)
	if n == 0 {
		return nil, fmt.Errorf("address pool %s must be IPv4 and at least a /30", pool)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(id))
	start := int(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
	for k := 0; k < n; k++ {
		i := (start + k) % n
		link := linkAt(pool, i)
		if busy(link) {
			continue
		}
		p := filepath.Join(dir, strconv.Itoa(i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
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
	return nil, fmt.Errorf("address pool %s is exhausted", pool)
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
