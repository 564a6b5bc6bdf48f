package testsrv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisBin is the redis-server binary; overridable with
// INFERA_REDIS_SERVER_BIN.
var RedisBin = envOr("INFERA_REDIS_SERVER_BIN", "/usr/bin/redis-server")

// Redis is a running redis-server (no persistence: a restart empties it).
type Redis struct {
	// Addr is 127.0.0.1:port; URL is redis://Addr/0 (as --state takes it).
	Addr, URL string
	p         *proc
	front     *Front // nil unless StartStoppableRedis
	backend   string // the server's own address (Addr unless behind front)
}

// StartRedis starts a redis-server on a free loopback port with a
// temporary directory, and stops it in t.Cleanup. Clients talk to it
// directly; a test that stops or restarts it uses StartStoppableRedis.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	return startRedis(t, false)
}

// StartStoppableRedis is StartRedis for a test that stops and starts the
// server (an outage, a restart that empties it): Addr is a Front that
// holds its port for the whole test, and each start runs a redis-server on
// a fresh free port behind it. A restart on the server's own port could
// lose that port to another test's server in the instant between the stop
// and the start (go test -p runs packages at once).
func StartStoppableRedis(t testing.TB) *Redis {
	t.Helper()
	return startRedis(t, true)
}

func startRedis(t testing.TB, stoppable bool) *Redis {
	t.Helper()
	need(t, RedisBin)
	dir := t.TempDir()
	r := &Redis{}
	r.p = &proc{t: t, name: "redis-server", bin: RedisBin, log: filepath.Join(dir, "redis.log")}
	if stoppable {
		r.front = NewFront(t)
		r.Addr, r.URL = r.front.Addr, "redis://"+r.front.Addr+"/0"
		r.p.everyStart = true
	}
	r.p.repick = func() {
		port := FreePort(t)
		r.backend = "127.0.0.1:" + strconv.Itoa(port)
		if !stoppable {
			r.Addr, r.URL = r.backend, "redis://"+r.backend+"/0"
		}
		r.p.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no"}
	}
	r.p.repick()
	r.start()
	t.Cleanup(r.stop)
	return r
}

// Start starts a stopped server again, empty (behind its front, on a fresh
// port of its own).
func (r *Redis) Start() {
	r.p.t.Helper()
	r.mustStoppable("Start")
	r.start()
}

func (r *Redis) start() {
	r.p.t.Helper()
	r.p.start(func() error {
		_, err := r.do(r.backend, "PING")
		return err
	})
	if r.front != nil {
		r.front.Up(r.backend)
	}
}

// Stop stops the server (an outage): connecting to Addr is refused and
// the connections open to it end.
func (r *Redis) Stop() {
	r.p.t.Helper()
	r.mustStoppable("Stop")
	r.stop()
}

func (r *Redis) stop() {
	if r.front != nil {
		r.front.Down()
	}
	r.p.stop()
}

// Restart stops and starts the server.
func (r *Redis) Restart() { r.p.t.Helper(); r.Stop(); r.Start() }

func (r *Redis) mustStoppable(what string) {
	r.p.t.Helper()
	if r.front == nil {
		r.p.t.Fatalf("testsrv.Redis.%s on a server from StartRedis: a test that stops or restarts Redis starts it with StartStoppableRedis (its port could go to another test's server in between)", what)
	}
}

// Do sends one command (RESP, arguments as bulk strings) on a fresh
// connection and returns the reply's first line without its type byte (a
// bulk string's content, an integer's digits). An error reply is an error.
func (r *Redis) Do(args ...string) (string, error) { return r.do(r.Addr, args...) }

func (r *Redis) do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}
