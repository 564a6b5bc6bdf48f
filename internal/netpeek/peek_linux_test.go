package netpeek

import (
	"net"
	"testing"
	"time"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// waitFor polls the client's socket until what the server wrote is there
// (loopback: at once, but the test does not rely on it).
func waitFor(t *testing.T, fd, n int) {
	t.Helper()
	b := make([]byte, 64<<10)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if got := peekN(fd, b); got >= n {
			return
		}
	}
	t.Fatalf("%d bytes never arrived", n)
}

func TestTLSRecordsSaysHowManyBytesOfWholeRecordsWaitWithoutTakingThem(t *testing.T) {
	client, server := tcpPair(t)
	fd := SockFD(client)
	if got := TLSRecords(fd); got != -1 {
		t.Fatalf("empty socket: %d, want -1", got)
	}
	whole := append(record(120), record(80)...)
	server.Write(whole)
	waitFor(t, fd, len(whole))
	for i := 0; i < 2; i++ { // a peek: the second look sees the same
		if got := TLSRecords(fd); got != len(whole) {
			t.Fatalf("look %d: %d, want %d", i, got, len(whole))
		}
	}
	server.Write(record(50)[:20]) // a record still arriving
	waitFor(t, fd, len(whole)+20)
	if got := TLSRecords(fd); got != -1 {
		t.Fatalf("a record cut short: %d, want -1", got)
	}
}

func TestTLSRecordsRefusesMoreThanItLooksAt(t *testing.T) {
	client, server := tcpPair(t)
	fd := SockFD(client)
	big := append(record(tlsPeekMax-5), record(10)...) // whole, but past the look
	server.Write(big)
	waitFor(t, fd, len(big))
	if got := TLSRecords(fd); got != -1 {
		t.Fatalf("%d bytes of whole records: %d, want -1", len(big), got)
	}
}

func peekN(fd int, b []byte) int {
	n, errno := peekInto(fd, b)
	if errno != 0 {
		return 0
	}
	return n
}
