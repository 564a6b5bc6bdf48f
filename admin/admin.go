package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/lockout"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/internal/realip"
)

// Options configures the configuration center. Fields map to `infera
// serve` flags (see OptionsFromFlags).
type Options struct {
	// Store is the router's config store (required). Every change is
	// applied through it.
	Store *config.Store
	// Addr is the admin listener's host:port; empty keeps the listener off.
	Addr string
	// TLS, when set, serves the admin API and console over HTTPS.
	TLS *tls.Config
	// Key authenticates admin requests ("Authorization: Bearer <key>").
	// Empty keeps the listener off. Without SealKey it also seals the
	// secrets of snapshots, exports and Redis (all replicas and restores
	// must use the same key).
	Key string
	// SealKey, when set, seals those secrets instead of Key, so that
	// holders of the admin key cannot open an export; secrets Key sealed
	// before are still opened (and sealed with SealKey when next written).
	SealKey string
	// OlderKeys only open secrets sealed before (OptionsFromFlags: the
	// --api-key when --admin-key is set apart, the admin key's default).
	OlderKeys []string
	// KeyLabel names the key in the audit log (which flag gave it).
	KeyLabel string
	// State is "" (management data in the config file or in memory) or a
	// redis:// or rediss:// URL (management data in Redis).
	State string
	// SnapshotDir is --persist-snapshot-dir: periodic snapshots, restored on
	// start. With State redis it only seeds an empty Redis.
	SnapshotDir string
	// Backup returns the backup settings of a config (frequency and
	// rotation). nil: config.DefaultBackup().
	Backup func(*config.Config) config.Backup
	// Fleet is the router's view for the fleet page; may be set later with
	// SetFleet.
	Fleet Fleet
	// RedisPrefix prefixes every Redis key and channel. Default "infera:admin:".
	RedisPrefix string
	// SyncInterval is how often a replica checks the Redis version in case
	// a pub/sub message was lost. Default 1s.
	SyncInterval time.Duration
	// AuditSize bounds the in-memory audit log. Default 1000.
	AuditSize int
	// RedisStartTimeout is how long New waits for Redis. Default 10s.
	RedisStartTimeout time.Duration
	// AllowedHosts are the host names API requests may name in Host
	// besides IP addresses, localhost and the machine's name (a leading
	// dot allows subdomains, "*" any name): see hostAllowed.
	AllowedHosts []string
	// TrustedProxies are --trusted-proxies: addresses and CIDR networks
	// of proxies whose X-Forwarded-For names the client (internal/realip),
	// for the wrong-key lockout and the audit log. Empty: every client is
	// its TCP peer.
	TrustedProxies []string
}

// OptionsFromFlags maps `infera serve` flags to Options.
func OptionsFromFlags(f *config.Serve, store *config.Store) Options {
	o := Options{Store: store, State: f.State, SnapshotDir: f.PersistSnapshotDir, SealKey: f.AdminSealKey,
		AllowedHosts: append([]string{f.AdminHost}, f.AdminAllowedHosts...), TrustedProxies: f.TrustedProxies}
	switch {
	case f.AdminKey != "":
		o.Key, o.KeyLabel = f.AdminKey, "admin-key"
	case f.APIKey != "":
		o.Key, o.KeyLabel = f.APIKey, "api-key"
	}
	o.OlderKeys = olderKeys(f)
	if f.AdminPort != 0 {
		port := f.AdminPort
		if port == config.AdminPortAny {
			port = 0 // the kernel picks; Start logs the address
		}
		o.Addr = net.JoinHostPort(f.AdminHost, strconv.Itoa(port))
		if o.Key != "" && len(o.Key) < minKeyLen {
			slog.Warn("the admin key is short: anyone who reaches the admin listener may guess it; use 32 random characters or more (infera key)",
				"length", len(o.Key), "admin_host", f.AdminHost)
		}
	}
	return o
}

