package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// External upstreams: a split proxy's external APIs and the member gateways
// of global scheduling. Each is a worker outside the fleet
// (fleet.NewStandalone) with its own breaker, load counters and one of our
// HTTP/1.1 connection pools (upstream.go, TLS included), so an attempt on it
// is a lease like any other, sent by httpTransport and relayed by the relay:
// timeouts, breaker, failure classification, metrics and streaming are the
// local path's. Only the request differs: its path is the upstream's base
// path plus the endpoint's, its Host the upstream's, and its headers a fixed
// list with the upstream's key (upstream.AppendHeaders).

// extKind says what an external upstream is.
type extKind uint8

const (
	extSplit  extKind = iota // a split proxy entry
	extMember                // a global scheduling member gateway
)

// scrubKey replaces u's own key, where an answer of u (an error: an
// "incorrect API key" message) echoes it, with "***": the gateway's key at
// an external upstream is never the client's to see. The echo may be
// JSON-escaped in part (Go's encoder writes & < > as \u0026..., .NET's +
// as \u002B, PHP's / as \/): each character of the key matches itself or
// any of its JSON escapes. b is returned when it holds no key (or u is nil,
// a local worker).
func scrubKey(b []byte, u *extUpstream) []byte {
	if u == nil {
		return b
	}
	k := u.key.Reveal()
	if len(k) < 4 || !bytes.Contains(b, []byte(k)) && bytes.IndexByte(b, '\\') < 0 {
		return b
	}
	var out []byte
	last := 0
	for i := 0; i < len(b); i++ {
		if b[i] != k[0] && b[i] != '\\' {
			continue
		}
		end, ok := matchEscaped(b, i, k)
		if !ok {
			continue
		}
		out = append(append(out, b[last:i]...), config.RedactedSecret...)
		last, i = end, end-1
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

// matchEscaped reports whether b holds k at i, each of k's characters
// written as itself or as a JSON escape of it, and where the match ends.
func matchEscaped(b []byte, i int, k string) (int, bool) {
	for len(k) > 0 {
		r, size := utf8.DecodeRuneInString(k)
		if i < len(b) && b[i] == k[0] {
			i, k = i+1, k[1:] // a byte of a character written as itself
			continue
		}
		if i+1 >= len(b) || b[i] != '\\' {
			return 0, false
		}
		switch e := b[i+1]; {
		case e == '/' || e == '\\' || e == '"':
			if r != rune(e) {
				return 0, false
			}
			i += 2
		case e == 'u':
			v, n := jsonEscapedRune(b[i:])
			if n == 0 || v != r {
				return 0, false
			}
			i += n
		default:
			return 0, false
		}
		k = k[size:]
	}
	return i, true
}

// jsonEscapedRune decodes the \uXXXX escape (or surrogate pair) at the
// start of b, and its length; 0 when there is none.
func jsonEscapedRune(b []byte) (rune, int) {
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(b[2:6]), 16, 16)
		return rune(v), err == nil
	}
	r, ok := hex4(b)
	if !ok {
		return 0, 0
	}
	if utf16.IsSurrogate(r) {
		lo, ok := hex4(b[6:])
		if !ok {
			return 0, 0
		}
		return utf16.DecodeRune(r, lo), 12
	}
	return r, 6
}

// dropKeyHeaders removes from h the headers whose value holds u's key (an
// upstream that echoes the gateway's credentials in a header).
func dropKeyHeaders(h *fasthttp.ResponseHeader, u *extUpstream) {
	k := u.key.Reveal()
	if len(k) < 4 {
		return
	}
	var drop [][]byte
	for name, v := range h.All() {
		if bytes.Contains(v, []byte(k)) {
			drop = append(drop, append([]byte(nil), name...))
		}
	}
	for _, name := range drop {
		h.DelBytes(name)
	}
}

// extUpstream is one external upstream. Immutable once published; a config
// change to its address or key makes a new one.
type extUpstream struct {
	kind  extKind
	name  string // the entry's or member's name
	label string // "split:<name>" or "global:<name>": worker ID, logs, X-Infera-Upstream
	raw   string // the configured address, to notice changes
	ep    upstreams.Endpoint
	key   config.Secret
	w     *fleet.Worker
	pool  *httpPool
	// out keeps a split entry out of the plans after a first-byte timeout
	// (split_proxy.timeout_backoff_ms: split.go, splitOutcome); members
	// have theirs in the poller (upstream.Member).
	out upstreams.Backoff
	// series names registered for this upstream (unregistered when it goes)
	series []string
}

