package govern

import (
	"context"
	"net"
	"strconv"
	"testing"
)

// A test's Redis that is down (stopped, or between the stop and the start
// of a restart) keeps its address: no other process can listen there, so
// the server the test starts again is the one its clients reach, and
// connecting meanwhile is refused as it is to a stopped server.
func TestRedisStoppedByATestKeepsItsAddressFromOtherServers(t *testing.T) {
	rs := startRedis(t)
	c := rs.client(t)
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rs.stop()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING answered while Redis is stopped")
	}
	if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(rs.port)); err == nil {
		ln.Close()
		t.Fatalf("another server could listen on the stopped Redis's port %d", rs.port)
	}
	rs.start()
	if n, err := c.Exists(context.Background(), "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k on the restarted Redis: %d %v, want 0 (restarted empty)", n, err)
	}
}