// The admin listener's deadlines (variables: tests shorten them).
var (
	// readTimeout bounds reading a request, its body included, and
	// writeTimeout writing its answer (both from the end of its head): a
	// client that trickles its bytes holds a connection no longer.
	readTimeout  = 60 * time.Second
	writeTimeout = 60 * time.Second
	// transferTimeout replaces both, once the key is checked, for an
	// import's body and an export's or a stored snapshot's download: up
	// to 64 MiB (maxSnapshotBytes), which 60 s cut below about 1.1 MB/s
	// (an import of a 4 MB export sent at 40 KB/s was answered 500 "i/o
	// timeout"). 10 minutes take 64 MiB at about 110 KB/s.
	transferTimeout = 10 * time.Minute
	// importIdleTimeout cuts an import's body (408) once no byte of it
	// arrived for that long, within the transferTimeout: imports run one
	// at a time, and a client that announced a body and sent nothing (or
	// a byte a minute) held the slot, and every import waiting for it,
	// for the whole transferTimeout. A slow upload that keeps moving
	// still has the transferTimeout (idleBody).
	importIdleTimeout = 60 * time.Second
)

// longTransfer gives the request's body (read) and its answer the
// transferTimeout from now, and returns that deadline.
func longTransfer(w http.ResponseWriter, read bool) time.Time {
	rc := http.NewResponseController(w)
	d := time.Now().Add(transferTimeout)
	if read {
		rc.SetReadDeadline(d)
	}
	rc.SetWriteDeadline(d)
	return d
}

// minKeyLen is the admin key length below which the router warns at start.
const minKeyLen = 16

// Admin is the configuration center of one router process.
type Admin struct {
	o       Options
	store   *config.Store
	seal    *sealer
	st      storage
	keySum  [32]byte
	fleet   atomic.Value // Fleet
	audit   *auditLog
	snaps   *snapshots // nil without a snapshot dir, or with Redis
	started time.Time
	// hostname is this machine's name, lower case (hostAllowed).
	hostname string

	mu sync.Mutex // serializes changes made through the admin
	// closed is set by Close, under mu, before the last snapshot: a
	// change that reaches its commit later is refused (errClosed), so no
	// change lands after the snapshot that is to hold the last data.
	closed  bool
	pending atomic.Pointer[pendingChange]
	// importing is held by the import (or dry run) running: they run one
	// at a time, from reading the body to recording the audit entry, so
	// that their peaks of memory (5 to 7 times the body each, see
	// postImport) do not add up.
	importing chan struct{}

	ln   net.Listener
	srv  *http.Server
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	// etags counts the ETags computed by encoding the config (etag): an
	// answer computes its own at most once, and none for the config an
	// audit entry just encoded.
	etags atomic.Uint64

	fails *lockout.Guard // wrong keys per client address (api.go)
	// shared counts them in Redis with the other routers (lockout.go);
	// nil: this process alone.
	shared *govern.Lockouts
	// trusted are Options.TrustedProxies; nil: trust no one.
	trusted *realip.Proxies
}

// pendingChange tells the store's change hook who made the change it sees.
type pendingChange struct {
	cfg    *config.Config
	who    actor
	action string
}

// actor is who made a change.
type actor struct {
	Who    string `json:"who"`
	Remote string `json:"remote,omitempty"`
}

// storage is where management data lives: the config file or memory
// (local), or Redis.
type storage interface {
	// commit stores c when the current version is ifVersion (0: any) and
	// returns the new version. The store serves c when commit returns.
	// checked says c passed Store.Check and has not changed since: it is
	// not validated and checked again.
	commit(c *config.Config, ifVersion uint64, who actor, checked bool) (uint64, error)
	// kind is file, memory or redis.
	kind() string
	start(a *Admin)
	close()
}

// local keeps management data in the config file (written back
// atomically) or in memory.
type local struct{ store *config.Store }

func (l local) commit(c *config.Config, ifVersion uint64, _ actor, checked bool) (uint64, error) {
	if checked {
		return l.store.ApplyChecked(c, ifVersion)
	}
	return l.store.Apply(c, ifVersion)
}

func (l local) kind() string {
	if l.store.Path() != "" {
		return "file"
	}
	return "memory"
}
func (local) start(*Admin) {}
func (local) close()       {}