// extTable is the external upstreams of one config snapshot's section,
// aligned with its list (nil for the split proxy's local entry).
type extTable struct {
	src any // *config.SplitProxy or *config.GlobalScheduling it was built from
	ups []*extUpstream
	// base is, for the table of a snapshot a reload replaced (staleTable),
	// the published table its upstreams were taken from; nil otherwise.
	base *extTable
}

// externals keeps the external upstreams across reloads: an entry whose
// name, address and key stay the same keeps its connections and breaker.
type externals struct {
	bc             fleet.BreakerConfig
	maxConns       int
	connectTimeout time.Duration
	set            *metrics.Set

	// latest returns the config snapshot serving new requests (the
	// store's); nil in tests that build externals alone.
	latest func() *config.Config

	mu                  sync.Mutex // serializes rebuilds
	split               atomic.Pointer[extTable]
	members             atomic.Pointer[extTable]
	splitSec, memberSec extSection
	closed              bool
}

func newExternals(f *config.Serve) *externals {
	e := &externals{
		bc: fleet.BreakerConfig{Threshold: f.BreakerFailureThreshold, Cooldown: f.BreakerCooldown(),
			MaxCooldown: f.BreakerMaxCooldown()},
		maxConns:       f.MaxConnsPerWorker,
		connectTimeout: f.ConnectTimeout,
		set:            metrics.NewSet(),
	}
	if e.connectTimeout <= 0 {
		e.connectTimeout = 3 * time.Second
	}
	e.split.Store(&extTable{})
	e.members.Store(&extTable{})
	e.splitSec = extSection{kind: extSplit, pub: &e.split, specs: splitSpecs,
		of: func(c *config.Config) any { return &c.SplitProxy }}
	e.memberSec = extSection{kind: extMember, pub: &e.members, specs: memberSpecs,
		of: func(c *config.Config) any { return &c.GlobalScheduling }}
	metrics.RegisterSet(e.set)
	return e
}

// splitTable returns the external upstreams of sp (the request's snapshot),
// building them when the snapshot changed.
func (e *externals) splitTable(sp *config.SplitProxy) *extTable {
	if t := e.split.Load(); t.src == sp {
		return t
	}
	return e.table(&e.splitSec, sp)
}

// memberTable returns the member gateways of g (the request's snapshot),
// building them when the snapshot changed.
func (e *externals) memberTable(g *config.GlobalScheduling) *extTable {
	if t := e.members.Load(); t.src == g {
		return t
	}
	return e.table(&e.memberSec, g)
}

// extSection is what table needs to know of a config section with
// external upstreams.
type extSection struct {
	kind  extKind
	pub   *atomic.Pointer[extTable] // the published table
	stale atomic.Pointer[extTable]  // the last staleTable
	// of returns the section of a snapshot; specs the upstreams a section
	// wants, aligned with its list.
	of    func(*config.Config) any
	specs func(any) []extSpec
}

// splitSpecs and memberSpecs want no upstream of a disabled section.
func splitSpecs(src any) []extSpec {
	sp := src.(*config.SplitProxy)
	want := make([]extSpec, len(sp.Proxies))
	if !sp.Enabled {
		return want
	}
	for i := range sp.Proxies {
		if p := &sp.Proxies[i]; !p.Local {
			want[i] = extSpec{name: p.Label(), raw: p.Address, key: p.APIKey}
		}
	}
	return want
}

func memberSpecs(src any) []extSpec {
	g := src.(*config.GlobalScheduling)
	want := make([]extSpec, len(g.Members))
	if !g.Enabled {
		return want
	}
	for i := range g.Members {
		m := &g.Members[i]
		want[i] = extSpec{name: m.Name, raw: m.URL, key: m.APIKey}
	}
	return want
}

// table returns the table of src, a section of a config snapshot, when
// the published table is another snapshot's. When src is the current
// snapshot's section, its table is built and published, and the upstreams
// it no longer has are retired. When a reload has already replaced src's
// snapshot (a request that loaded it before the reload reaches its
// dispatch after requests of the new one, e.g. while the classifier
// answers), the request gets a staleTable, which publishes and retires
// nothing: a late request never undoes a reload (the new upstreams
// retired, their breakers and counters started afresh, their connections
// closed, and again on the next request of the new snapshot).
func (e *externals) table(sec *extSection, src any) *extTable {
	if t := sec.stale.Load(); t != nil && t.src == src && t.base == sec.pub.Load() {
		return t
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := sec.pub.Load(); t.src == src {
		return t
	}
	if e.latest != nil {
		if cur := sec.of(e.latest()); cur != src {
			base := sec.pub.Load()
			if base.src != cur {
				base = e.publish(sec, cur) // no request of the current snapshot came yet
			}
			t := staleTable(src, base, sec.specs(src))
			sec.stale.Store(t)
			return t
		}
	}
	return e.publish(sec, src)
}

// sync publishes the tables of cur, the snapshot a reload has just swapped
// in: the upstreams a section no longer has (all of them when it was
// disabled) are retired now, their connections closed and their series
// gone, rather than at the section's next request, which may never come.
func (e *externals) sync(cur *config.Config) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	for _, sec := range []*extSection{&e.splitSec, &e.memberSec} {
		if src := sec.of(cur); sec.pub.Load().src != src {
			e.publish(sec, src)
		}
	}
}

