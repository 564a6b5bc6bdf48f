package realip

import (
	"net/netip"
	"strings"
	"testing"
)

func mustParse(t testing.TB, list ...string) *Proxies {
	t.Helper()
	p, err := Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// --trusted-proxies takes addresses and networks of either family, and
// refuses anything else with a message that names the entry.
func TestTrustedProxiesTakeAddressesAndNetworksAndRefuseTheRest(t *testing.T) {
	p := mustParse(t, " 10.0.0.0/8", "192.0.2.7 ", "", "2001:db8::/32", "::1", "::ffff:172.16.0.0/108")
	for a, want := range map[string]bool{
		"10.1.2.3": true, "11.0.0.1": false, "192.0.2.7": true, "192.0.2.8": false,
		"2001:db8:1::5": true, "2001:db9::5": false, "::1": true, "::2": false,
		"::ffff:10.9.9.9":  true,  // mapped: compared as IPv4
		"172.16.3.4":       true,  // the mapped network is its IPv4 one
		"172.32.0.1":       false, //
		"fe80::1%eth0":     false, // not listed, zone or not
		"2001:db8::9%eth0": true,  // the zone is dropped
	} {
		if got := p.Trusts(netip.MustParseAddr(a)); got != want {
			t.Errorf("Trusts(%s) = %v, want %v", a, got, want)
		}
	}
	if got := p.String(); got != "10.0.0.0/8,192.0.2.7/32,172.16.0.0/12,2001:db8::/32,::1/128" {
		t.Errorf("String() = %s", got)
	}
	if p, err := Parse(nil); p != nil || err != nil {
		t.Fatalf("no entries: %v, %v; want nil (trust no one)", p, err)
	}
	if p, err := Parse([]string{"", " "}); p != nil || err != nil {
		t.Fatalf("empty entries: %v, %v; want nil (trust no one)", p, err)
	}
	var none *Proxies
	if none.Trusts(netip.MustParseAddr("127.0.0.1")) {
		t.Fatal("a nil set trusts")
	}
	for _, bad := range []string{"10.0.0.1/8", "lb.internal", "10.0.0.0/33", "10.0.0", "2001:db8::1%eth0", "unix:",
		"010.0.0.1", "10.0.0.0/", "*", "::ffff:0:0/64", "[::1]", "10.0.0.1:80"} {
		_, err := Parse([]string{"10.0.0.0/8", bad})
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: the error does not name it: %v", bad, err)
		}
	}
	_, err := Parse([]string{"10.0.0.1/8"})
	if err == nil || !strings.Contains(err.Error(), "10.0.0.0/8") || !strings.Contains(err.Error(), "10.0.0.1") {
		t.Fatalf("host bits: %v; want it to offer 10.0.0.0/8 and 10.0.0.1", err)
	}
}

// One X-Forwarded-For element, as proxies write it.
func TestAnXForwardedForEntryIsReadAsProxiesWriteIt(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		a, ok := ParseEntry(in)
		b, okb := ParseEntry([]byte(in))
		if a != b || ok != okb {
			t.Fatalf("%q: string %v %v, bytes %v %v", in, a, ok, b, okb)
		}
		if want == "" {
			if ok {
				t.Fatalf("%q read as %v", in, a)
			}
			return
		}
		if !ok || a != netip.MustParseAddr(want) {
			t.Fatalf("%q: %v %v, want %s", in, a, ok, want)
		}
	}
	f("192.0.2.7", "192.0.2.7")
	f("192.0.2.7:41234", "192.0.2.7")
	f("0.0.0.0", "0.0.0.0")
	f("2001:db8::7", "2001:db8::7")
	f("[2001:db8::7]", "2001:db8::7")
	f("[2001:db8::7]:41234", "2001:db8::7")
	f("2001:DB8:0:0:0:0:0:7", "2001:db8::7")
	f("::", "::")
	f("::1", "::1")
	f("1::", "1::")
	f("::ffff:192.0.2.7", "192.0.2.7") // mapped: unmapped
	f("[::ffff:192.0.2.7]:80", "192.0.2.7")
	f("::192.0.2.7", "::c000:207")
	f("1:2:3:4:5:6:192.0.2.7", "1:2:3:4:5:6:c000:207")
	f("1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8")
	f("192.0.2.7:0", "192.0.2.7")
	f("192.0.2.7:065535", "192.0.2.7")
	for _, bad := range []string{"", "unknown", "example.com", "192.0.2", "192.0.2.7.1", "192.0.2.256", "192.0.2.07",
		"192.0.2.7:", "192.0.2.7:65536", "192.0.2.7:x", "192.0.2.7:80:80", "[192.0.2.7]", "[192.0.2.7]:80",
		"[2001:db8::7", "2001:db8::7]", "[2001:db8::7]x", "[2001:db8::7]:", "fe80::1%eth0", "[fe80::1%eth0]:80",
		"1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7", "1::2::3", ":1::", "1::2:", "12345::", "::1.2.3", "1:2:3:4:5:6:7:1.2.3.4",
		"1.2.3.4 ", " 1.2.3.4", "1.2.3.4 5.6.7.8", `"1.2.3.4"`, "_hidden", "::g"} {
		f(bad, "")
	}
}