// New builds the configuration center and brings the store up to date:
// with Redis it loads (or seeds) the management data there; with a
// snapshot directory and no config file it restores the newest good
// snapshot. Call it right after config.Open, before anything reads the
// store, then Start.
func New(o Options) (*Admin, error) {
	if o.Store == nil {
		panic("BUG: admin.Options.Store is nil")
	}
	if o.Backup == nil {
		o.Backup = func(*config.Config) config.Backup { return config.DefaultBackup() }
	}
	if o.RedisPrefix == "" {
		o.RedisPrefix = "infera:admin:"
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = time.Second
	}
	if o.RedisStartTimeout <= 0 {
		o.RedisStartTimeout = 10 * time.Second
	}
	if o.AuditSize <= 0 {
		o.AuditSize = 1000
	}
	if o.KeyLabel == "" {
		o.KeyLabel = "admin-key"
	}
	trusted, err := realip.Parse(o.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("--trusted-proxies: %w", err)
	}
	seal := newSealer(o.SealKey, o.Key, o.OlderKeys...)
	a := &Admin{
		trusted:  trusted,
		o:        o,
		store:    o.Store,
		seal:     seal,
		audit:    newAuditLog(o.AuditSize, seal),
		started:  time.Now(),
		hostname: machineName(),
		stop:     make(chan struct{}),
		fails:    newAuthFailures(),

		importing: make(chan struct{}, 1),
	}
	a.keySum = sha256.Sum256([]byte(o.Key))
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.audit.run(a.stop)
	}()
	ok := false
	defer func() {
		if !ok {
			close(a.stop)
			a.wg.Wait()
		}
	}()
	if o.Fleet != nil {
		a.fleet.Store(fleetBox{o.Fleet})
	} else {
		a.fleet.Store(fleetBox{noFleet{}})
	}
	if o.Key == "" && o.Addr != "" {
		slog.Warn("admin API off: no --admin-key and no --api-key")
	}
	if o.Key == "" && o.SealKey == "" && (o.SnapshotDir != "" || o.State != "") {
		slog.Warn("no admin key: upstream keys in snapshots are stored in clear (set --admin-key or --admin-seal-key to seal them)")
	}
	a.store.OnChange(a.onStoreChange)
	switch {
	case hasPrefixFold(o.State, "redis://") || hasPrefixFold(o.State, "rediss://"):
		r, err := newRedisStorage(a)
		if err != nil {
			return nil, err
		}
		a.st = r
		if o.SnapshotDir != "" {
			slog.Info("periodic snapshots are off with --state redis (Redis keeps its own persistence); --persist-snapshot-dir only seeded an empty Redis", "dir", o.SnapshotDir)
		}
	case o.State != "":
		return nil, fmt.Errorf("--state %q: want empty or redis://host:port[/db]", logx.RedactURL(o.State))
	default:
		a.st = local{store: a.store}
		if o.SnapshotDir != "" {
			s, err := newSnapshots(o.SnapshotDir, a.seal)
			if err != nil {
				return nil, err
			}
			a.snaps = s
			if a.store.Path() == "" {
				if err := a.restoreNewest(); err != nil {
					return nil, err
				}
			} else if err := a.restoreNewerThanFile(); err != nil {
				return nil, err
			}
		}
	}
	ok = true
	return a, nil
}

type fleetBox struct{ Fleet }

// SetFleet gives the console the router's fleet view.
func (a *Admin) SetFleet(f Fleet) {
	if f == nil {
		f = noFleet{}
	}
	a.fleet.Store(fleetBox{f})
}

func (a *Admin) fleetView() Fleet { return a.fleet.Load().(fleetBox).Fleet }

// Start opens the admin listener (when an address and a key are set) and
// starts the backup loop or the Redis sync.
func (a *Admin) Start() error {
	a.st.start(a)
	if a.snaps != nil {
		a.wg.Add(1)
		go a.backupLoop()
	}
	if a.o.Addr == "" || a.o.Key == "" {
		return nil
	}
	ln, err := listen("tcp", a.o.Addr)
	if err != nil {
		return fmt.Errorf("cannot listen on admin address %s for the admin API and console (--admin-host, --admin-port): %w", a.o.Addr, err)
	}
	scheme := "http"
	if a.o.TLS != nil {
		ln, scheme = tls.NewListener(ln, a.o.TLS), "https"
	} else if !loopbackOnly(a.o.Addr, ln.Addr()) {
		// Neither the host nor TLS changes at a reload (SIGHUP reloads
		// the certificate of a listener that has one): once, here.
		slog.Warn("the admin API listens beyond loopback without TLS: the admin key, minted API keys and every setting cross the network in clear; set --tls-cert-file and --tls-key-file, or --admin-host 127.0.0.1 behind a TLS proxy",
			"admin_addr", a.o.Addr, "listening", ln.Addr().String())
	}
	a.ln = ln
	a.srv = &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          nil,
		ConnContext:       withConn, // a queued import watches its client (untilClientLeaves)
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("admin listener stopped", "err", err)
		}
	}()
	slog.Info("admin API and console listening", "addr", scheme+"://"+ln.Addr().String()+"/", "storage", a.st.kind())
	return nil
}

