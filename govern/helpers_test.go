package govern

import (
	"context"
	"fmt"
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
	"github.com/infera/infera/internal/freeport"
	"github.com/infera/infera/internal/testsrv"
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

// redisServer is a real redis-server on a free loopback port, behind a
// testsrv.Front: port is the front's, which the test holds from start to
// end, and each start runs the server on a fresh port of its own behind
// it. A restart on the server's own port could lose it to another test's
// server in the instant between the stop and the start (go test -p).
type redisServer struct {
	t      testing.TB
	port   int // the front's: what clients dial
	bport  int // the running server's own
	dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	front  *testsrv.Front
}

func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not installed (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not installed (apt-get install -y redis-server)")
	}
	f := testsrv.NewFront(t)
	s := &redisServer{t: t, port: f.Port, dir: t.TempDir(), front: f}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *redisServer) url() string { return "redis://127.0.0.1:" + strconv.Itoa(s.port) + "/0" }

// start starts the server (with the dump in its directory, if a test
// saved one) on a fresh port and puts it behind the front.
func (s *redisServer) start() {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		err := s.launch()
		if err == nil {
			s.front.Up("127.0.0.1:" + strconv.Itoa(s.bport))
			return
		}
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		if attempt < 3 && strings.Contains(string(log), "Address already in use") {
			os.Truncate(filepath.Join(s.dir, "redis.log"), 0) // another process took the fresh port first
			continue
		}
		s.t.Fatalf("%v; its log:\n%s", err, log)
	}
}

// launch runs redis-server on a fresh port and waits until it answers.
func (s *redisServer) launch() error {
	port, err := freeport.Get()
	if err != nil {
		s.t.Fatal(err)
	}
	s.bport = port
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no orphan if the test binary dies
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			// The server answering must be this one, not another
			// process that took the port first.
			if !strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r") {
				cmd.Process.Kill()
				<-exited
				return fmt.Errorf("another process answers on port %d", port)
			}
			s.cmd, s.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited before it answered")
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server did not answer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server: connecting is refused until the next start, and
// the connections clients had end.
func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	s.front.Down()
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

func (s *redisServer) client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(s.port)})
	t.Cleanup(func() { c.Close() })
	return c
}
