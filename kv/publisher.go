package kv

import (
	"fmt"
	"log/slog"
	"time"
)

// Which publisher a worker's events are taken from (events fed over NATS).
//
// A worker id names one NATS subject, infera.kv.events.<id>, and nothing
// stops two processes from publishing on it: two sidecars or two engines
// started with the same --id (a copied manifest, a fixed id in a
// Deployment of two replicas), or a rollout's old and new Pod overlapping.
// Their sequences interleave, and the sequence logic alone takes every
// switch between them for a restart or a gap: the worker's entries are
// cleared again and again and the index holds pieces of both caches. The
// relay stamps every frame with its instance id (broker.HdrInstance: its
// start time in milliseconds above random bits, so the larger id is the
// relay started later), and the manager follows one instance per worker:
//
//   - the first instance heard is followed;
//   - a newer instance is followed at once (a restarted sidecar, a
//     rollout's new Pod), unless the worker changed publisher less than
//     PublisherTakeover ago;
//   - an older instance is followed only once the followed one has been
//     silent for PublisherTakeover (it died, the older one lives on);
//   - any other frame is dropped and counted, and the worker's duplicate
//     gauge and a rate-limited warning say so.
//
// So of two live publishers the newer is followed, whatever order their
// frames arrive in and whenever the router starts, and a worker changes
// publisher at most once per PublisherTakeover however many share its id.
// Each change clears the worker's entries on every rank and restarts their
// sequences: the index then holds one engine's cache, rebuilt from its
// events. Frames without an instance id (a relay older than the header)
// count as instance 0, older than any other: one such publisher works as
// before; two of them cannot be told apart.

// duplicateWindow is how long the duplicate gauge stays up after the last
// frame dropped from another publisher.
const duplicateWindow = time.Minute

// publisherState is the worker goroutine's view of who publishes for it.
type publisherState struct {
	known  bool   // an instance is followed
	id     uint64 // the instance followed
	frames uint64 // frames taken from id
	// changedAt is when the worker last changed publisher (zero: never).
	changedAt time.Time
	// The followed instance's silence is measured only when another one
	// speaks: it has sent nothing since quietSince if frames is still
	// quietFrames.
	quietSince  time.Time
	quietFrames uint64
}

// follow reports whether a frame from publisher instance inst is to be
// handled. Only the worker's goroutine calls it. A frame from the followed
// instance costs a compare and an increment.
func (ws *workerState) follow(inst uint64) bool {
	p := &ws.pub
	if inst == p.id && p.known {
		p.frames++
		return true
	}
	return ws.followOther(inst)
}

// followOther decides on a frame from an instance other than the followed
// one (or the first frame of all).
func (ws *workerState) followOther(inst uint64) bool {
	p := &ws.pub
	now := time.Now()
	if !p.known { // the first follow is no change: changedAt stays zero
		p.known, p.id, p.frames = true, inst, 1
		p.quietSince, p.quietFrames = now, 1
		return true
	}
	if p.frames != p.quietFrames {
		p.quietSince, p.quietFrames = now, p.frames
	}
	takeover := ws.m.cfg.PublisherTakeover
	newer := inst > p.id && now.Sub(p.changedAt) >= takeover
	if newer || now.Sub(p.quietSince) >= takeover {
		ws.changePublisher(inst, now, !newer)
		return true
	}
	ws.lastDuplicate.Store(now.UnixNano())
	ws.mDuplicate.Inc()
	ws.warnDuplicate(now, inst)
	return false
}

// changePublisher follows inst from now on (a newer instance, or one
// taking over from a silent one): every rank's entries go and its sequence
// starts again with inst's next batch.
func (ws *workerState) changePublisher(inst uint64, now time.Time, silent bool) {
	p := &ws.pub
	old := p.id
	p.id, p.frames, p.changedAt = inst, 1, now
	p.quietSince, p.quietFrames = now, 1
	ws.mChanges.Inc()
	if silent {
		slog.Warn("KV event publisher silent, following an older publisher of this worker id and resyncing",
			"worker", ws.w.ID, "from", formatInstance(old), "to", formatInstance(inst), "silent_for", ws.m.cfg.PublisherTakeover)
	} else {
		slog.Info("KV event publisher changed to a newer one (restart or rollout), resyncing",
			"worker", ws.w.ID, "from", formatInstance(old), "to", formatInstance(inst))
	}
	for rank, rs := range ws.ranks {
		ws.resync(rank, rs)
		rs.started = false
	}
}

// warnDuplicate logs a frame dropped from another publisher, at most once
// per 10 s per worker (a clock of its own: gap and decode warnings must
// not hide it).
func (ws *workerState) warnDuplicate(now time.Time, inst uint64) {
	last := ws.lastDupLog.Load()
	if now.UnixNano()-last < int64(10*time.Second) || !ws.lastDupLog.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	slog.Warn("two KV event publishers share one worker id (two sidecars or engines started with the same --id?): "+
		"following one, dropping the other's events",
		"worker", ws.w.ID, "following", formatInstance(ws.pub.id), "dropping", formatInstance(inst),
		"dropped_total", ws.mDuplicate.Get())
}

// duplicatePublisher is the worker's duplicate gauge: 1 while another
// publisher's frame was dropped within duplicateWindow.
func (ws *workerState) duplicatePublisher() float64 {
	if last := ws.lastDuplicate.Load(); last != 0 && time.Since(time.Unix(0, last)) < duplicateWindow {
		return 1
	}
	return 0
}

// formatInstance renders an instance id as the relay's header and log do
// (broker.FormatInstance; kv does not import broker). 0 is "none".
func formatInstance(id uint64) string {
	if id == 0 {
		return "none"
	}
	return fmt.Sprintf("%016x", id)
}