// listen opens the admin listener (a variable: a test of the warning for
// an address beyond loopback listens on loopback all the same).
var listen = net.Listen

// loopbackOnly reports whether the admin listener, configured as addr
// (--admin-host and --admin-port) and bound at bound, is reachable from
// this machine alone: an IP address of the loopback network, or a name
// (localhost) that was bound to one. No host, 0.0.0.0 and :: are every
// interface.
func loopbackOnly(addr string, bound net.Addr) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().IsLoopback()
	}
	tcp, ok := bound.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// Addr returns the listener's address (nil when off).
func (a *Admin) Addr() net.Addr {
	if a.ln == nil {
		return nil
	}
	return a.ln.Addr()
}

// shutdownGrace is how long Close lets requests in flight finish (a
// variable: tests shorten it).
var shutdownGrace = 5 * time.Second

// errClosed refuses a change that reaches its commit after Close began.
var errClosed = &httpError{status: http.StatusServiceUnavailable, msg: "the router is shutting down: nothing was changed; send it again once it is back"}

// Close stops the listener and the loops, writing a last snapshot when the
// data changed since the newest one.
//
// Requests in flight get shutdownGrace to finish; then their connections
// are closed (an import still uploading fails reading its body), and a
// change that reaches its commit after that is refused: a change either
// lands before the last snapshot (which then holds it) or not at all.
// Without the cut, an import uploading past the grace was read on and
// committed after the last snapshot, and a restart from the snapshots
// lost it although it had been answered 200.
func (a *Admin) Close() error {
	a.once.Do(func() {
		close(a.stop)
		if a.srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			if err := a.srv.Shutdown(ctx); err != nil {
				a.srv.Close() // past the grace: cut what is still in flight
			}
			cancel()
		}
		// A change committing now finishes first (it holds mu); any
		// later one is refused.
		a.mu.Lock()
		a.closed = true
		a.mu.Unlock()
		a.wg.Wait()
		if a.snaps != nil {
			if _, err := a.snapshot(kindAuto); err != nil {
				slog.Error("cannot write the last snapshot at shutdown", "err", err)
			}
		}
		a.st.close()
	})
	return nil
}

// checkKey compares a presented key with the admin key in constant time
// (over fixed-length digests, so the length does not leak either).
func (a *Admin) checkKey(k string) bool {
	if a.o.Key == "" {
		return false
	}
	sum := sha256.Sum256([]byte(k))
	return subtle.ConstantTimeCompare(sum[:], a.keySum[:]) == 1
}

// etag is the version and a digest of the content, so a version number
// from before a restart never matches a different config.
//
// The digest is the one the audit took of c's encoding when it recorded
// the change that made c (an import's audit entry encodes the new config
// before the answer gives its ETag), or the one computed for the last ETag
// given: a config is encoded for its ETag only when neither is c's.
func (a *Admin) etag(c *config.Config, v uint64) string {
	sum, ok := a.seal.redactedDigestOf(c)
	if !ok {
		a.etags.Add(1)
		data, err := a.seal.encodeRedacted(c)
		if err != nil {
			panic("BUG: " + err.Error())
		}
		sum = a.seal.noteRedacted(c, data)
	}
	return `"` + strconv.FormatUint(v, 10) + "-" + hex.EncodeToString(sum[:6]) + `"`
}

// errConflict is a stale If-Match: someone changed the config in between.
type errConflict struct {
	have uint64
	msg  string
}

func (e *errConflict) Error() string { return e.msg }

// errUnavailable is a storage that cannot be reached. maybeApplied is set
// when a write was sent but not answered in time: Redis may still run it
// (a stalled server, a reply lost on the way), and the replicas then adopt
// it like any other write.
type errUnavailable struct {
	err          error
	maybeApplied bool
}

