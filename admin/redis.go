package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/logx"
)

// Redis layout (prefix default "infera:admin:"):
//
//	<prefix>data     hash: doc (the config, secrets sealed), version,
//	                 updated_at (RFC 3339), by (who made the change)
//	<prefix>changes  pub/sub channel: the new version after every change
//
// Writes are compare-and-set on the version in one Lua script, which also
// publishes; replicas adopt a new version on the message, and every
// SyncInterval compare versions in case a message was lost (for example
// while their connection was down). A Redis that lost the data, or went
// back to an older version of it, gets the replicas' data back.

var casScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'version')
if not cur or redis.call('HEXISTS', KEYS[1], 'doc') == 0 then cur = '0' end
if ARGV[1] ~= '' and ARGV[1] ~= cur then return {0, cur} end
local v = tonumber(cur) + 1
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'version', v, 'updated_at', ARGV[3], 'by', ARGV[4])
redis.call('PUBLISH', KEYS[2], v)
return {1, tostring(v)}
`)

// seedScript stores a document only when there is none (first start, or a
// Redis that lost its data).
var seedScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'doc') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'version', ARGV[1], 'updated_at', ARGV[3], 'by', ARGV[4])
redis.call('PUBLISH', KEYS[2], ARGV[1])
return 1
`)

// restoreScript writes a replica's document back at the replica's version
// when Redis still holds the older version the replica read (ARGV[1]): of
// replicas racing to put their data back, one writes and the others find
// a version they did not read, and adopt or restore against it.
var restoreScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'doc') == 0 or redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then
	return {0, redis.call('HGET', KEYS[1], 'version') or '0'}
