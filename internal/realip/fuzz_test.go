package realip

import (
	"net/netip"
	"strings"
	"testing"
)

// refEntry reads an X-Forwarded-For element with net/netip: an address,
// an address and port, or a bracketed IPv6 address; no zone.
func refEntry(e string) (netip.Addr, bool) {
	if strings.Contains(e, "%") {
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(e); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(e); err == nil {
		return ap.Addr().Unmap(), true
	}
	if len(e) > 2 && e[0] == '[' && e[len(e)-1] == ']' {
		if a, err := netip.ParseAddr(e[1 : len(e)-1]); err == nil && a.Is6() {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// refClient is Client written plainly: split every line on commas, drop
// the empty elements, walk from the right.
func refClient(p *Proxies, peer netip.Addr, lines []string) netip.Addr {
	var es []string
	for _, l := range lines {
		for _, e := range strings.Split(l, ",") {
			if e = strings.Trim(e, " \t"); e != "" {
				es = append(es, e)
			}
		}
	}
	addr := peer.Unmap()
	if !p.Trusts(addr) {
		return addr
	}
	for i := len(es) - 1; i >= 0; i-- {
		a, ok := refEntry(es[i])
		if !ok {
			return addr
		}
		addr = a
		if !p.Trusts(a) {
			return a
		}
	}
	return addr
}

// The X-Forwarded-For walk and its element parser agree with net/netip
// and a plain split-and-walk on any header (lines split at '\n'), and
// the client is always the peer or an address the header holds.
func FuzzXForwardedFor(f *testing.F) {
	for _, s := range []string{
		"203.0.113.9", "198.51.100.1, 203.0.113.9, 10.1.1.1", "198.51.100.1\n203.0.113.9\n10.1.1.1",
		"[2001:db8::7]:5555, 2001:db8:ffff::1", "unknown, 10.1.1.1", ",, 10.1.1.1 ,", "fe80::1%eth0",
		"::ffff:10.1.1.1", "1:2:3:4:5:6:1.2.3.4", "10.1.1.1:80", "[10.1.1.1]:80", "1::2::3", "010.1.1.1",
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	p := mustParse(f, "10.0.0.0/8", "2001:db8:ffff::/48")
	f.Fuzz(func(t *testing.T, hdr string, trustedPeer bool) {
		peer := netip.MustParseAddr("192.0.2.1")
		if trustedPeer {
			peer = netip.MustParseAddr("10.0.0.2")
		}
		lines := strings.Split(hdr, "\n")
		b := make([][]byte, len(lines))
		for i, l := range lines {
			b[i] = []byte(l)
		}
		got, gotS, want := p.Client(peer, b), p.ClientString(peer, lines), refClient(p, peer, lines)
		if got != want || gotS != want {
			t.Fatalf("%q: Client %v, ClientString %v, reference %v", hdr, got, gotS, want)
		}
		if !trustedPeer && got != peer {
			t.Fatalf("%q from an untrusted peer: %v", hdr, got)
		}
		held := got == peer
		for _, l := range lines {
			for _, e := range strings.Split(l, ",") {
				e = strings.Trim(e, " \t")
				a, ok := ParseEntry(e)
				ra, rok := refEntry(e)
				if a != ra || ok != rok {
					t.Fatalf("entry %q: %v %v, netip %v %v", e, a, ok, ra, rok)
				}
				held = held || (ok && a == got)
			}
		}
		if !held {
			t.Fatalf("%q: %v is neither the peer nor an address of the header", hdr, got)
		}
	})
}
