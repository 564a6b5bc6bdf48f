package proxy

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/infera/infera/fleet"
)

// A router out of file descriptors (its socket to the worker cannot be
// made: EMFILE) answers 503 router_connection_limit and blames no worker:
// counted as upstream_unreachable, the shortage opened the breaker of every
// healthy worker it tried (255,000 requests in 6 s on the real binary under
// ulimit -n 48, every one a 5xx, the worker's breaker open afterwards).
func TestOutOfFileDescriptorsIsNotTheWorkersFault(t *testing.T) {
	up0, up1 := startUpstream(t, okHandler), startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up0.url, up1.url)
	emfile := func(network, address string, c syscall.RawConn) error {
		return os.NewSyscallError("socket", syscall.EMFILE)
	}
	for _, id := range []string{"w0", "w1"} {
		r.fl.Get(id).Client.(*httpPool).dialer.Control = emfile
	}
	for i := 0; i < 8; i++ {
		code, b := post(t, r.url+"/v1/chat/completions", chatBody)
		if code != 503 || !strings.Contains(b, "router_connection_limit") {
			t.Fatalf("request %d without descriptors: %d %s, want 503 router_connection_limit", i, code, b)
		}
	}
	for _, id := range []string{"w0", "w1"} {
		if st := r.fl.Get(id).Breaker.State(); st != fleet.BreakerClosed {
			t.Fatalf("worker %s's breaker is %v: the router's descriptor shortage was blamed on it", id, st)
		}
		r.fl.Get(id).Client.(*httpPool).dialer.Control = nil
	}
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("with descriptors again: %d %s", code, b)
	}
}
