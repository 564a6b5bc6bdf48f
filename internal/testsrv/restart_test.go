package testsrv

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// portOf is the port of host:port or scheme://host:port.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr[strings.LastIndex(addr, "/")+1:])
	return port
}

// A NATS server that a test stops keeps its address: no other process can
// listen there while it is down, and a client's reconnect after Start
// reaches the server the test started again, through which messages flow.
func TestNATSStoppedByATestKeepsItsAddressFromOtherServers(t *testing.T) {
	n := StartNATS(t)
	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(n.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("s")
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()

	n.Stop()
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+portOf(n.URL), time.Second); err == nil {
		c.Close()
		t.Fatal("connecting to a stopped NATS server succeeded")
	}
	if ln, err := net.Listen("tcp", "127.0.0.1:"+portOf(n.URL)); err == nil {
		ln.Close()
		t.Fatalf("another server could listen on the stopped NATS server's port %s", portOf(n.URL))
	}
	n.Start()
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatalf("the client did not reconnect to the restarted server: %v", nc.Status())
	}
	if err := nc.Publish("s", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "after" {
		t.Fatalf("a message through the restarted server: %v %v", m, err)
	}
	if got := nc.ConnectedUrl(); got != n.URL {
		t.Fatalf("reconnected to %s, want %s", got, n.URL)
	}
}

// Servers of a NATS cluster tell their clients each other's addresses
// (INFO connect_urls): those are the addresses tests use, which stay
// reachable across restarts, not the servers' own.
func TestNATSClusterAdvertisesTheAddressesClientsUse(t *testing.T) {
	// Route ports the servers pick (-1) and say (RouteAddr): a port
	// picked free beforehand could be taken before the server binds it.
	b := StartNATSArgs(t, "-n", "B", "--cluster_name", "c", "--cluster", "nats://127.0.0.1:-1")
	a := StartNATSArgs(t, "-n", "A", "--cluster_name", "c", "--cluster", "nats://127.0.0.1:-1",
		"--routes", "nats://"+b.RouteAddr())
	nc, err := nats.Connect(a.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(nc.DiscoveredServers()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the client learnt no other server of the cluster")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, u := range nc.DiscoveredServers() {
		if portOf(u) != portOf(b.URL) {
			t.Fatalf("the cluster advertises %s to clients; B's address is %s", u, b.URL)
		}
	}
}

// An etcd server that a test stops keeps its address: no other process
// can listen there while it is down; after Start its data is back, and a
// client's watch made before the stop sees a write made after the start.
func TestEtcdStoppedByATestKeepsItsAddressFromOtherServers(t *testing.T) {
	e := StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "before", "1"); err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "after")

	e.Stop()
	if c, err := net.DialTimeout("tcp", e.Endpoint, time.Second); err == nil {
		c.Close()
		t.Fatal("connecting to a stopped etcd succeeded")
	}
	if ln, err := net.Listen("tcp", e.Endpoint); err == nil {
		ln.Close()
		t.Fatalf("another server could listen on the stopped etcd's address %s", e.Endpoint)
	}
	e.Start()
	if r, err := cli.Get(ctx, "before"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("a key written before the restart: %v %v", r, err)
	}
	if _, err := cli.Put(ctx, "after", "2"); err != nil {
		t.Fatal(err)
	}
	if !watchSees(ctx, wch, "after") {
		t.Fatal("the watch made before the restart did not see a write after it")
	}
	r, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.Members {
		for _, u := range m.ClientURLs {
			if portOf(u) != portOf(e.Endpoint) {
				t.Fatalf("etcd advertises %s to clients; its address is %s", u, e.Endpoint)
			}
		}
	}
}

// watchSees reports whether wch delivers a put of key before ctx ends.
func watchSees(ctx context.Context, wch clientv3.WatchChan, key string) bool {
	for {
		select {
		case w, ok := <-wch:
			if !ok {
				return false
			}
			for _, ev := range w.Events {
				if string(ev.Kv.Key) == key {
					return true
				}
			}
		case <-ctx.Done():
			return false
		}
	}
}
