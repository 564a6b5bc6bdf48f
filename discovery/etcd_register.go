package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/infera/infera/fleet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdRegistrar keeps one worker's record under <prefix><id> with a lease
// kept alive by heartbeats. If the lease is lost (etcd outage longer than
// the TTL, or revoked) it grants a new one and puts the record again.
type EtcdRegistrar struct {
	cli     *clientv3.Client
	prefix  string
	ttl     time.Duration
	timeout time.Duration

	mu     sync.Mutex
	rec    fleet.Record
	key    string
	lease  clientv3.LeaseID
	cancel context.CancelFunc
	done   chan struct{}
	// leaseEpoch counts (re)grants, for tests and logs.
	leaseEpoch int
}

// NewEtcdRegistrar returns a registrar writing under prefix (default
// DefaultEtcdPrefix) with lease ttl (at least 2s).
func NewEtcdRegistrar(cli *clientv3.Client, prefix string, ttl time.Duration) *EtcdRegistrar {
	c := EtcdConfig{Prefix: prefix}
	c.setDefaults()
	if ttl < 2*time.Second {
		ttl = 2 * time.Second
	}
	return &EtcdRegistrar{cli: cli, prefix: c.Prefix, ttl: ttl, timeout: c.RequestTimeout}
}

// Register grants a lease, puts rec and starts the heartbeat. It fails if
// etcd cannot be reached within the request timeout.
func (r *EtcdRegistrar) Register(ctx context.Context, rec fleet.Record) error {
	if err := rec.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return fmt.Errorf("worker %q already registered", rec.ID)
	}
	r.rec, r.key = rec, r.prefix+rec.ID
	if err := r.grantAndPutLocked(ctx); err != nil {
		return err
	}
	kctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go r.keepAlive(kctx, r.lease, r.done)
	return nil
}

func (r *EtcdRegistrar) grantAndPutLocked(ctx context.Context) error {
	val, err := json.Marshal(r.rec)
	if err != nil {
		return fmt.Errorf("cannot encode worker record: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	lg, err := r.cli.Grant(tctx, int64((r.ttl+time.Second-1)/time.Second))
	if err != nil {
		return fmt.Errorf("cannot grant etcd lease: %w", err)
	}
	if _, err := r.cli.Put(tctx, r.key, string(val), clientv3.WithLease(lg.ID)); err != nil {
		return fmt.Errorf("cannot put %s: %w", r.key, err)
	}
	r.lease = lg.ID
	r.leaseEpoch++
	return nil
}

// keepAlive heartbeats lease; when the keepalive channel closes (lease lost)
// it re-grants and re-puts until ctx ends.
func (r *EtcdRegistrar) keepAlive(ctx context.Context, lease clientv3.LeaseID, done chan struct{}) {
	defer close(done)
	var delay time.Duration
	for ctx.Err() == nil {
		ch, err := r.cli.KeepAlive(ctx, lease)
		if err == nil {
			for range ch {
				delay = 0
			}
		}
		if ctx.Err() != nil || r.cli.Ctx().Err() != nil {
			return // stopped, or the client was closed
		}
		slog.Warn("etcd registrar: lease lost, registering again", "key", r.key, "err", err)
		for ctx.Err() == nil && r.cli.Ctx().Err() == nil {
			r.mu.Lock()
			err = r.grantAndPutLocked(ctx)
			lease = r.lease
			r.mu.Unlock()
			if err == nil {
				slog.Info("etcd registrar: registered again", "key", r.key)
				break
			}
			delay = backoff(delay, 5*time.Second)
			sleep(ctx, delay)
		}
	}
}

// Update re-puts rec (e.g. Status DRAINING) under the current lease, unless
// the record is no longer this registration's (ownsKey).
func (r *EtcdRegistrar) Update(ctx context.Context, rec fleet.Record) error {
	if err := rec.Validate(); err != nil {
		return err
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("cannot encode worker record: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel == nil {
		return fmt.Errorf("worker %q not registered", rec.ID)
	}
	if rec.ID != r.rec.ID {
		return fmt.Errorf("worker id changed from %q to %q", r.rec.ID, rec.ID)
	}
	r.rec = rec
	tctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.cli.Txn(tctx).If(r.ownsKey()).Then(clientv3.OpPut(r.key, string(val), clientv3.WithLease(r.lease))).Commit()
	if err != nil {
		return fmt.Errorf("cannot put %s: %w", r.key, err)
	}
	if !resp.Succeeded {
		slog.Warn("etcd registrar: the record is no longer this registration's (another sidecar registered this id since); left as it is", "key", r.key)
	}
	return nil
}

// ownsKey compares r.key's lease with this registration's: a sidecar that
// registered the same id since (a rollout's new Pod with a fixed --id)
// put the record under its own lease, and it is not this one's to change
// or delete. Lock must be held.
func (r *EtcdRegistrar) ownsKey() clientv3.Cmp {
	return clientv3.Compare(clientv3.LeaseValue(r.key), "=", r.lease)
}

// Deregister stops the heartbeat, deletes the record (unless it is no
// longer this registration's: ownsKey) and revokes the lease.
func (r *EtcdRegistrar) Deregister(ctx context.Context) error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel = nil
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	tctx, c := context.WithTimeout(ctx, r.timeout)
	defer c()
	_, err := r.cli.Txn(tctx).If(r.ownsKey()).Then(clientv3.OpDelete(r.key)).Commit()
	if _, rerr := r.cli.Revoke(tctx, r.lease); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("cannot deregister %s: %w", r.key, err)
	}
	return nil
}

// Record returns the record last written.
func (r *EtcdRegistrar) Record() fleet.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}