// The walk: the rightmost address that is not trusted, over every line;
// the leftmost when all are; the last good address before garbage; the
// peer when it is not trusted, whatever the header says.
func TestTheClientIsTheRightmostUntrustedAddress(t *testing.T) {
	p := mustParse(t, "10.0.0.0/8", "2001:db8:ffff::/48")
	lb := netip.MustParseAddr("10.0.0.2")
	f := func(peer netip.Addr, want string, lines ...string) {
		t.Helper()
		b := make([][]byte, len(lines))
		for i, l := range lines {
			b[i] = []byte(l)
		}
		got, gotS := p.Client(peer, b), p.ClientString(peer, lines)
		if got != gotS {
			t.Fatalf("%q: bytes %v, strings %v", lines, got, gotS)
		}
		if got != netip.MustParseAddr(want) {
			t.Fatalf("%q from %v: %v, want %s", lines, peer, got, want)
		}
	}
	f(lb, "10.0.0.2")                                                       // no header: the peer
	f(lb, "203.0.113.9", "203.0.113.9")                                     //
	f(lb, "203.0.113.9", "198.51.100.1, 203.0.113.9")                       // the client's own claim is left of the proxy's
	f(lb, "203.0.113.9", "198.51.100.1,203.0.113.9, 10.1.1.1,10.0.0.3")     // trusted hops skipped
	f(lb, "203.0.113.9", "198.51.100.1", "203.0.113.9", "10.1.1.1")         // lines in order, as one list
	f(lb, "203.0.113.9", "198.51.100.1, 203.0.113.9 ,, ", " ", "10.1.1.1,") // empty elements and lines skipped
	f(lb, "203.0.113.9", "\t203.0.113.9\t")
	f(lb, "10.9.9.9", "10.9.9.9, 10.1.1.1") // all trusted: the leftmost
	f(lb, "2001:db8::7", "[2001:db8::7]:5555, [2001:db8:ffff::1]")
	f(lb, "2001:db8::7", "2001:db8::7, 2001:db8:ffff::1:443") // bare IPv6: no port
	f(lb, "203.0.113.9", "203.0.113.9:1234")
	f(lb, "203.0.113.9", "::ffff:203.0.113.9")
	// Garbage stops the walk: nothing left of it is believed.
	f(lb, "10.0.0.2", "198.51.100.1, unknown")
	f(lb, "10.1.1.1", "198.51.100.1, unknown, 10.1.1.1")
	f(lb, "10.1.1.1", "198.51.100.1", "_x", "10.1.1.1")
	f(lb, "10.0.0.2", "198.51.100.1, fe80::1%eth0")
	// An untrusted peer is the client, whatever it says.
	out := netip.MustParseAddr("203.0.113.50")
	f(out, "203.0.113.50", "198.51.100.1")
	f(out, "203.0.113.50", "10.1.1.1")
	f(netip.MustParseAddr("::ffff:203.0.113.50"), "203.0.113.50", "198.51.100.1")
	// A trusted peer given as a mapped address (a dual-stack socket).
	f(netip.MustParseAddr("::ffff:10.0.0.2"), "203.0.113.9", "203.0.113.9")
	// nil trusts no one.
	var none *Proxies
	if got := none.Client(lb, [][]byte{[]byte("203.0.113.9")}); got != lb {
		t.Fatalf("nil set: %v", got)
	}
}