func (e *errUnavailable) Error() string {
	if e.maybeApplied {
		return "management storage did not answer in time (" + e.err.Error() + "): the write may still be applied when it does; GET /api/version shows whether it was"
	}
	return "management storage unavailable: " + e.err.Error()
}
func (e *errUnavailable) Unwrap() error { return e.err }

// maxUnlockedBefore is how many times changeChecked runs its before with
// the admin lock released (see there) before it runs it under the lock.
const maxUnlockedBefore = 3

// casRetryFor bounds how long an unconditional change retries when other
// replicas keep committing first.
const casRetryFor = 10 * time.Second

// change builds a new config from the current one with mutate and commits
// it. ifVersion 0 bases the change on whatever is current (retrying when a
// concurrent change lands first); otherwise a different current version is
// a conflict. A change that changes nothing commits nothing.
// A change that makes a new version is counted in
// infera_config_applies_total{result="ok"} (a refused one is counted by
// the API route, countRefused).
func (a *Admin) change(who actor, action string, ifVersion uint64, mutate func(doc map[string]any) error) (*config.Config, uint64, error) {
	return a.changeChecked(who, action, ifVersion, nil, 0, mutate, nil)
}

// changeChecked is change with checked, the config mutate makes from the
// config of version checkedVer, parsed and validated by the caller (an
// import): while that version is current it is committed as it is,
// without building and parsing the document again (a second parse of an
// import was a third of what it allocated); once another has landed,
// mutate makes the change as in change.
//
// before, if not nil, runs before each commit with the config and version
// the commit replaces (an import's snapshot of the data it replaces), and
// the commit happens only if that config and version are still current
// when before returns: no write can land between the two. It runs with
// the admin lock released (a snapshot's fsync, which every other admin
// write waited for while it ran under the lock), so other writes may land
// meanwhile: the change is then made again on the new base, before runs
// again (it must tell the base it already ran for, and discard what it
// made for a base no commit followed), or, with ifVersion, refused. After
// maxUnlockedBefore such tries lost to other writes, before runs under the
// lock, so a stream of writes cannot keep a change from committing. A hand
// edit picked up meanwhile fails the commit, which is then retried or
// refused the same way. An error from before changes nothing.
func (a *Admin) changeChecked(who actor, action string, ifVersion uint64, checked *config.Config, checkedVer uint64, mutate func(doc map[string]any) error, before func(cur *config.Config, ver uint64) error) (*config.Config, uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, 0, errClosed
	}
	if err := a.syncFile(); err != nil {
		return nil, 0, err
	}
	var deadline time.Time
	unlocked := 0 // runs of before outside the lock
	for attempt := 0; ; attempt++ {
		cur, ver := a.store.Current()
		if ifVersion != 0 && ifVersion != ver {
			return nil, 0, &errConflict{have: ver, msg: fmt.Sprintf("the config changed since version %d (now %d): reload and apply your change again", ifVersion, ver)}
		}
		next := checked
		asChecked := checked != nil && ver == checkedVer
		if !asChecked {
			curData, err := encodeClear(cur)
			if err != nil {
				return nil, 0, err
			}
			doc, err := decodeDoc(curData)
			if err != nil {
				return nil, 0, fmt.Errorf("BUG: a config does not decode: %w", err)
			}
			if err := mutate(doc); err != nil {
				return nil, 0, err
			}
			next, err = a.seal.parseDoc(doc, cur)
			if err == nil {
				err = keysCapErr(cur, next)
			}
			if err != nil {
				return nil, 0, err
			}
		}
		if sameAs(cur, next) {
			return cur, ver, nil
		}
		if why := a.startupFixed(); why != "" {
			if name := startupChanged(cur, next); name != "" {
				return nil, 0, startupErr(name, why)
			}
		}
		if before != nil {
			if unlocked < maxUnlockedBefore {
				unlocked++
				err := func() error {
					a.mu.Unlock()
					defer a.mu.Lock()
					return before(cur, ver)
				}()
				if err != nil {
					return nil, 0, err
				}
				if c, v := a.store.Current(); c != cur || v != ver {
					attempt-- // not a conflict of the commit
					continue
				}
			} else if err := before(cur, ver); err != nil {
				return nil, 0, err
			}
		}
		if a.closed { // Close began while before ran unlocked
			return nil, 0, errClosed
		}
		a.pending.Store(&pendingChange{cfg: next, who: who, action: action})
		// The config checked by the caller (Store.Check) is stored as it
		// is: nothing above changes it.
		nv, err := a.st.commit(next, ver, who, asChecked)
		a.pending.Store(nil)
		var vc *config.VersionConflict
		if errors.As(err, &vc) {
			// Unconditional (a creation, an import without If-Match):
			// another write landed first and was adopted; base the change
			// on it and try again. With Redis the other writers are
			// replicas that may keep winning for a while: retry with a
			// growing random pause, so replicas in step fall out of it,
			// for as long as a client would wait.
			if ifVersion == 0 {
				if attempt == 0 {
					deadline = time.Now().Add(casRetryFor)
				}
				if attempt < 3 {
					continue
				}
				if a.st.kind() == "redis" && time.Now().Before(deadline) {
					time.Sleep(time.Duration(rand.Int64N(int64(min(attempt, 20)) * int64(time.Millisecond))))
					continue
				}
			}
			return nil, 0, &errConflict{have: vc.Have, msg: vc.Error()}
		}
		if err != nil {
			return nil, 0, err
		}
		config.CountApply(true)
		return next, nv, nil
	}
}

