// Package netdest classifies egress destinations: a URL's host or a
// resolved address is refused when it would turn an egress grant into
// access to the host, its link or the cloud's metadata service, or when it
// is written so that parsers disagree on what it means. The compiler
// classifies the hosts facts and registry name; the launcher classifies the
// same hosts again and every address it resolves them to. One function for
// both, so the two sides cannot drift.
package netdest

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Class names why a destination is refused; OK is the empty class.
type Class string

const (
	OK           Class = ""
	Loopback     Class = "loopback"
	LinkLocal    Class = "link-local"
	Unspecified  Class = "unspecified"
	Multicast    Class = "multicast"
	Broadcast    Class = "broadcast"
	Reserved     Class = "reserved"
	Metadata     Class = "cloud metadata"
	NonCanonical Class = "non-canonical"
)

// Verdict is a classification and, when refused, a reason safe to print
// (it names only the host or address classified).
type Verdict struct {
	Class Class
	Why   string
}

// Unsafe reports whether the destination is refused.
func (v Verdict) Unsafe() bool { return v.Class != OK }

func (v Verdict) String() string {
	if !v.Unsafe() {
		return "ok"
	}
	return v.Why
}

// metadataAddrs are cloud instance-metadata endpoints. Most lie in
// link-local space and are refused anyway; naming them makes the reason
// plain, and 100.100.100.200, 168.63.129.16 and 192.0.0.192 do not.
var metadataAddrs = map[netip.Addr]string{
	netip.MustParseAddr("169.254.169.254"): "instance metadata (AWS, GCP, Azure, OCI, OpenStack, DigitalOcean)",
	netip.MustParseAddr("169.254.170.2"):   "the ECS task metadata and credentials endpoint",
	netip.MustParseAddr("169.254.170.23"):  "the EKS Pod Identity agent",
	netip.MustParseAddr("100.100.100.200"): "Alibaba Cloud instance metadata",
	netip.MustParseAddr("168.63.129.16"):   "the Azure host agent (WireServer)",
	netip.MustParseAddr("192.0.0.192"):     "Oracle Cloud legacy instance metadata",
	netip.MustParseAddr("fd00:ec2::254"):   "AWS instance metadata over IPv6",
	netip.MustParseAddr("fd00:ec2::23"):    "the EKS Pod Identity agent over IPv6",
	netip.MustParseAddr("fd20:ce::254"):    "GCP instance metadata over IPv6",
}

// metadataNames are the well-known names of metadata services. Names that
// merely resolve to one are caught by the launcher, which classifies what
// it resolves.
var metadataNames = map[string]bool{
	"metadata":                     true,
	"metadata.google.internal":     true,
	"metadata.goog":                true,
	"instance-data":                true,
	"instance-data.ec2.internal":   true,
	"metadata.tencentyun.com":      true,
	"metadata.platformequinix.com": true,
	"metadata.packet.net":          true,
}

// Host classifies a URL host as url.URL.Hostname returns it: a DNS name, an
// IPv4 literal or an IPv6 literal without brackets.
func Host(h string) Verdict {
	if h == "" {
		return Verdict{NonCanonical, "empty host"}
	}
	if strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		if err != nil {
			return Verdict{NonCanonical, "host contains ':' but is not an IPv6 address"}
		}
		return Addr(a)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return Verdict{NonCanonical, "host must be ASCII letters, digits, dots and hyphens (international names in punycode): other parsers may map it to a different host"}
		}
	}
	lower := strings.ToLower(h)
	if endsInNumber(lower) {
		a, err := netip.ParseAddr(lower)
		if err == nil && a.Is4() {
			return Addr(a)
		}
		if loose, ok := parseLooseIPv4(lower); ok {
			why := fmt.Sprintf("%s is an IPv4 address in a non-canonical numeric form (decimal, octal, hex, short or with leading zeros); inet_aton and browsers read it as %s", h, loose)
			if v := Addr(loose); v.Unsafe() {
				why += ", a " + string(v.Class) + " address"
			}
			return Verdict{NonCanonical, why + "; write the four-part decimal form"}
		}
		return Verdict{NonCanonical, h + " ends in a number but is not an IPv4 address"}
	}
	name := strings.TrimSuffix(lower, ".")
	if name == "" || strings.HasPrefix(name, ".") || strings.Contains(name, "..") {
		return Verdict{NonCanonical, "host has an empty label"}
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return Verdict{Loopback, name + " is loopback: inside the sandbox it names the sandbox itself"}
	}
	if metadataNames[name] {
		return Verdict{Metadata, name + " is a cloud metadata service"}
	}
	return Verdict{}
}

