package govern

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
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

// A Redis made unreachable through the outage proxy keeps the address
// its clients use: no other process can listen there while it is cut, so
// the Redis reachable again after restore is the test's, with its data.
func TestRedisCutByTheOutageProxyKeepsItsAddressFromOtherServers(t *testing.T) {
	rs := startRedis(t)
	px := startOutageProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port))
	addr := strings.TrimSuffix(strings.TrimPrefix(px.url(), "redis://"), "/0")
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	px.cut()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING answered through a cut proxy")
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another server could listen on the cut Redis's address %s", addr)
	}
	px.restore()
	if v, err := c.Get(context.Background(), "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k through the restored proxy: %q %v, want v (its data kept)", v, err)
	}
}