// publish builds and publishes the table of src. Lock must be held.
func (e *externals) publish(sec *extSection, src any) *extTable {
	t := &extTable{src: src, ups: e.rebuild(sec.kind, sec.pub.Load().ups, sec.specs(src))}
	sec.pub.Store(t)
	return t
}

// staleTable is the table of a replaced snapshot's section src: each entry
// is the upstream of base (the current snapshot's table) with the same
// name, address and key, else the one with the same name (the entry's
// address or key changed: the request goes where the operator now sends
// the entry, with its current key, as an old key may be revoked), else nil
// (the entry is gone: it is skipped).
func staleTable(src any, base *extTable, want []extSpec) *extTable {
	t := &extTable{src: src, base: base, ups: make([]*extUpstream, len(want))}
	for i, w := range want {
		if w.raw == "" {
			continue
		}
		for _, u := range base.ups {
			if u != nil && u.name == w.name && u.raw == w.raw && u.key == w.key {
				t.ups[i] = u
				break
			}
		}
		if t.ups[i] != nil {
			continue
		}
		for _, u := range base.ups {
			if u != nil && u.name == w.name {
				t.ups[i] = u
				break
			}
		}
	}
	return t
}

// member returns the upstream of the member named name, or nil.
func (t *extTable) member(name string) *extUpstream {
	for _, u := range t.ups {
		if u != nil && u.name == name {
			return u
		}
	}
	return nil
}

type extSpec struct {
	name, raw string // raw "" for the local entry
	key       config.Secret
}

// rebuild returns the upstreams for want, reusing old ones whose name,
// address and key are unchanged. Old ones not reused are retired: their
// idle connections close now, their busy ones when their response ends,
// and their series disappear. An address that cannot be parsed (config
// validation refuses those) leaves a nil entry, which is never tried.
// Lock must be held.
func (e *externals) rebuild(kind extKind, old []*extUpstream, want []extSpec) []*extUpstream {
	out := make([]*extUpstream, len(want))
	kept := make(map[*extUpstream]bool, len(old))
	for i, w := range want {
		if w.raw == "" {
			continue
		}
		for _, o := range old {
			if o != nil && !kept[o] && o.name == w.name && o.raw == w.raw && o.key == w.key {
				out[i] = o
				kept[o] = true
				break
			}
		}
	}
	for _, o := range old {
		if o != nil && !kept[o] {
			e.retire(o)
		}
	}
	if e.closed {
		return make([]*extUpstream, len(want))
	}
	for i, w := range want {
		if w.raw == "" || out[i] != nil {
			continue
		}
		u, err := e.newUpstream(kind, w)
		if err != nil {
			upstreamLog.Warn("external upstream not usable", "name", w.name, "err", err.Error())
			continue
		}
		out[i] = u
	}
	return out
}

func (e *externals) newUpstream(kind extKind, w extSpec) (*extUpstream, error) {
	ep, err := upstreams.ParseEndpoint(w.raw)
	if err != nil {
		return nil, err
	}
	u := &extUpstream{kind: kind, name: w.name, raw: w.raw, ep: ep, key: w.key}
	var requests, failures *metrics.Counter
	var lbl string
	switch kind {
	case extSplit:
		u.label = "split:" + w.name
		lbl = fmt.Sprintf(`{proxy=%q}`, w.name)
		requests = e.counter(u, `infera_split_proxy_requests_total`+lbl)
		failures = e.counter(u, `infera_split_proxy_failures_total`+lbl)
	default:
		// Forwarded requests are counted by the poller
		// (infera_global_forwarded_total{member}).
		u.label = "global:" + w.name
		lbl = fmt.Sprintf(`{member=%q}`, w.name)
		failures = e.counter(u, `infera_global_forward_failures_total`+lbl)
	}
	u.w = fleet.NewStandalone(u.label, &e.bc, requests, failures)
	u.w.URL, u.w.Addr, u.w.TLS = w.raw, ep.Addr, ep.TLS
	u.pool = newExtPool(&ep, e.maxConns, e.connectTimeout)
	u.w.Client = u.pool
	// The gauges read u from a scrape as soon as they exist: only a whole
	// u is published (registered before u.w was set, a scrape during a
	// reload that added an entry read a nil worker, a panic that ended the
	// router: TestScrapesDuringReloadsThatAddSplitEntriesSeeWholeEntries).
	switch kind {
	case extSplit:
		e.gauge(u, `infera_split_proxy_breaker_state`+lbl, func() float64 { return float64(u.w.Breaker.State()) })
		e.gauge(u, `infera_split_proxy_active_requests`+lbl, func() float64 { return float64(u.w.Load.Requests.Load()) })
		e.gauge(u, `infera_split_proxy_backoff_state`+lbl, func() float64 { return float64(u.out.State()) })
	default:
		e.gauge(u, `infera_global_member_breaker_state`+lbl, func() float64 { return float64(u.w.Breaker.State()) })
		e.gauge(u, `infera_global_forward_active_requests`+lbl, func() float64 { return float64(u.w.Load.Requests.Load()) })
	}
	return u, nil
}

