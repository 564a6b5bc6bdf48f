package proxy

import (
	"context"
	"log/slog"
	"math"
	"unicode/utf8"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/sched"
)

// Debug lines (--log-level debug): one per inference request when it
// ends, and one per retry, for an operator following how requests are
// routed. They are separate from the access log, whose data they reuse.
// Server.debug is read once, before anything is built: with the level
// above debug the request path does no work for them and allocates
// nothing. Never a key, a header value or any prompt or answer text; a
// client's strings (the model, the method) are bounded (maxDebugString).

// maxDebugString bounds a client-supplied string in a debug line, as
// config's quotedKey bounds a key in an error.
const maxDebugString = 64

// debugString is b as a string of at most maxDebugString bytes, cut at a
// rune boundary and marked with "..." when cut.
func debugString(b []byte) string {
	if len(b) <= maxDebugString {
		return string(b)
	}
	cut := maxDebugString
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "..."
}

// answeredBy names what answered rs, as the access log does: an external
// upstream's label, the worker of the lease, or the worker last tried;
// "" when no worker was tried.
func (rs *reqState) answeredBy() string {
	if u := rs.ext.cur; u != nil {
		return u.label
	}
	if w := rs.lease.Worker; w != nil {
		return w.ID
	}
	if w := rs.acc.tried; w != nil {
		return w.ID
	}
	return ""
}

// noteMethod keeps the request's method for the debug line (answered,
// with debug on): releaseState has no request context.
func (a *accessEntry) noteMethod(m []byte) {
	a.nmethod = copy(a.method[:], m)
}

// logDebugRequest logs rs's debug line (releaseState, before the state is
// reset).
func (s *Server) logDebugRequest(rs *reqState, end string) {
	a := &rs.acc
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs,
		slog.String("request_id", string(rs.reqID)),
		slog.String("method", debugString(a.method[:a.nmethod])),
		slog.String("path", string(canonicalPath(a.kind))),
		slog.Int("status", a.status),
		slog.Duration("duration", rs.duration()))
	if m := rs.parsed.model; len(m) > 0 {
		attrs = append(attrs, slog.String("model", debugString(m)))
	}
	if by := rs.answeredBy(); by != "" {
		attrs = append(attrs, slog.String("worker", by))
	}
	if w := a.prefill; w != nil && rs.ext.cur == nil {
		attrs = append(attrs, slog.String("prefill_worker", w.ID))
	}
	if d := &rs.lease.Decision; d.Worker != nil && rs.ext.cur == nil {
		attrs = append(attrs, slog.String("layer", d.Layer.String()))
		if d.Reason != sched.ReasonNone {
			attrs = append(attrs, slog.String("reason", d.Reason.String()))
		}
		if d.Layer == sched.LayerKV || d.Layer == sched.LayerPrefix {
			attrs = append(attrs, slog.Float64("hit_ratio", math.Round(d.Ratio*100)/100))
		}
		if n := len(rs.sreq.BlockHashes); n > 0 && d.Layer == sched.LayerKV {
			// The share of the prompt's blocks the worker caches, in blocks.
			attrs = append(attrs, slog.Int("kv_overlap_blocks", int(math.Round(d.Ratio*float64(n)))), slog.Int("kv_prompt_blocks", n))
		}
		if d.Probe {
			attrs = append(attrs, slog.Bool("breaker_probe", true))
		}
	}
	attrs = append(attrs, slog.Int("retries", a.retries), slog.String("end", end))
	if a.ncode > 0 {
		attrs = append(attrs, slog.String("error", string(a.code[:a.ncode])))
	}
	slog.LogAttrs(context.Background(), slog.LevelDebug, "request", attrs...)
}

// logDebugRetry logs a retry: the worker whose attempt failed (failed), how
// it failed (f), and the next choice (next, a worker id or an upstream's
// label). leg names a PD leg ("" for a mixed request).
func logDebugRetry(rs *reqState, leg string, failed *fleet.Worker, f *failure, next string) {
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("request_id", string(rs.reqID)))
	if leg != "" {
		attrs = append(attrs, slog.String("leg", leg))
	}
	if failed != nil {
		attrs = append(attrs, slog.String("failed_worker", failed.ID))
	}
	if f != nil {
		attrs = append(attrs, slog.String("failure", f.class().code))
		if f.kind == failStatus && f.status != 0 {
			attrs = append(attrs, slog.Int("failed_status", f.status))
		}
	}
	attrs = append(attrs, slog.String("next", next), slog.Int("retry", rs.acc.retries))
	slog.LogAttrs(context.Background(), slog.LevelDebug, "request retried", attrs...)
}
