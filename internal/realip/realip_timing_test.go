package realip

import (
	"net/netip"
	"testing"
)

// BenchmarkClient finds the client behind two trusted hops, over two
// X-Forwarded-For lines, as the request path does with
// --trusted-proxies set.
func BenchmarkClient(b *testing.B) {
	p, err := Parse([]string{"10.0.0.0/8", "127.0.0.1", "2001:db8:ffff::/48"})
	if err != nil {
		b.Fatal(err)
	}
	peer := netip.MustParseAddr("10.0.0.2")
	xff := [][]byte{[]byte("198.51.100.1, [2001:db8::7]:5555"), []byte("10.1.1.1, 2001:db8:ffff::1")}
	want := netip.MustParseAddr("2001:db8::7")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if p.Client(peer, xff) != want {
			b.Fatal("wrong client")
		}
	}
}
