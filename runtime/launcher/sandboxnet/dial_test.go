package sandboxnet

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// SafeDialer refuses a host with any unsafe address before dialling, and
// dials a safe one; CheckSafeHost judges the same way. The control is a
// listener on loopback that a plain dialer reaches.
func TestSafeDialer(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	to := func(addrs ...string) Resolver {
		return func(context.Context, string) ([]netip.Addr, error) {
			var out []netip.Addr
			for _, a := range addrs {
				out = append(out, netip.MustParseAddr(a))
			}
			return out, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	if c, err := d.DialContext(ctx, "tcp4", l.Addr().String()); err != nil {
		t.Fatalf("control: a plain dialer does not reach the loopback listener: %v", err)
	} else {
		c.Close()
	}
	for name, r := range map[string]Resolver{
		"loopback":             to("127.0.0.1"),
		"one unsafe of two":    to("198.18.0.1", "127.0.0.1"),
		"the metadata address": to("169.254.169.254"),
	} {
		_, err := SafeDialer(r)(ctx, "tcp", "provider.test:"+port)
		var re *ResolveError
		if !errors.As(err, &re) {
			t.Errorf("%s: dial error %v, want a ResolveError before any dial", name, err)
		}
		if err := CheckSafeHost(ctx, r, "provider.test"); !errors.As(err, &re) {
			t.Errorf("%s: CheckSafeHost %v, want a ResolveError", name, err)
		}
	}
	// A safe address passes the check and reaches the dial, which a
	// cancelled context ends before any packet is sent (the test sends
	// none to an address it does not serve).
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	_, err = SafeDialer(to("198.18.0.1"))(done, "tcp", "provider.test:"+port)
	var re *ResolveError
	if !errors.Is(err, context.Canceled) || errors.As(err, &re) {
		t.Errorf("a safe address: %v, want the dial's own context error", err)
	}
	if err := CheckSafeHost(ctx, to("198.18.0.1"), "provider.test"); err != nil {
		t.Errorf("CheckSafeHost of a safe address: %v", err)
	}
}
