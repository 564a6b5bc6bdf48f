// Package testsrv starts real etcd, NATS and Redis servers for tests.
//
// StartEtcd, StartNATS and StartRedis launch /usr/bin/etcd,
// /usr/sbin/nats-server and /usr/bin/redis-server on free loopback ports
// with temporary data directories, wait until they answer, and stop them in
// t.Cleanup. Stop and Restart simulate outages. A Front holds a port for a
// whole test and relays to a server that moves to a fresh port on each
// start (every etcd and NATS server, and StartStoppableRedis), so a
// restart never races other tests for its port.
// When a binary is missing the test is skipped, unless INFERA_REQUIRE_SERVERS
// is 1, in which case it fails.
//
// This package is only for tests; it knows nothing about infera itself.
package testsrv

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/freeport"
)

// Paths of the server binaries; overridable with INFERA_ETCD_BIN and
// INFERA_NATS_SERVER_BIN.
var (
	EtcdBin = envOr("INFERA_ETCD_BIN", "/usr/bin/etcd")
	NATSBin = envOr("INFERA_NATS_SERVER_BIN", "/usr/sbin/nats-server")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func need(t testing.TB, bin string) {
	t.Helper()
	if _, err := os.Stat(bin); err == nil {
		return
	}
	if os.Getenv("INFERA_REQUIRE_SERVERS") == "1" {
		t.Fatalf("%s is not installed and INFERA_REQUIRE_SERVERS=1 (run make deps)", bin)
	}
	t.Skipf("%s is not installed (install it or run make deps; set INFERA_REQUIRE_SERVERS=1 to fail instead)", bin)
}

// FreePort returns a loopback TCP port that was free a moment ago, below
// the kernel's ephemeral range (internal/freeport).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// proc is one server process that can be stopped and started again with the
// same arguments (and so the same ports and data), or, with everyStart, on
// fresh ports behind a Front.
type proc struct {
	t    testing.TB
	name string
	bin  string
	args []string
	log  string

	// repick, when set, moves the server to new free ports (rewriting
	// args); the first start calls it when another process took a port
	// between FreePort and the bind. Restarts keep their ports, unless
	// everyStart (a server behind a Front, which moves on every start:
	// start calls repick before each start after the first).
	repick     func()
	everyStart bool
	started    bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// logFrom is where the current start's output begins in log (the
	// file keeps the earlier starts').
	logFrom int64
}

func (p *proc) start(ready func() error) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return
	}
	if p.started && p.everyStart {
		p.repick()
	}
	for attempt := 0; ; attempt++ {
		exited := p.launch(ready)
		if exited == nil {
			p.started = true
			return
		}
		if (!p.started || p.everyStart) && p.repick != nil && attempt < 3 && bytes.Contains(exited, []byte("address already in use")) {
			p.repick()
			os.Truncate(p.log, 0)
			continue
		}
		p.t.Fatalf("%s exited before it was ready: %s", p.name, tail(exited, 2000))
	}
}