func (e *externals) counter(u *extUpstream, name string) *metrics.Counter {
	u.series = append(u.series, name)
	return e.set.GetOrCreateCounter(name)
}

func (e *externals) gauge(u *extUpstream, name string, f func() float64) {
	u.series = append(u.series, name)
	e.set.GetOrCreateGauge(name, f)
}

// retire stops using u: idle connections close now, busy ones when their
// response ends. Lock must be held.
func (e *externals) retire(u *extUpstream) {
	u.pool.closeIdle(true)
	for _, name := range u.series {
		e.set.UnregisterMetric(name)
	}
}

// close retires every upstream and unregisters the metrics.
func (e *externals) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.closed = true
	for _, p := range []*atomic.Pointer[extTable]{&e.split, &e.members} {
		for _, u := range p.Load().ups {
			if u != nil {
				e.retire(u)
			}
		}
		p.Store(&extTable{})
	}
	metrics.UnregisterSet(e.set, true)
}

// newExtPool returns the connection pool of an external upstream: our
// HTTP/1.1 client (the relay's reader, pooled connections checked for
// unsolicited bytes, per-read deadlines, aborts), with the upstream's Host
// and TLS server name.
func newExtPool(ep *upstreams.Endpoint, maxConns int, connectTimeout time.Duration) *httpPool {
	p := &httpPool{addr: ep.Addr, host: ep.Host, maxConns: maxConns, reapEvery: upReapEvery}
	p.dialer = net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	if ep.TLS {
		p.tlsCfg = newTLSConfig(hostOnly(ep.Addr))
	}
	return p
}

// extRootCAs verifies external upstreams' certificates; nil means the
// system's roots (tests set their own CA).
var extRootCAs *x509.CertPool

func newTLSConfig(serverName string) *tls.Config {
	return &tls.Config{ServerName: serverName, RootCAs: extRootCAs, MinVersion: tls.VersionTLS12}
}

// extState is what the features beyond the local fleet keep per request
// (split.go, global.go, smart.go); part of the pooled reqState.
type extState struct {
	// cur is the external upstream of the attempt in flight; nil while a
	// local worker is tried.
	cur *extUpstream
	// plan is the split proxy's entries to try (indexes into the list).
	plan []int
	// path and hdr are the request path and header block of the external
	// attempt (rs.path and rs.hdr serve local workers).
	path, hdr []byte
	// tier is smart model selection's tier (0: not applied); model the
	// tier's model the request is forwarded as; modelBuf backs
	// sched.Request.Model once rewritten. tierHeader: the answer, whatever
	// it is, carries X-Infera-Tier (debug.decision_header; answered).
	// tierSource: where the tier came from (the access log's tier_source).
	tier       classify.Tier
	tierSource classify.Source
	tierHeader bool
	model      string
	modelBuf   []byte
}

func (e *extState) reset() {
	plan, path, hdr, modelBuf := e.plan[:0], e.path[:0], e.hdr[:0], e.modelBuf[:0]
	*e = extState{} // in place (a literal naming the buffers is copied over e)
	e.plan, e.path, e.hdr, e.modelBuf = plan, path, hdr, modelBuf
}

// forwardBody is the body of the attempt in flight: the client's, with the
// model replaced by the one the chosen worker serves (model routing) or by
// smart model selection's.
func (rs *reqState) forwardBody() []byte {
	d := &rs.lease.Decision
	switch {
	case rs.ext.cur == nil && d.Rewrite:
		return rs.rewriteModel(rs.body, d.Model)
	case rs.ext.model != "":
		return rs.rewriteModel(rs.body, rs.ext.model)
	}
	return rs.body
}
