package testsrv

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"testing"
)

// A port taken between FreePort and the server's bind (by any process on
// the machine) moves the first start to new ports instead of failing.
func TestFirstStartMovesToNewPortsWhenOneIsTaken(t *testing.T) {
	need(t, NATSBin)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	n := &NATS{front: NewFront(t)}
	n.p = &proc{t: t, name: "nats-server", bin: NATSBin, log: filepath.Join(dir, "nats.log")}
	picks := 0
	n.p.repick = func() {
		port := FreePort(t)
		if picks == 0 {
			port = taken.Addr().(*net.TCPAddr).Port
		}
		picks++
		n.URL, n.backend = fmt.Sprintf("nats://127.0.0.1:%d", port), "127.0.0.1:"+strconv.Itoa(port)
		n.p.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port)}
	}
	n.p.repick()
	n.Start()
	defer n.Stop()
	if picks != 2 || n.backend == taken.Addr().String() {
		t.Fatalf("picks %d, addr %s (taken %s)", picks, n.backend, taken.Addr())
	}
	n.Restart() // restarts keep the port
	if picks != 2 {
		t.Fatalf("restart picked new ports")
	}
}