// Addr classifies one address, looking through IPv4-mapped,
// IPv4-compatible, NAT64 and 6to4 forms at the IPv4 address they carry.
func Addr(a netip.Addr) Verdict {
	if a.Zone() != "" {
		return Verdict{LinkLocal, a.String() + " is scoped to one interface (zoned)"}
	}
	if a.Is4In6() {
		return embedded(a, a.Unmap(), "IPv4-mapped", false)
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case isZero(b[:12]) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
			// IPv4-compatible (::a.b.c.d) is deprecated; stacks disagree
			// on what it reaches, so it is refused whatever it carries.
			return embedded(a, netip.AddrFrom4([4]byte(b[12:16])), "IPv4-compatible", true)
		case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && isZero(b[4:12]):
			return embedded(a, netip.AddrFrom4([4]byte(b[12:16])), "NAT64", false)
		case b[0] == 0x20 && b[1] == 0x02:
			return embedded(a, netip.AddrFrom4([4]byte(b[2:6])), "6to4", false)
		}
	}
	if why, ok := metadataAddrs[a]; ok {
		return Verdict{Metadata, a.String() + " is " + why}
	}
	s := a.String()
	switch {
	case a.Is4() && a.As4()[0] == 0, a.IsUnspecified():
		return Verdict{Unspecified, s + " is unspecified (0.0.0.0/8 or ::): connecting to it reaches the local host"}
	case a.IsLoopback():
		return Verdict{Loopback, s + " is loopback: inside the sandbox it is the sandbox itself"}
	case a.IsLinkLocalUnicast():
		return Verdict{LinkLocal, s + " is link-local (169.254.0.0/16 or fe80::/10): the host's link, where metadata services live"}
	case a.IsMulticast():
		return Verdict{Multicast, s + " is multicast"}
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return Verdict{Broadcast, s + " is the limited broadcast address"}
	case a.Is4() && a.As4()[0] >= 240:
		return Verdict{Reserved, s + " is reserved (240.0.0.0/4)"}
	}
	return Verdict{}
}

// embedded classifies the IPv4 address an IPv6 form carries. always
// refuses the form even when the IPv4 address is fine.
func embedded(outer, inner netip.Addr, form string, always bool) Verdict {
	v := Addr(inner)
	if v.Unsafe() {
		return Verdict{v.Class, fmt.Sprintf("%s is the %s IPv6 form of %s, a %s address", outer, form, inner, v.Class)}
	}
	if always {
		return Verdict{NonCanonical, fmt.Sprintf("%s is the deprecated %s IPv6 form of %s; write the IPv4 address", outer, form, inner)}
	}
	return Verdict{}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// endsInNumber is the WHATWG URL rule for hosts parsed as IPv4: the last
// label (a trailing empty one dropped) is decimal digits or 0x-hex. DNS
// names never end in such a label, so any such host is numeric.
func endsInNumber(h string) bool {
	labels := strings.Split(h, ".")
	if len(labels) > 1 && labels[len(labels)-1] == "" {
		labels = labels[:len(labels)-1]
	}
	last := labels[len(labels)-1]
	if last == "" {
		return false
	}
	if allIn(last, "0123456789") {
		return true
	}
	if len(last) >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X') {
		return allIn(last[2:], "0123456789abcdefABCDEF")
	}
	return false
}

func allIn(s, set string) bool {
	for i := 0; i < len(s); i++ {
		if !strings.ContainsRune(set, rune(s[i])) {
			return false
		}
	}
	return true
}

// parseLooseIPv4 reads a host as inet_aton and the WHATWG URL parser do:
// one to four parts, each decimal, octal (leading 0) or hex (0x), the last
// filling the remaining bytes. It is used only to say what a refused
// notation means.
func parseLooseIPv4(h string) (netip.Addr, bool) {
	parts := strings.Split(h, ".")
	if len(parts) > 1 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	if len(parts) == 0 || len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals []uint64
	for _, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) >= 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, digits = 16, p[2:]
			if digits == "" {
				digits = "0"
			}
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if digits == "" {
			return netip.Addr{}, false
		}
		v, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals = append(vals, v)
	}
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}
