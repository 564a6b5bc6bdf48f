package realip

import (
	"fmt"
	"net/netip"
	"strings"
)

// Proxies is a set of trusted proxy addresses and networks. A nil
// *Proxies trusts no one: Client is then the peer's address.
type Proxies struct {
	v4, v6 []netip.Prefix
}

// Parse reads --trusted-proxies: IPv4 and IPv6 addresses and CIDR
// networks (192.0.2.7, 10.0.0.0/8, 2001:db8::/32); empty entries are
// skipped. It returns nil (trust no one) for a list without entries. An
// entry that is not an address or a network is refused, as is a network
// with bits set past its length (10.0.0.1/8: the one address or the
// whole network?), and an address with a zone.
//
// An IPv4-mapped IPv6 entry (::ffff:10.0.0.0/104) is its IPv4 network:
// peers and X-Forwarded-For addresses are compared unmapped. An IPv6
// network does not cover IPv4 addresses (trusting everyone takes
// 0.0.0.0/0 and ::/0, as nginx's set_real_ip_from does).
func Parse(list []string) (*Proxies, error) {
	var p Proxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		pfx, err := parsePrefix(s)
		if err != nil {
			return nil, err
		}
		if pfx.Addr().Is4() {
			p.v4 = append(p.v4, pfx)
		} else {
			p.v6 = append(p.v6, pfx)
		}
	}
	if len(p.v4)+len(p.v6) == 0 {
		return nil, nil
	}
	return &p, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	var pfx netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if pfx, err = netip.ParsePrefix(s); err != nil {
			return pfx, fmt.Errorf("%q is not an IP address or CIDR network (192.0.2.7, 10.0.0.0/8, 2001:db8::/32)", s)
		}
		if m := pfx.Masked(); m != pfx {
			return pfx, fmt.Errorf("%q has address bits set past its /%d: write %s for the network, or %s for the one address",
				s, pfx.Bits(), m, pfx.Addr())
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return pfx, fmt.Errorf("%q is not an IP address or CIDR network (192.0.2.7, 10.0.0.0/8, 2001:db8::/32)", s)
		}
		pfx = netip.PrefixFrom(a, a.BitLen())
	}
	if a := pfx.Addr(); a.Is4In6() {
		if pfx.Bits() < 96 {
			return pfx, fmt.Errorf("%q: an IPv4-mapped network shorter than /96 mixes IPv6 and IPv4 addresses; list them apart", s)
		}
		pfx = netip.PrefixFrom(a.Unmap(), pfx.Bits()-96)
	}
	return pfx, nil
}

// Trusts reports whether a is a trusted proxy's address (a is compared
// unmapped, without its zone).
func (p *Proxies) Trusts(a netip.Addr) bool {
	if p == nil {
		return false
	}
	a = a.Unmap().WithZone("")
	ps := p.v6
	if a.Is4() {
		ps = p.v4
	}
	for _, pfx := range ps {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// String lists the trusted networks (for a log line).
func (p *Proxies) String() string {
	if p == nil {
		return ""
	}
	var b []byte
	for _, ps := range [2][]netip.Prefix{p.v4, p.v6} {
		for _, pfx := range ps {
			if len(b) > 0 {
				b = append(b, ',')
			}
			b = pfx.AppendTo(b)
		}
	}
	return string(b)
}

// Client is the client's address of a request from peer whose
// X-Forwarded-For field lines are xff (fasthttp's PeekAll), unmapped and
// without a zone:
//
//   - peer is not trusted (or p is nil): peer, whatever xff says;
//   - otherwise the walk goes from the last address of the last line
//     leftwards and stops at the first address that is not trusted: that
//     is the client. Every address trusted: the leftmost;
//   - an entry that is not an address (garbage, "unknown", a host name, a
//     zone) stops the walk: the client is the last address read before it
//     (the peer when it is the first), never anything past it.
//
// Empty list elements (",,", a trailing comma, an empty line) are skipped,
// as RFC 9110 section 5.6.1 asks of a recipient. It allocates nothing.
func (p *Proxies) Client(peer netip.Addr, xff [][]byte) netip.Addr {
	return client(p, peer, xff)
}

// ClientString is Client for net/http's header values (Header.Values).
func (p *Proxies) ClientString(peer netip.Addr, xff []string) netip.Addr {
	return client(p, peer, xff)
}

func client[S ~string | ~[]byte](p *Proxies, peer netip.Addr, xff []S) netip.Addr {
	addr := peer.Unmap().WithZone("")
	if !p.Trusts(addr) {
		return addr
	}
	for i := len(xff) - 1; i >= 0; i-- {
		l := xff[i]
		for end := len(l); end > 0; {
			start := end
			for start > 0 && l[start-1] != ',' {
				start--
			}
			e := trimOWS(l[start:end])
			end = start - 1 // before the comma (-1: the line is done)
			if len(e) == 0 {
				continue
			}
			a, ok := ParseEntry(e)
			if !ok {
				return addr
			}
			addr = a
			if !p.Trusts(a) {
				return a
			}
		}
	}
	return addr
}

func trimOWS[S ~string | ~[]byte](s S) S {
	i, j := 0, len(s)
	for i < j && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	for j > i && (s[j-1] == ' ' || s[j-1] == '\t') {
		j--
	}
	return s[i:j]
}
