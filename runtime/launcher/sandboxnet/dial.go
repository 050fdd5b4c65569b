package sandboxnet

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// SafeDialer is Network.Dialer from the caller's own network namespace,
// for a proxy that runs where its host's network is the one it has (the
// cluster gateway, runtime/gateway): a name is resolved with resolve
// (nil: the system's) at every dial, and a host with any unsafe address
// (loopback, link-local, metadata, ...) is refused whole before any
// address is dialled.
func SafeDialer(resolve Resolver) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		addrs, err := resolveSafe(ctx, resolve, host)
		if err != nil {
			return nil, &ResolveError{Err: err}
		}
		var errs []error
		for _, a := range addrs {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort(a.String(), port))
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

// CheckSafeHost is Network.CheckHost without a sandbox network: host must
// resolve, with resolve, to IPv4 addresses that are all safe.
func CheckSafeHost(ctx context.Context, resolve Resolver, host string) error {
	addrs, err := resolveSafe(ctx, resolve, host)
	if err == nil && len(addrs) == 0 {
		err = fmt.Errorf("%s has no IPv4 address", host)
	}
	if err != nil {
		return &ResolveError{Err: err}
	}
	return nil
}