// launch starts the process and waits until ready succeeds (nil) or the
// process exits (its log, non-nil). It fails the test after 15 s.
func (p *proc) launch(ready func() error) []byte {
	p.t.Helper()
	lf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatalf("cannot open %s log: %v", p.name, err)
	}
	if fi, err := lf.Stat(); err == nil {
		p.logFrom = fi.Size()
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		p.t.Fatalf("cannot start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); lf.Close(); close(done) }()
	p.cmd, p.done = cmd, done
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(p.log)
			p.cmd = nil
			if b == nil {
				b = []byte{}
			}
			return b
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			p.t.Fatalf("%s not ready after 15s: %v\n%s", p.name, err, tail(b, 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Etcd is a running etcd server behind a Front: Endpoint stays the same
// for the whole test while each start runs etcd on fresh ports of its own
// (its data kept, unless RestartEmpty). A restart on etcd's own ports
// could lose them to another test's server in the instant between the
// stop and the start (go test -p runs packages at once).
type Etcd struct {
	// Endpoint is host:port of the client listener (the front's); etcd
	// advertises it as its client URL.
	Endpoint string
	backend  string // etcd's own client listener
	data     string // its data directory
	p        *proc
	front    *Front
	certs    *Certs
}

// StartEtcd starts a single-member etcd on free loopback ports.
func StartEtcd(t testing.TB) *Etcd { t.Helper(); return StartEtcdTLS(t, nil) }

// StartEtcdTLS starts etcd serving clients over TLS with certs (client
// certificates required) when certs is not nil. The front relays TCP, so
// the TLS handshake is the client's with etcd.
func StartEtcdTLS(t testing.TB, certs *Certs) *Etcd {
	t.Helper()
	need(t, EtcdBin)
	dir := t.TempDir()
	scheme := "http"
	if certs != nil {
		scheme = "https"
	}
	e := &Etcd{certs: certs, front: NewFront(t)}
	e.Endpoint = e.front.Addr
	e.p = &proc{t: t, name: "etcd", bin: EtcdBin, log: filepath.Join(dir, "etcd.log"), everyStart: true}
	picks := 0
	e.p.repick = func() {
		cport, pport := FreePort(t), FreePort(t)
		curl := fmt.Sprintf("%s://127.0.0.1:%d", scheme, cport)
		purl := fmt.Sprintf("http://127.0.0.1:%d", pport)
		e.backend = fmt.Sprintf("127.0.0.1:%d", cport)
		if !e.p.started {
			// A fresh data directory: a failed first start may have
			// written the old peer URL. A restart keeps its data (a
			// single member starts from it whatever its new peer port).
			picks++
			e.data = filepath.Join(dir, "data"+strconv.Itoa(picks))
		}
		e.p.args = []string{
			"--name", "default",
			"--data-dir", e.data,
			"--listen-client-urls", curl, "--advertise-client-urls", scheme + "://" + e.Endpoint,
			"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
			"--initial-cluster", "default=" + purl,
			"--log-level", "warn",
		}
		if certs != nil {
			e.p.args = append(e.p.args, "--cert-file", certs.ServerCert, "--key-file", certs.ServerKey,
				"--trusted-ca-file", certs.CA, "--client-cert-auth")
		}
	}
	e.p.repick()
	e.Start()
	t.Cleanup(e.Stop)
	return e
}

// Start starts a stopped server again with its data, at the same
// Endpoint.
func (e *Etcd) Start() {
	e.p.t.Helper()
	hc := &http.Client{Timeout: time.Second}
	scheme := "http"
	if e.certs != nil {
		scheme = "https"
		pool := x509.NewCertPool()
		ca, _ := os.ReadFile(e.certs.CA)
		pool.AppendCertsFromPEM(ca)
		cert, err := tls.LoadX509KeyPair(e.certs.ClientCert, e.certs.ClientKey)
		if err != nil {
			e.p.t.Fatalf("cannot load client cert: %v", err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}
	}
	defer hc.CloseIdleConnections()
	e.p.start(func() error {
		resp, err := hc.Get(scheme + "://" + e.backend + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("health: %s", resp.Status)
		}
		return nil
	})
	e.front.Up(e.backend)
}

// Stop stops the server (an outage): connecting to Endpoint is refused and
// the connections open to it end. Start brings it back.
func (e *Etcd) Stop() {
	e.front.Down()
	e.p.stop()
}

// Restart stops and starts the server.
func (e *Etcd) Restart() { e.p.t.Helper(); e.Stop(); e.Start() }

// RestartEmpty stops the server and starts it again at the same Endpoint
// with an empty data directory: a single-member etcd without persistent
// storage coming back, its revision counter starting over.
func (e *Etcd) RestartEmpty() {
	e.p.t.Helper()
	e.Stop()
	e.data += "-empty"
	e.Start()
}

// NATS is a running nats-server behind a Front: URL stays the same for
// the whole test while each start runs the server on a fresh port of its
// own. A restart on the server's own port could lose it to another test's
// server in the instant between the stop and the start (go test -p runs
// packages at once). The front relays TCP, so INFO, CONNECT, TLS and
// authentication are the client's with the server.
type NATS struct {
	// URL is nats://127.0.0.1:port (the front's); the server advertises
	// it as its client URL (--client_advertise: what a cluster's INFO
	// connect_urls tell clients).
	URL     string
	backend string // the server's own address
	p       *proc
	front   *Front
}

// StartNATS starts a nats-server on a free loopback port.
func StartNATS(t testing.TB) *NATS { t.Helper(); return StartNATSArgs(t) }

// StartNATSArgs is StartNATS with extra nats-server arguments (a cluster
// node's --cluster, --routes, ...). Ports in extra (a cluster port) stay
// the same across restarts; a cluster port of -1 is one the server picks
// (RouteAddr).
func StartNATSArgs(t testing.TB, extra ...string) *NATS {
	t.Helper()
	need(t, NATSBin)
	dir := t.TempDir()
	n := &NATS{front: NewFront(t)}
	n.URL = "nats://" + n.front.Addr
	n.p = &proc{t: t, name: "nats-server", bin: NATSBin, log: filepath.Join(dir, "nats.log"), everyStart: true}
	n.p.repick = func() {
		port := FreePort(t)
		n.backend = "127.0.0.1:" + strconv.Itoa(port)
		n.p.args = append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "--client_advertise", n.front.Addr}, extra...)
	}
	n.p.repick()
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

// RouteAddr returns host:port of the server's route (cluster) listener
// in its current start, from the line in which the server says where it
// listens for route connections; it waits for that line up to 10 s. A
// cluster port given as -1 (--cluster nats://127.0.0.1:-1) is one the
// server binds itself, which no other process can take before it does
// (a port picked free beforehand can be); it changes on every start.
func (n *NATS) RouteAddr() string {
	n.p.t.Helper()
	const prefix = "Listening for route connections on "
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.p.mu.Lock()
		from := n.p.logFrom
		n.p.mu.Unlock()
		b, _ := os.ReadFile(n.p.log)
		if int64(len(b)) >= from {
			b = b[from:]
		}
		if i := bytes.LastIndex(b, []byte(prefix)); i >= 0 {
			rest := b[i+len(prefix):]
			if j := bytes.IndexByte(rest, '\n'); j >= 0 {
				return string(bytes.TrimSpace(rest[:j]))
			}
		}
		if time.Now().After(deadline) {
			n.p.t.Fatalf("nats-server did not say where it listens for routes within 10 s: %s", tail(b, 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start starts a stopped server again at the same URL.
func (n *NATS) Start() {
	n.p.t.Helper()
	n.p.start(func() error { return natsReady(n.backend) })
	n.front.Up(n.backend)
}

// natsReady is nil once the server at addr sends its INFO banner.
func natsReady(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 4)
	if _, err := c.Read(buf); err != nil || string(buf) != "INFO" {
		return fmt.Errorf("no INFO banner: %v", err)
	}
	return nil
}

// Stop stops the server (an outage): connecting to URL is refused and the
// connections open to it end.
func (n *NATS) Stop() {
	n.front.Down()
	n.p.stop()
}

// Restart stops and starts the server.
func (n *NATS) Restart() { n.p.t.Helper(); n.Stop(); n.Start() }

// Silent starts a TCP server on loopback that accepts connections and
// holds them open without reading or writing (a TLS server that never
// answers the handshake, an HTTP server that never answers), and returns
// its address; it stops, closing the connections, in t.Cleanup.
func Silent(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}
