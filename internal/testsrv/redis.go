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
}

// StartRedis starts a redis-server on a free loopback port with a
// temporary directory, and stops it in t.Cleanup.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	need(t, RedisBin)
	dir := t.TempDir()
	r := &Redis{}
	r.p = &proc{t: t, name: "redis-server", bin: RedisBin, log: filepath.Join(dir, "redis.log")}
	r.p.repick = func() {
		port := FreePort(t)
		r.Addr = "127.0.0.1:" + strconv.Itoa(port)
		r.URL = "redis://" + r.Addr + "/0"
		r.p.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no"}
	}
	r.p.repick()
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts a stopped server again on the same port (empty).
func (r *Redis) Start() {
	r.p.t.Helper()
	r.p.start(func() error {
		_, err := r.Do("PING")
		return err
	})
}

// Stop stops the server (an outage).
func (r *Redis) Stop() { r.p.stop() }

// Restart stops and starts the server.
func (r *Redis) Restart() { r.Stop(); r.Start() }

// Do sends one command (RESP, arguments as bulk strings) on a fresh
// connection and returns the reply's first line without its type byte (a
// bulk string's content, an integer's digits). An error reply is an error.
func (r *Redis) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
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