// syncFile picks up a hand edit of the config file the poll has not seen
// yet, before a change is based on the current version: the write then
// carries a stale version and conflicts, even when it would change nothing
// (answering 200 with values the file no longer holds would hide the
// edit). A hand edit that does not parse refuses the write, whether or
// not the poll saw it first, and a write that would change nothing too.
// Without a config file (or with Redis, where the file's edits are writes
// of their own) it does nothing.
func (a *Admin) syncFile() error {
	if a.st.kind() != "file" {
		return nil
	}
	_, err := a.store.Reload()
	if err == nil {
		err = a.store.Refused() // the poll saw the broken edit first
	}
	if err != nil {
		return &errConflict{have: a.store.Version(), msg: fmt.Sprintf("the config file %q was edited by hand and does not load (%v): fix or revert it first", a.store.Path(), err)}
	}
	return nil
}

// startupSections are read from the config file once, at start.
var startupSections = []string{"llm_gateway", "storage"}

// startupChanged names the first startup section that differs between x
// and y ("" if none).
func startupChanged(x, y *config.Config) string {
	if !reflect.DeepEqual(x.LLMGateway, y.LLMGateway) {
		return "llm_gateway"
	}
	if len(x.Storage) != 0 || len(y.Storage) != 0 {
		if !reflect.DeepEqual(x.Storage, y.Storage) {
			return "storage"
		}
	}
	return ""
}

// startupFixed says why the startup sections cannot change through the
// API on this router ("" when they can): the start reads them from the
// config file, and nothing would carry a change there.
func (a *Admin) startupFixed() string {
	switch {
	case a.store.Path() == "":
		return "this router has no config file (--config), so a change here would never take effect; use --persist-snapshot-dir"
	case a.st != nil && a.st.kind() == "redis":
		return "with --state redis the API writes to Redis, never to the config file, so a change here would never take effect; edit it in the config file"
	}
	return ""
}

// startupErr refuses a change of startup configuration (see startupFixed).
func startupErr(name, why string) error {
	return &httpError{status: http.StatusConflict, msg: name + " is startup configuration, read from the config file at start: " + why}
}

// sameAs reports whether configs x and y are the same: whether their
// clear encodings (encodeClear) compare the same (sameEncoding). The users,
// the bulk of a large config, are compared as values (sameUsers) and the
// rest by the encodings of the configs without them: encoding both whole
// (50,000 users: about 10 MB each, in buffers of 1.125 times that) only to
// compare was one of the largest things a change allocated.
func sameAs(x, y *config.Config) bool {
	if !sameUsers(x.Users, y.Users) {
		return false
	}
	xr, yr := *x, *y
	xr.Users, yr.Users = nil, nil
	xd, err1 := encodeClear(&xr)
	yd, err2 := encodeClear(&yr)
	return err1 == nil && err2 == nil && sameEncoding(xd, yd)
}

