package govern

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/redis/go-redis/v9"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// parseConfig parses a JSON config the way the router does.
func parseConfig(t testing.TB, js string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(js))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, js)
	}
	return c
}

// testKeys mints n keys once per test binary (hashing is cheap, but
// stable keys keep failures readable).
func mintKey(t testing.TB) (key, hash string) {
	t.Helper()
	k, h, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k, h
}

// userConfig returns a config with one user (alice, key hash h) bound to a
// template given as JSON.
func userConfig(t testing.TB, hash, tmpl string, extra string) *config.Config {
	t.Helper()
	if extra != "" {
		extra = "," + extra
	}
	return parseConfig(t, fmt.Sprintf(`{
		"user_limit": {"timezone": "UTC", "templates": [%s]},
		"users": [{"name": "alice", "keys": [%q], "template": "t"}]%s}`, tmpl, hash, extra))
}

func newGov(t testing.TB, o Options, c *config.Config) *Governor {
	t.Helper()
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if c != nil {
		if err := g.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

func identify(t testing.TB, g *Governor, key string) *User {
	t.Helper()
	u, rej := g.Identify([]byte(key))
	if rej != nil {
		t.Fatalf("identify: %v", rej)
	}
	return u
}

// redisServer is a real redis-server on a free loopback port.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

func startRedis(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not installed (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not installed (apt-get install -y redis-server)")
	}
	_ = bin
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &redisServer{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *redisServer) url() string { return "redis://127.0.0.1:" + strconv.Itoa(s.port) + "/0" }

func (s *redisServer) start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no orphan if the test binary dies
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(s.port), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			// The server answering must be this one: a restart on the
			// same port races other tests' servers for it (-p 3), and a
			// ping answered by another test's server passed for a
			// restart whose own server could not bind.
			if !strings.Contains(info, "process_id:"+strconv.Itoa(s.cmd.Process.Pid)+"\r") {
				log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
				s.t.Fatalf("another process answers on port %d (taken while this test's redis-server restarted); its log:\n%s", s.port, log)
			}
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log")) // a failed bind, ...
			s.t.Fatalf("redis-server did not answer: %v; its log:\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

func (s *redisServer) client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(s.port)})
	t.Cleanup(func() { c.Close() })
	return c
}