end
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'version', ARGV[2], 'updated_at', ARGV[4], 'by', ARGV[5])
redis.call('PUBLISH', KEYS[2], ARGV[2])
return {1, ARGV[2]}
`)

type redisStorage struct {
	a       *Admin
	client  *redis.Client
	key     string
	channel string
	addr    string

	// mu orders adoptions of versions into the store; commit holds it from
	// the script to the swap, so this replica's own change is never
	// adopted first as if it came from another replica.
	mu sync.Mutex

	checkMu   sync.Mutex
	badVer    uint64 // version whose document failed to parse (logged once)
	badErr    error  // why badVer failed
	connected bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

const redisOpTimeout = 3 * time.Second

func newRedisStorage(a *Admin) (*redisStorage, error) {
	opts, err := redis.ParseURL(a.o.State)
	if err != nil {
		return nil, fmt.Errorf("--state: %w", logx.StripURL(err))
	}
	opts.DialTimeout = 2 * time.Second
	opts.ReadTimeout = redisOpTimeout
	opts.WriteTimeout = redisOpTimeout
	r := &redisStorage{
		a:       a,
		client:  redis.NewClient(opts),
		key:     a.o.RedisPrefix + "data",
		channel: a.o.RedisPrefix + "changes",
		addr:    opts.Addr,
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			r.client.Close()
		}
	}()
	// Wait a little for Redis: starting with other data than the shared
	// one would serve the wrong users and limits.
	deadline := time.Now().Add(a.o.RedisStartTimeout)
	for {
		ctx, cancel := context.WithTimeout(r.ctx, redisOpTimeout)
		err = r.client.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("cannot reach Redis at %s for the management data (--state): %w", r.addr, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err := r.loadOrSeed(); err != nil {
		return nil, err
	}
	a.store.SetReloadSink(func(c *config.Config, refsOnly bool) error {
		// A hand edit of the config file is a write to the shared data.
		a.mu.Lock()
		defer a.mu.Unlock()
		if refsOnly {
			return r.rereadRefs()
		}
		a.pending.Store(&pendingChange{cfg: c, who: actor{Who: "config file"}, action: "reload"})
		defer a.pending.Store(nil)
		_, err := r.commit(c, 0, actor{Who: "config file"}, false)
		return err
	})
	ok = true
	return r, nil
}

func (r *redisStorage) kind() string { return "redis" }

// rereadRefs resolves the secret references (env:, file:) of the config
// this replica serves again: a SIGHUP with the config file unchanged asks
// for a rotated key. Redis holds the references, not their values, and
// every replica reads its own, so nothing is written there; and the file's
// content is no change of the shared data (handed to Redis as one, it
// overwrote every change made through the API since the file was written,
// users and keys included, on every replica). a.mu must be held.
func (r *redisStorage) rereadRefs() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, v := r.a.store.Current()
	data, err := config.MarshalFile(cur)
	if err != nil {
		return err
	}
	next, err := config.Parse(data) // resolves the references again
	if err != nil {
		return err
	}
	if config.SameSecrets(cur, next) {
		return nil
	}
	r.a.pending.Store(&pendingChange{cfg: next, who: actor{Who: "config file"}, action: "reload secret references"})
	r.a.store.Replace(next, v)
	r.a.pending.Store(nil)
	return nil
}

// loadOrSeed adopts the data in Redis, or seeds an empty Redis with the
// newest snapshot of --persist-snapshot-dir (migration to Redis) or else
// what the store serves (the config file or the defaults).
func (r *redisStorage) loadOrSeed() error {
	ctx, cancel := context.WithTimeout(r.ctx, redisOpTimeout)
	defer cancel()
	vals, err := r.client.HMGet(ctx, r.key, "doc", "version").Result()
	if err != nil {
		return fmt.Errorf("cannot read management data from Redis at %s: %w", r.addr, err)
	}
	if doc, ok := vals[0].(string); ok {
		v, _ := strconv.ParseUint(fmt.Sprint(vals[1]), 10, 64)
		c, err := r.parse(doc)
		if err != nil {
			return fmt.Errorf("the management data in Redis at %s does not load: %w", r.addr, err)
		}
		r.adopt(c, v, actor{Who: "startup"}, "load from redis")
		slog.Info("management data loaded from Redis", "addr", r.addr, "version", v)
		return nil
	}
	c, from := r.a.store.Load(), "the config file or defaults"
	if r.a.store.Path() == "" {
		from = "defaults"
	}
	if dir := r.a.o.SnapshotDir; dir != "" {
		s, err := newSnapshots(dir, r.a.seal)
		if err != nil {
			return err
		}
		info, sc, _, err := s.newestUsable(r.a.store.Load())
		var none *errNoUsableSnapshot
		if errors.As(err, &none) && r.a.store.Path() != "" {
			slog.Error("no usable snapshot to seed Redis from; seeding it from the config file", "err", err)
		} else if err != nil {
			// Without a config file the defaults would go to every replica.
			return fmt.Errorf("cannot seed Redis from --persist-snapshot-dir: %w", err)
		}
		if sc != nil {
			c, from = sc, "snapshot "+info.Name
		}
	}
	seeded, err := r.seed(c, 1, actor{Who: "startup"})
	if err != nil {
		return err
	}
	if !seeded { // another replica seeded first
		return r.loadOrSeed()
	}
	r.adopt(c, 1, actor{Who: "startup"}, "seed redis from "+from)
	slog.Info("Redis had no management data; seeded it", "addr", r.addr, "from", from)
	return nil
}

func (r *redisStorage) parse(doc string) (*config.Config, error) {
	return r.a.seal.parseStored([]byte(doc), r.a.store.Load())
}

func (r *redisStorage) seed(c *config.Config, version uint64, who actor) (bool, error) {
	data, err := r.a.seal.encodeSealed(c)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(r.ctx, redisOpTimeout)
	defer cancel()
	n, err := seedScript.Run(ctx, r.client, []string{r.key, r.channel},
		version, string(data), time.Now().UTC().Format(time.RFC3339), who.Who).Int()
	if err != nil {
		return false, &errUnavailable{err: err}
	}
	return n == 1, nil
}

func (r *redisStorage) commit(c *config.Config, ifVersion uint64, who actor, checked bool) (uint64, error) {
	// What this router's flags make unusable (static workers under etcd
	// discovery, say) is refused here as the file store's Apply refuses it:
	// Redis's answer comes back through Replace, which checks nothing.
	if !checked {
		if err := r.a.store.Check(c); err != nil {
			return 0, err
		}
	}
	data, err := r.a.seal.encodeSealed(c)
	if err != nil {
		return 0, err
	}
	expect := ""
	if ifVersion != 0 {
		expect = strconv.FormatUint(ifVersion, 10)
	}
	by := who.Who
	if who.Remote != "" {
		by += " " + who.Remote
	}
	for attempt := 0; ; attempt++ {
		v, retry, err := r.cas(c, data, expect, by)
		if !retry || attempt > 0 {
			return v, err
		}
	}
}

// cas runs the compare-and-set script; retry is true when Redis had lost
// the data, or held an older version than ours, and this replica put its
// copy back.
func (r *redisStorage) cas(c *config.Config, data []byte, expect, by string) (uint64, bool, error) {
	ifVersion, _ := strconv.ParseUint(expect, 10, 64)
	ctx, cancel := context.WithTimeout(r.ctx, redisOpTimeout)
	defer cancel()
	r.mu.Lock()
	res, err := casScript.Run(ctx, r.client, []string{r.key, r.channel},
		expect, string(data), time.Now().UTC().Format(time.RFC3339), by).Slice()
	if err != nil {
		r.mu.Unlock()
		return 0, false, &errUnavailable{err: err, maybeApplied: unanswered(err)}
	}
	if len(res) != 2 {
		r.mu.Unlock()
		return 0, false, fmt.Errorf("BUG: unexpected answer from the CAS script: %v", res)
	}
	v, _ := strconv.ParseUint(fmt.Sprint(res[1]), 10, 64)
	if fmt.Sprint(res[0]) != "1" {
		r.mu.Unlock()
		if v == 0 {
			// Redis lost the data: put ours back and try once more.
			r.check()
			return 0, true, &config.VersionConflict{Want: ifVersion, Have: v, Reason: "Redis had lost the data"}
		}
		if v < ifVersion {
			// Redis went back to older data (restarted from its
			// persistence, or a failover to a lagging replica): put ours
			// back and try once more.
			r.check()
			return 0, true, &config.VersionConflict{Want: ifVersion, Have: v, Reason: "Redis held older data than this replica"}
		}
		// Adopt the other replica's write now rather than when its message
		// arrives: a change based on whatever is current retries on it, and
		// a conditional one's next GET shows it.
		r.check()
		if err := r.unloadable(v); err != nil {
			return 0, false, err
		}
		return 0, false, &config.VersionConflict{Want: ifVersion, Have: v, Reason: "changed in Redis by another replica"}
	}
	r.a.store.Replace(c, v)
	r.mu.Unlock()
	return v, false, nil
}

// unloadable is the answer to a write that lost to version v in Redis when
// this replica could not load v (a newer build's settings, another seal
// key, a hand edit of Redis): no retry can succeed, and overwriting v would
// drop what it holds. nil when v loaded (or was never read).
func (r *redisStorage) unloadable(v uint64) error {
	r.checkMu.Lock()
	defer r.checkMu.Unlock()
	if r.badVer != v || r.a.store.Version() >= v {
		return nil
	}
	return &httpError{status: http.StatusConflict, msg: fmt.Sprintf(
		"Redis holds version %d of the management data, which this replica cannot load (%v): a write from here would overwrite it; fix the data in Redis, or write through a replica that loads it", v, r.badErr)}
}

// unanswered reports whether err may have come after the command reached
// Redis: a timeout other than the dial's. Redis then may still run it.
func unanswered(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func (r *redisStorage) adopt(c *config.Config, v uint64, who actor, action string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.a.pending.Store(&pendingChange{cfg: c, who: who, action: action})
	r.a.store.Replace(c, v)
	r.a.pending.Store(nil)
}

func (r *redisStorage) start(a *Admin) {
	r.wg.Add(2)
	go r.subscribe()
	go r.poll()
}

func (r *redisStorage) subscribe() {
	defer r.wg.Done()
	ps := r.client.Subscribe(r.ctx, r.channel)
	defer ps.Close()
	// go-redis reconnects and resubscribes on its own; what was published
	// meanwhile is lost, so each (re)subscription's confirmation is a
	// reason to look as a message is: a write that landed while the
	// subscription was down (a stall broke it) waited for the next poll.
	ch := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-r.ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
			r.check()
		}
	}
}

func (r *redisStorage) poll() {
	defer r.wg.Done()
	t := time.NewTicker(r.a.o.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
			r.check()
		}
	}
}

// check compares the version in Redis with ours and adopts Redis's data
// when it is newer. A Redis without data (restarted without persistence,
// or flushed) is seeded back with what this replica serves, and so is a
// Redis holding an older version than ours (see restore).
func (r *redisStorage) check() {
	r.checkMu.Lock()
	defer r.checkMu.Unlock()
	// A restore that loses the race to another replica's looks again, to
	// adopt that replica's newer version or restore over its older one.
	for pass := 0; pass < 3 && r.checkOnce(); pass++ {
	}
}

// checkOnce is one pass of check; it reports whether to look again.
// checkMu must be held.
func (r *redisStorage) checkOnce() bool {
	ctx, cancel := context.WithTimeout(r.ctx, redisOpTimeout)
	defer cancel()
	vals, err := r.client.HMGet(ctx, r.key, "doc", "version").Result()
	if err != nil {
		if r.connected && !errors.Is(err, context.Canceled) {
			slog.Warn("lost Redis; serving the last management data until it is back", "addr", r.addr, "err", err)
		}
		r.connected = false
		return false
	}
	if !r.connected {
		r.connected = true
	}
	doc, ok := vals[0].(string)
	if !ok {
		c, v := r.a.store.Current()
		seeded, err := r.seed(c, v, actor{Who: "replica"})
		if err == nil && seeded {
			slog.Warn("Redis had lost the management data; put this replica's copy back", "addr", r.addr, "version", v)
		}
		return false
	}
	v, err := strconv.ParseUint(fmt.Sprint(vals[1]), 10, 64)
	if err != nil {
		return false
	}
	if v < r.a.store.Version() {
		return r.restore(v)
	}
	if v == r.a.store.Version() {
		return false // nothing newer (our own commit may have landed since the read)
	}
	c, err := r.parse(doc)
	if err != nil {
		if r.badVer != v {
			r.badVer, r.badErr = v, err
			slog.Error("management data in Redis does not load; keeping the current config", "addr", r.addr, "version", v, "err", err)
		}
		return false
	}
	r.mu.Lock()
	if v > r.a.store.Version() { // never back: a write of ours may have come in between
		r.a.store.Replace(c, v)
	}
	r.mu.Unlock()
	return false
}

// restore writes this replica's document back to a Redis that holds an
// older version (old) than ours: Redis went back in time (restarted from
// an RDB or AOF written before the last changes, or a failover to a
// replica behind the primary), and the replicas hold the writes it lost.
// Their data wins: every write they serve was acknowledged to a client,
// while Redis's older document only lacks some of them. (A write made on
// top of Redis's older data before a replica notices, by a replica started
// after the rollback, is overwritten.)
//
// The document goes back at our own version, not above it: a version then
// still names one document, so replicas at that version have nothing to
// adopt, those behind it adopt it, and a replica that was itself behind
// and restored first is overwritten by the next one that holds a newer
// version, until Redis holds the newest any replica had. Writes then carry
// on from there, above what every replica holds.
//
// It reports whether to look again: another replica changed Redis first.
// checkMu must be held.
func (r *redisStorage) restore(old uint64) bool {
	c, v := r.a.store.Current()
	if v <= old {
		return true // a write of ours landed since the read
	}
	data, err := r.a.seal.encodeSealed(c)
	if err != nil {
		slog.Error("cannot encode this replica's management data to put it back into Redis", "addr", r.addr, "err", err)
		return false
	}
	ctx, cancel := context.WithTimeout(r.ctx, redisOpTimeout)
	defer cancel()
	res, err := restoreScript.Run(ctx, r.client, []string{r.key, r.channel},
		old, v, string(data), time.Now().UTC().Format(time.RFC3339), "replica").Slice()
	if err != nil {
		return false // the next check tries again
	}
	if len(res) != 2 {
		slog.Error("BUG: unexpected answer from the restore script", "answer", res)
		return false
	}
	if fmt.Sprint(res[0]) != "1" {
		return true
	}
	slog.Warn(fmt.Sprintf("Redis held version %d of the management data, older than ours %d: wrote ours back as %d", old, v, v),
		"addr", r.addr, "redis_version", old, "version", v)
	return false
}

func (r *redisStorage) close() {
	r.cancel()
	r.wg.Wait()
	r.client.Close()
}