// sameUsers reports whether two users lists encode alike, an empty list
// and null counting as the same (sameEncoding): a user is plain values (no
// secret), which encode as they are, and no users setting keeps [] apart
// from null (nilMeansDefault). Strings that encode alike only because
// encoding/json replaced their invalid UTF-8 count as different (a
// validated config has none). TestSameAsAgreesWithTheEncodingsComparison
// holds it to the encodings, and fails when User gains a field.
func sameUsers(x, y []config.User) bool {
	return slices.EqualFunc(x, y, func(a, b config.User) bool {
		return a.Name == b.Name && a.Template == b.Template && a.Enabled == b.Enabled &&
			slices.Equal(a.Keys, b.Keys) && slices.Equal(a.Models, b.Models)
	})
}

// sameEncoding reports whether two encodings of configs are the same, an
// empty list and null counting as the same (the console saves [] where the
// file had nothing: saving an unchanged form makes no version), but in
// the settings where the two differ (nilMeansDefault). Both come from the
// same encoder (fields in one order, map keys sorted, compact), so this is
// one pass over the bytes: decoding both to compare them allocated about
// ten times the document on every write.
func sameEncoding(x, y []byte) bool {
	inString, escaped := false, false
	// kept[d] tells whether the container open at depth d is (within) a
	// nilMeansDefault setting, where [] and null differ.
	var buf [32]bool
	kept := buf[:0]
	i, j := 0, 0
	for i < len(x) && j < len(y) {
		c := x[i]
		if c == y[j] {
			switch {
			case escaped:
				escaped = false
			case inString:
				escaped = c == '\\'
				inString = c != '"'
			case c == '"':
				inString = true
			case c == '{' || c == '[':
				kept = append(kept, keptAt(x, i, kept))
			case c == '}' || c == ']':
				if len(kept) > 0 {
					kept = kept[:len(kept)-1]
				}
			}
			i++
			j++
			continue
		}
		if inString || keptAt(x, i, kept) {
			return false
		}
		switch {
		case bytes.HasPrefix(x[i:], []byte("[]")) && bytes.HasPrefix(y[j:], []byte("null")):
			i, j = i+2, j+4
		case bytes.HasPrefix(x[i:], []byte("null")) && bytes.HasPrefix(y[j:], []byte("[]")):
			i, j = i+4, j+2
		default:
			return false
		}
	}
	return i == len(x) && j == len(y)
}

// keptAt tells whether the value at x[i] is (within) a nilMeansDefault
// setting, kept being the containers open around it.
func keptAt(x []byte, i int, kept []bool) bool {
	if len(kept) > 0 && kept[len(kept)-1] {
		return true
	}
	for _, k := range nilMeansDefaultKeys {
		if bytes.HasSuffix(x[:i], k) {
			return true
		}
	}
	return false
}

// nilMeansDefaultKeys are the nilMeansDefault settings as they precede
// their value in an encoding: "name":
var nilMeansDefaultKeys = func() [][]byte {
	var out [][]byte
	for k := range nilMeansDefault {
		out = append(out, []byte(`"`+k+`":`))
	}
	return out
}()

// nilMeansDefault names the list settings whose absence is a default and
// whose empty list is a choice: protocol.reasoning_map.thinking_off_efforts
// (absent: none and minimal turn thinking off; []: no effort does).
var nilMeansDefault = map[string]bool{"thinking_off_efforts": true}

// onStoreChange runs under the store lock after every swap: it writes the
// audit entry, naming the admin actor when the change came from here and
// the file or another replica otherwise.
func (a *Admin) onStoreChange(old, cur *config.Config) {
	who, action := actor{Who: "config file"}, "reload"
	if p := a.pending.Load(); p != nil && p.cfg == cur {
		who, action = p.who, p.action
	} else if a.st != nil && a.st.kind() == "redis" {
		who, action = actor{Who: "another replica (redis)"}, "sync"
	}
	a.audit.add(who, action, a.store.Version(), old, cur)
}

// hasPrefixFold is strings.HasPrefix ignoring case (URL schemes are
// case-insensitive, and go-redis accepts REDIS://).
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// machineName is this machine's host name, lower case ("" if unknown).
func machineName() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}
