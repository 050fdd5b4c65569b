package probe

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"
)

// Network probes. Every dial uses the probe's context, so the per-probe
// timeout bounds a silently dropped SYN or datagram.

// checkHostPort validates a host:port input ("" means not configured).
// A host name is accepted but resolved inside the sandbox at dial time.
func checkHostPort(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%q: want host:port", addr)
	}
	return nil
}

// checkIPPort validates the resolver address, which must be an IP: a name
// would need a lookup, i.e. another resolver, before the probe even starts.
func checkIPPort(addr string) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) == nil {
		return fmt.Errorf("%q: want ip:port", addr)
	}
	return checkHostPort(addr)
}

// dial connects with the probe's deadline.
func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// connectEvidence explains a failed TCP connect. ECONNREFUSED is called
// out: the connection was stopped, but something on the path (the target,
// a filter, or the sandbox's own network stack) answered with a reset.
func connectEvidence(err error) string {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "ECONNREFUSED (a reset came back)"
	}
	return errText(err)
}

// unixSocket connects to a host Unix socket, trying the socket types in
// turn: EPROTOTYPE only means the socket exists with another type, and a
// supervisor may well use SOCK_SEQPACKET or SOCK_DGRAM.
func unixSocket(ctx context.Context, path string) outcome {
	var err error
	for _, network := range []string{"unix", "unixpacket", "unixgram"} {
		var conn net.Conn
		conn, err = dial(ctx, network, path)
		if err == nil {
			conn.Close()
			return outcome{Escaped, "connected (" + network + ")"}
		}
		if !errors.Is(err, syscall.EPROTOTYPE) {
			break
		}
	}
	return outcome{Blocked, errText(err)}
}

// decoyTCP connects to an endpoint the policy does not allow. The connect
// alone is the escape; the line sent and the banner read back are there so
// a transparent proxy that accepts every SYN still shows up in evidence.
func decoyTCP(ctx context.Context, addr string) outcome {
	if addr == "" {
		return notConfigured("decoy")
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return outcome{Blocked, connectEvidence(err)}
	}
	defer conn.Close()
	deadline := time.Now().Add(500 * time.Millisecond)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	sent, _ := conn.Write([]byte("paseo-probe\n"))
	banner := make([]byte, 256)
	n, rerr := conn.Read(banner)
	evidence := fmt.Sprintf("connected; sent %d bytes; banner %d bytes", sent, n)
	if rerr != nil && n == 0 {
		evidence += " (read: " + errText(rerr) + ")"
	}
	return outcome{Escaped, evidence}
}

// hostTCP connects to the host or gateway itself, where daemons listening
// on all interfaces would be reachable.
func hostTCP(ctx context.Context, addr string) outcome {
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return outcome{Blocked, connectEvidence(err)}
	}
	conn.Close()
	return outcome{Escaped, "connected"}
}

// dnsQuery builds a DNS query by hand (no resolver library, which could
// consult /etc/resolv.conf or cache): one A question for name, recursion
// desired.
func dnsQuery(id uint16, name string) []byte {
	msg := binary.BigEndian.AppendUint16(nil, id)
	msg = binary.BigEndian.AppendUint16(msg, 0x0100) // flags: RD
	msg = binary.BigEndian.AppendUint16(msg, 1)      // QDCOUNT
	msg = append(msg, 0, 0, 0, 0, 0, 0)              // AN, NS, AR counts
	for _, label := range splitLabels(name) {
		msg = append(msg, byte(len(label)))
		msg = append(msg, label...)
	}
	msg = append(msg, 0)                         // root label
	msg = binary.BigEndian.AppendUint16(msg, 1)  // QTYPE A
	return binary.BigEndian.AppendUint16(msg, 1) // QCLASS IN
}

// splitLabels splits a dotted name into its labels.
func splitLabels(name string) []string {
	var labels []string
	start := 0
	for i := 0; i <= len(name); i++ {
		if i == len(name) || name[i] == '.' {
			if i > start {
				labels = append(labels, name[start:i])
			}
			start = i + 1
		}
	}
	return labels
}

// dnsUnallowed sends one query to a resolver the policy does not allow;
// any reply at all within the timeout is an escape (DNS is a classic
// exfiltration channel, so even a refusal answer counts).
func dnsUnallowed(ctx context.Context, addr string) outcome {
	if addr == "" {
		return notConfigured("dns")
	}
	conn, err := dial(ctx, "udp", addr)
	if err != nil {
		return outcome{Blocked, "socket: " + errText(err)}
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	if _, err := conn.Write(dnsQuery(id, "probe.test")); err != nil {
		return outcome{Blocked, "send: " + errText(err)}
	}
	reply := make([]byte, 512)
	n, err := conn.Read(reply)
	switch {
	case n > 0:
		match := "id differs"
		if n >= 2 && binary.BigEndian.Uint16(reply) == id {
			match = "id matches"
		}
		return outcome{Escaped, fmt.Sprintf("reply of %d bytes (%s)", n, match)}
	case errors.Is(err, syscall.ECONNREFUSED):
		return outcome{Blocked, "no DNS reply; ICMP port unreachable came back (ECONNREFUSED)"}
	default:
		return outcome{Blocked, "no reply: " + errText(err)}
	}
}

// allowedReachable is the positive network check: the endpoint the policy
// allows must connect, or the sandbox is over-blocking.
func allowedReachable(ctx context.Context, addr string) outcome {
	if addr == "" {
		return notConfigured("allowed")
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return outcome{Unreachable, connectEvidence(err)}
	}
	conn.Close()
	return outcome{Reachable, "connected"}
}

// allowedHTTPS makes a real HTTPS request to the allowed endpoint: TLS
// with the server name from the URL, verified against caFile, as Pi's
// provider client would. connectTo, when set, replaces the address dialled
// (a control run outside the sandbox has no pinned names).
func allowedHTTPS(ctx context.Context, rawURL, caFile, connectTo string) outcome {
	if rawURL == "" || caFile == "" {
		return notConfigured("allowed-url/-ca-file")
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return outcome{Inconclusive, "reading the CA file: " + errText(err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return outcome{Inconclusive, "no certificate in the CA file"}
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	if connectTo != "" {
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dial(ctx, network, connectTo)
		}
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return outcome{Inconclusive, "bad URL"}
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return outcome{Unreachable, connectEvidence(err)}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return outcome{Reachable, fmt.Sprintf("HTTPS %d, TLS verified for %s", resp.StatusCode, req.URL.Hostname())}
}
