package testsrv

import (
	"errors"
	"syscall"
	"testing"
)

// A stoppable Redis keeps its address across restarts while the server
// behind it moves, and a restart empties it.
func TestStoppableRedisKeepsItsAddressAcrossRestarts(t *testing.T) {
	r := StartStoppableRedis(t)
	addr, backend := r.Addr, r.backend
	if addr == backend {
		t.Fatalf("the address clients use is the server's own: %s", addr)
	}
	if _, err := r.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	r.Restart()
	if r.Addr != addr || r.backend == backend {
		t.Fatalf("after a restart: address %s (was %s), server %s (was %s)", r.Addr, addr, r.backend, backend)
	}
	if got, err := r.Do("EXISTS", "k"); got != "0" || err != nil {
		t.Fatalf("EXISTS k after a restart: %q %v, want 0 (empty)", got, err)
	}
	r.Stop()
	if _, err := r.Do("PING"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("PING a stopped Redis: %v, want connection refused", err)
	}
	r.Start()
	if got, err := r.Do("PING"); got != "PONG" || err != nil {
		t.Fatalf("PING after Start: %q %v", got, err)
	}
}
