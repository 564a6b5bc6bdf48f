package discovery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/fleet"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// DefaultEtcdPrefix is where worker records live: <prefix><id>.
const DefaultEtcdPrefix = "/infera/workers/"

// EtcdConfig configures the etcd client shared by EtcdWatcher (server) and
// EtcdRegistrar (worker).
type EtcdConfig struct {
	// Endpoints are host:port or URLs (--etcd-endpoint, comma-separated).
	// A bare host:port uses https when TLS is configured, http otherwise.
	Endpoints []string
	// Prefix holds the records; default DefaultEtcdPrefix.
	Prefix string
	// DialTimeout bounds connecting; default 3s.
	DialTimeout time.Duration
	// RequestTimeout bounds each list/probe/put; default 3s.
	RequestTimeout time.Duration
	// HealthInterval is how often the watcher probes etcd to notice an
	// outage (a watch alone waits silently); default 2s.
	HealthInterval time.Duration
	// CAFile verifies the server (--etcd-ca-file); CertFile and KeyFile
	// are the client certificate (--etcd-cert-file, --etcd-key-file).
	CAFile, CertFile, KeyFile string
	// InsecureSkipVerify disables server verification (testing only).
	InsecureSkipVerify bool
	// Username and Password enable etcd auth (--etcd-username,
	// --etcd-password).
	Username, Password string
}

func (c *EtcdConfig) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultEtcdPrefix
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 3 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 3 * time.Second
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = 2 * time.Second
	}
}

