package testsrv

import (
	"strconv"
	"strings"
	"testing"

	zmq "github.com/pebbe/zmq4"
)

// BindZMQ binds sock to a loopback port ZMQ picks (tcp://127.0.0.1:*, so
// that no other process can take it between a pick and the bind) and
// returns the port.
func BindZMQ(t testing.TB, sock *zmq.Socket) int {
	t.Helper()
	if err := sock.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := sock.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := strings.Cut(strings.TrimPrefix(ep, "tcp://"), ":")
	port, err := strconv.Atoi(p)
	if err != nil || port == 0 {
		t.Fatalf("bound to %q", ep)
	}
	return port
}
