package netdest

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		want Class
	}{
		// Fine: public names and addresses, private ranges (a model on the
		// LAN is a legitimate endpoint), IPv6 globals, a trailing-dot FQDN.
		{"llm.example.test", OK},
		{"LLM.Example.Test", OK},
		{"api.example.com.", OK},
		{"1e100.net", OK},
		{"192.0.2.10", OK},
		{"10.1.2.3", OK},
		{"100.64.0.1", OK},
		{"2001:db8::1", OK},
		{"::ffff:192.0.2.10", OK},
		{"64:ff9b::c000:20a", OK},

		{"localhost", Loopback},
		{"LocalHost", Loopback},
		{"api.localhost", Loopback},
		{"localhost.", Loopback},
		{"127.0.0.1", Loopback},
		{"127.8.9.10", Loopback},
		{"::1", Loopback},
		{"::ffff:127.0.0.1", Loopback},
		{"::ffff:7f00:1", Loopback},
		{"::127.0.0.1", Loopback},
		{"64:ff9b::7f00:1", Loopback},
		{"2002:7f00:1::", Loopback},

		{"169.254.1.1", LinkLocal},
		{"fe80::1", LinkLocal},
		{"febf::1", LinkLocal},
		{"fe80::1%eth0", LinkLocal},
		{"::ffff:169.254.1.1", LinkLocal},

		{"0.0.0.0", Unspecified},
		{"0.1.2.3", Unspecified},
		{"::", Unspecified},
		{"::ffff:0.0.0.0", Unspecified},

		{"224.0.0.1", Multicast},
		{"239.255.255.250", Multicast},
		{"ff02::1", Multicast},
		{"ff05::2", Multicast},
		{"255.255.255.255", Broadcast},
		{"240.0.0.1", Reserved},

		{"169.254.169.254", Metadata},
		{"169.254.170.2", Metadata},
		{"100.100.100.200", Metadata},
		{"168.63.129.16", Metadata},
		{"fd00:ec2::254", Metadata},
		{"FD00:EC2::254", Metadata},
		{"fd20:ce::254", Metadata},
		{"::ffff:169.254.169.254", Metadata},
		{"::ffff:a9fe:a9fe", Metadata},
		{"::169.254.169.254", Metadata},
		{"64:ff9b::a9fe:a9fe", Metadata},
		{"metadata.google.internal", Metadata},
		{"Metadata.Google.Internal.", Metadata},
		{"metadata", Metadata},
		{"instance-data.ec2.internal", Metadata},
		{"metadata.tencentyun.com", Metadata},

		// Notations parsers disagree on.
		{"2130706433", NonCanonical},
		{"0x7f000001", NonCanonical},
		{"0177.0.0.1", NonCanonical},
		{"0x7f.0.0.1", NonCanonical},
		{"0x7F.0.0.1", NonCanonical},
		{"127.1", NonCanonical},
		{"127.0.1", NonCanonical},
		{"127.000.000.001", NonCanonical},
		{"169.254.169.254.", NonCanonical},
		{"2852039166", NonCanonical},
		{"0xa9fea9fe", NonCanonical},
		{"0251.0376.0251.0376", NonCanonical},
		{"3221225994", NonCanonical}, // 192.0.2.10: fine address, ambiguous form
		{"1.2.3.4.5", NonCanonical},
		{"example.123", NonCanonical},
		{"256.1.1.1", NonCanonical},
		{"::192.0.2.10", NonCanonical},
		{"１２７.０.０.１", NonCanonical},
		{"bücher.example", NonCanonical},
		{"a..b", NonCanonical},
		{".", NonCanonical},
		{"", NonCanonical},
		{"1:2", NonCanonical},
	} {
		got := Host(tc.host)
		if got.Class != tc.want {
			t.Errorf("Host(%q) = %q (%s), want %q", tc.host, got.Class, got.Why, tc.want)
		}
		if got.Unsafe() && got.Why == "" {
			t.Errorf("Host(%q) refused without a reason", tc.host)
		}
	}
}

func TestParseLooseIPv4(t *testing.T) {
	for in, want := range map[string]string{
		"2130706433":          "127.0.0.1",
		"0x7f.0.0.1":          "127.0.0.1",
		"0177.0.0.1":          "127.0.0.1",
		"127.1":               "127.0.0.1",
		"127.0.1":             "127.0.0.1",
		"0251.0376.0251.0376": "169.254.169.254",
		"169.254.43518":       "169.254.169.254",
		"0xa9fea9fe":          "169.254.169.254",
		"0x":                  "0.0.0.0",
	} {
		got, ok := parseLooseIPv4(in)
		if !ok || got.String() != want {
			t.Errorf("parseLooseIPv4(%q) = %v, %v; want %s", in, got, ok, want)
		}
	}
	for _, in := range []string{"256.0.0.1", "1.2.3.256", "1.2.3.4.5", "0x1ffffffff", "1.16777216", "09", "1..2"} {
		if got, ok := parseLooseIPv4(in); ok {
			t.Errorf("parseLooseIPv4(%q) = %v, want failure", in, got)
		}
	}
}

// TestNonCanonicalExplained: a refused notation says what it means, so the
// operator sees that 0x7f.1 is loopback.
func TestNonCanonicalExplained(t *testing.T) {
	v := Host("0x7f.1")
	if v.Class != NonCanonical || !strings.Contains(v.Why, "127.0.0.1") || !strings.Contains(v.Why, "loopback") {
		t.Errorf("Host(0x7f.1) = %+v", v)
	}
}

// FuzzHost: never panics; whatever it accepts is a name that is not
// numeric, or an address in canonical form that Go's own classifiers call
// routable; and a loose IPv4 reading of an accepted host is the host itself.
func FuzzHost(f *testing.F) {
	for _, s := range []string{"example.com", "127.1", "0x7f.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "2130706433", "fe80::1%lo", "a.b.", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		v := Host(h)
		if v.Unsafe() {
			if v.Why == "" {
				t.Fatalf("refused %q without a reason", h)
			}
			return
		}
		if a, ok := parseLooseIPv4(h); ok {
			if c, err := netip.ParseAddr(h); err != nil || c != a {
				t.Fatalf("accepted %q, which inet_aton reads as %s", h, a)
			}
		}
		if ip := net.ParseIP(h); ip != nil {
			if ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.Equal(net.IPv4bcast) {
				t.Fatalf("accepted %q, which net calls unroutable", h)
			}
		}
	})
}