func (c *EtcdConfig) tlsConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" && c.KeyFile == "" && !c.InsecureSkipVerify {
		return nil, nil
	}
	tc := &tls.Config{InsecureSkipVerify: c.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read etcd CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA file %q holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("etcd client TLS needs both a cert file and a key file")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cannot load etcd client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// NewEtcdClient returns an etcd client for cfg. It does not wait for etcd
// to be reachable.
func NewEtcdClient(cfg EtcdConfig) (*clientv3.Client, error) {
	cfg.setDefaults()
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("etcd: no endpoints")
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	eps := make([]string, 0, len(cfg.Endpoints))
	for _, ep := range cfg.Endpoints {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		if !strings.Contains(ep, "://") {
			if tc != nil {
				ep = "https://" + ep
			} else {
				ep = "http://" + ep
			}
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("etcd: no endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            eps,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  tc,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zap.NewNop(),
		RejectOldCluster:     false,
		DialOptions:          []grpc.DialOption{grpc.WithConnectParams(reconnectParams(cfg.DialTimeout))},
	})
	if err != nil {
		return nil, fmt.Errorf("cannot create etcd client for %v: %w", eps, err)
	}
	return cli, nil
}

// reconnectParams bounds how long the client waits between attempts to
// reconnect to an etcd that went away. gRPC's default backoff grows to
// 120 s: after an outage of a minute or more the client came back up to
// two minutes after etcd did, the watcher serving a stale list meanwhile
// and a worker's lease, renewed by etcd's restart for one TTL, expiring
// before its heartbeat reached etcd again (the worker left the fleet until
// it registered again). Attempts every 2 s at most notice etcd within a
// probe interval and well within a lease TTL.
func reconnectParams(dialTimeout time.Duration) grpc.ConnectParams {
	return grpc.ConnectParams{
		Backoff:           grpcbackoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
		MinConnectTimeout: dialTimeout,
	}
}

// EtcdWatcher lists and watches the worker prefix and keeps a Sink in step.
type EtcdWatcher struct {
	cfg   EtcdConfig
	cli   *clientv3.Client
	own   bool
	sink  Sink
	st    *backendStats
	h     *health
	known map[string]bool // ids in the sink; watcher goroutine only

	rev     atomic.Int64
	workers workerCount

	// relist asks the watch to end and relist, saying why (an outage
	// ended, etcd came back with fewer revisions).
	relist chan error
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// afterList, when set (tests), runs after each successful list.
	afterList func()
}

// NewEtcdWatcher returns a watcher over cli (or a new client when cli is
// nil) feeding sink. Start runs it.
func NewEtcdWatcher(cfg EtcdConfig, cli *clientv3.Client, sink Sink) (*EtcdWatcher, error) {
	cfg.setDefaults()
	own := false
	if cli == nil {
		var err error
		if cli, err = NewEtcdClient(cfg); err != nil {
			return nil, err
		}
		own = true
	}
	return &EtcdWatcher{
		cfg: cfg, cli: cli, own: own, sink: sink,
		st: statsFor(BackendEtcd), h: newHealth(),
		known:  map[string]bool{},
		relist: make(chan error, 1),
	}, nil
}

// Start runs the list/watch loop and the health probe in the background.
func (w *EtcdWatcher) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.wg.Add(2)
	go func() { defer w.wg.Done(); w.loop(ctx) }()
	go func() { defer w.wg.Done(); w.probe(ctx) }()
}

// WaitSynced waits for the first successful list.
func (w *EtcdWatcher) WaitSynced(ctx context.Context) error {
	return w.h.waitSynced(ctx, "etcd")
}

// Close stops the watcher (and closes the client if it made it).
func (w *EtcdWatcher) Close() {
	if w.cancel != nil {
		w.cancel()
	}
	w.wg.Wait()
	if w.own {
		w.cli.Close()
	}
}

// Health reports whether etcd is reachable; detail says what is served.
func (w *EtcdWatcher) Health() (ok bool, detail string) {
	ok, since, lastErr, synced := w.h.get()
	n, rev := &w.workers, w.rev.Load()
	switch {
	case ok:
		return true, fmt.Sprintf("etcd: watching %s (%s, revision %d)", w.cfg.Prefix, n, rev)
	case !synced:
		return false, fmt.Sprintf("etcd: never reached (%s); no workers known", lastErr)
	default:
		return false, fmt.Sprintf("etcd unreachable since %s (%s); serving last known list of %s (revision %d)",
			since.UTC().Format(time.RFC3339), lastErr, n, rev)
	}
}

func (w *EtcdWatcher) setHealth(ok bool, err error) {
	if ok {
		w.st.healthy.Store(1)
	} else {
		w.st.healthy.Store(0)
	}
	if w.h.set(ok, err) {
		if ok {
			slog.Info("etcd discovery: etcd reachable again")
			w.askRelist(errors.New("etcd recovered from an outage"))
		} else {
			slog.Warn("etcd discovery: etcd unreachable, serving last known workers", "workers", w.workers.routed.Load(), "err", err)
		}
	}
}

// askRelist makes the running watch end and relist (a no-op when a relist
// is already asked for).
func (w *EtcdWatcher) askRelist(reason error) {
	select {
	case w.relist <- reason:
	default:
	}
}

// probe notices outages (a watch just waits), recoveries, and an etcd
// whose revision went back (it came back empty: the resumed watch would
// wait for a revision the new store reaches only much later).
func (w *EtcdWatcher) probe(ctx context.Context) {
	t := time.NewTicker(w.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The revision seen before a linearizable read: the read's own
		// revision is at least that one unless etcd lost its data.
		seen := w.rev.Load()
		pctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
		resp, err := w.cli.Get(pctx, w.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.setHealth(err == nil, err)
		if err == nil && resp.Header.Revision < seen {
			slog.Warn("etcd discovery: etcd's revision went back (it lost its data?); relisting",
				"revision", resp.Header.Revision, "seen", seen)
			w.askRelist(fmt.Errorf("etcd revision %d is behind the %d seen", resp.Header.Revision, seen))
		}
	}
}

func (w *EtcdWatcher) loop(ctx context.Context) {
	var delay time.Duration
	for ctx.Err() == nil {
		rev, err := w.list(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.setHealth(false, err)
			delay = backoff(delay, 5*time.Second)
			sleep(ctx, delay)
			continue
		}
		w.setHealth(true, nil)
		if w.afterList != nil {
			w.afterList()
		}
		werr := w.watch(ctx, rev+1)
		if ctx.Err() != nil {
			return
		}
		w.st.relists.Inc()
		slog.Info("etcd discovery: relisting", "reason", werr)
		delay = 0
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (w *EtcdWatcher) list(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
	defer cancel()
	resp, err := w.cli.Get(lctx, w.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("cannot list %s: %w", w.cfg.Prefix, err)
	}
	recs := make([]fleet.Record, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if rec, ok := w.parse(kv.Key, kv.Value); ok {
			recs = append(recs, rec)
		}
	}
	clear(w.known)
	for _, r := range recs {
		w.known[r.ID] = true
	}
	for _, err := range w.sink.Sync(recs) {
		w.st.badRecord("sync", err)
		// Not in the fleet, as a refused watch event is not.
		if se := (*fleet.SkippedError)(nil); errors.As(err, &se) {
			delete(w.known, se.ID)
		}
	}
	w.setWorkers()
	w.rev.Store(resp.Header.Revision)
	return resp.Header.Revision, nil
}

func (w *EtcdWatcher) setWorkers() { w.workers.set(w.sink, w.known, w.st) }

func (w *EtcdWatcher) parse(key, val []byte) (fleet.Record, bool) {
	id := string(key[len(w.cfg.Prefix):])
	rec, err := fleet.ParseRecord(val)
	if err == nil && rec.ID != id {
		err = fmt.Errorf("record id %q does not match key id %q", rec.ID, id)
	}
	if err != nil {
		w.st.badRecord(string(key), err)
		return rec, false
	}
	return rec, true
}

// watch applies events from rev on; it returns when the watch must be
// re-established by relisting.
func (w *EtcdWatcher) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.cli.Watch(wctx, w.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithProgressNotify())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case reason := <-w.relist:
			// After an outage relist: cheap, and it covers anything the
			// resumed watch could have missed.
			return reason
		case wr, ok := <-wch:
			if !ok {
				return errors.New("watch channel closed")
			}
			if wr.CompactRevision != 0 {
				return fmt.Errorf("watch revision %d compacted (compact revision %d)", rev, wr.CompactRevision)
			}
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					return fmt.Errorf("watch compacted: %w", err)
				}
				return fmt.Errorf("watch failed: %w", err)
			}
			if wr.Canceled {
				return errors.New("watch canceled by server")
			}
			for _, ev := range wr.Events {
				w.apply(ev)
			}
			if wr.Header.Revision > 0 {
				w.rev.Store(wr.Header.Revision)
			}
			w.setWorkers()
		}
	}
}

func (w *EtcdWatcher) apply(ev *clientv3.Event) {
	key := ev.Kv.Key
	if len(key) <= len(w.cfg.Prefix) {
		return
	}
	id := string(key[len(w.cfg.Prefix):])
	switch ev.Type {
	case mvccpb.DELETE:
		if w.known[id] {
			delete(w.known, id)
			w.sink.Remove(id)
		}
	case mvccpb.PUT:
		rec, ok := w.parse(key, ev.Kv.Value)
		if ok {
			if err := w.sink.Upsert(rec); err != nil {
				w.st.badRecord(string(key), err)
				ok = false
			}
		}
		if ok {
			w.known[id] = true
		} else if w.known[id] {
			// A worker that now publishes garbage is not routable.
			delete(w.known, id)
			w.sink.Remove(id)
		}
	}
}
