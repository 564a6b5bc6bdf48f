package classify

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/breaker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// Outcome is how a classification went.
type Outcome uint8

// Outcomes; everything but OutcomeOK used the fallback tier.
const (
	OutcomeOK          Outcome = iota // the classifier answered a tier
	OutcomeTimeout                    // no answer within timeout_ms
	OutcomeError                      // the classifier could not be reached, or the connection failed
	OutcomeBadStatus                  // it answered a status other than 200
	OutcomeBadAnswer                  // it answered 200 with something else than a tier
	OutcomeBreakerOpen                // not asked: its breaker is open (breaker.go)
	numOutcomes
)

// numCalls is the number of outcomes of a call (infera_classifier_requests_total);
// OutcomeBreakerOpen is none.
const numCalls = OutcomeBreakerOpen

var outcomeNames = [numOutcomes]string{"ok", "timeout", "error", "bad_status", "bad_answer", "breaker_open"}

// String returns the outcome's metric label.
func (o Outcome) String() string {
	if o >= numOutcomes {
		return "unknown"
	}
	return outcomeNames[o]
}

// Source is where a request's tier came from: the source label of
// infera_smart_selection_total.
type Source uint8

// Sources.
const (
	SourceClassifier       Source = iota // the classifier answered it
	SourceFallback                       // fallback_tier: the classifier failed
	SourcePreviousResponse               // the engine holding the request's previous response serves its model (Kept)
	numSources
)

var sourceNames = [numSources]string{"classifier", "fallback", "previous_response"}

// String returns the source's metric label.
func (s Source) String() string {
	if s >= numSources {
		return "unknown"
	}
	return sourceNames[s]
}

// Result is a classification: the tier to use and its model.
type Result struct {
	// Tier is the classifier's tier, or the fallback tier.
	Tier Tier
	// Model is the model configured for Tier: the request's new model.
	Model string
	// Outcome says whether the classifier answered (OutcomeOK) or why the
	// fallback tier was used.
	Outcome Outcome
	// Source says where Tier came from.
	Source Source
	// Latency is the time spent classifying.
	Latency time.Duration
}

// Fallback reports whether the fallback tier was used.
func (r Result) Fallback() bool { return r.Source == SourceFallback }

// Metrics, resolved once.
var (
	mRequests [numCalls]*metrics.Counter
	// mSkipped counts the requests that took the fallback tier without
	// asking (the breaker open); mTrips the breaker's openings, a failed
	// probe's included.
	mSkipped = metrics.NewCounter(`infera_classifier_breaker_skipped_total`)
	mTrips   = metrics.NewCounter(`infera_classifier_breaker_trips_total`)
	// mTiers[tier][source] counts the tiers chosen, by their Source.
	mTiers   [numTiers][numSources]*metrics.Counter
	mLatency = metrics.NewHistogram(`infera_classifier_duration_seconds`)
)

func init() {
	for o := Outcome(0); o < numCalls; o++ {
		mRequests[o] = metrics.NewCounter(fmt.Sprintf(`infera_classifier_requests_total{result=%q}`, o))
	}
	for t := TierL1; t < numTiers; t++ {
		for src := Source(0); src < numSources; src++ {
			mTiers[t][src] = metrics.NewCounter(fmt.Sprintf(`infera_smart_selection_total{tier=%q,source=%q}`, t, src))
		}
	}
}

var (
	logThrottle = logx.Throttle{Every: 10 * time.Second}
	// tripLog is the breaker's own: a classifier failing every call must
	// not hide its openings.
	tripLog = logx.Throttle{Every: time.Second}
)

// Applies reports whether smart model selection applies to a request for
// model: the section is enabled and model matches one of match_models
// (all models when the list is empty). A name longer than any gateway
// serves (upstream.MaxModelBytes) is not classified: the classifier got
// the whole name, up to the body's size. It does not allocate.
func Applies(cfg *config.SmartModelSelection, model []byte) bool {
	if !cfg.Enabled || len(model) > upstream.MaxModelBytes {
		return false
	}
	if len(cfg.MatchModels) == 0 {
		return true
	}
	for _, p := range cfg.MatchModels {
		if upstream.MatchGlob(p, model) {
			return true
		}
	}
	return false
}

// Client calls the classifier named by the config snapshot it is given.
// It keeps one keep-alive connection pool for the current classifier URL
// and replaces it when a reload changes the URL. Safe for concurrent use;
// the zero value is ready. Close releases idle connections and removes
// the client's series from /metrics.
type Client struct {
	// Current, when set, returns the smart_model_selection section in
	// force: /metrics then shows the breaker of its classifier, as /health
	// does (Breaker), and nothing while the section is disabled. Unset,
	// /metrics shows the breaker of the classifier last added. Set it
	// before the first call.
	Current func() *config.SmartModelSelection

	mu  sync.Mutex // serializes target changes
	cur atomic.Pointer[targets]
	// ms holds the client's series (infera_classifier_breaker_state
	// {classifier}, writeMetrics), made with the first target; nil before.
	// Lock mu to read or set it.
	ms *metrics.Set
}

// targets are the pools of the last two classifier URLs used: requests of
// the snapshot a reload replaced (one that waited in a user's admission
// queue, say) keep their pool instead of replacing the new one in turn,
// which closed the other's connections at every alternation. A third URL
// replaces the older one (its idle connections are closed).
type targets struct {
	cur, prev *target
}

func (ts *targets) find(rawURL string) *target {
	switch {
	case ts == nil:
		return nil
	case ts.cur.url == rawURL:
		return ts.cur
	case ts.prev != nil && ts.prev.url == rawURL:
		return ts.prev
	}
	return nil
}

type target struct {
	url string
	// label is the infera_classifier_breaker_state label of the
	// classifier (breakerLabel).
	label string
	hc    *fasthttp.HostClient
	br    breaker.Breaker
	host  string
	// uri is the whole URL: a path alone leaves the request's scheme
	// http, and a TLS HostClient refuses such a request without sending it
	// (ErrHostClientRedirectToDifferentScheme).
	uri string
}

var scratchPool = sync.Pool{New: func() any { return new([]byte) }}

// Classify asks the classifier for the tier of a request for model with
// prompt text (see the package documentation for the contract) and
// returns the tier and its model, using cfg.FallbackTier when the
// classifier fails, times out (cfg.TimeoutMS) or answers something else
// than a tier. It never returns an error: smart model selection never fails
// a request. Call it only when Applies.
//
// The classifier of each URL has a breaker (breaker.go): while it is open
// the classifier is not asked, and the fallback tier is returned at once
// (OutcomeBreakerOpen).
//
// Metrics: infera_classifier_requests_total{result},
// infera_classifier_duration_seconds, infera_smart_selection_total{tier,source},
// infera_classifier_breaker_state{classifier} (Client.Current),
// infera_classifier_breaker_trips_total,
// infera_classifier_breaker_skipped_total.
func (c *Client) Classify(cfg *config.SmartModelSelection, model, text []byte) Result {
	start := time.Now()
	tier, out, status := TierUnknown, OutcomeError, 0
	if t, err := c.target(cfg.ClassifierURL); err == nil {
		bs := breakerSettings(cfg)
		ok, probe, _ := t.br.Admit(bs, start.UnixNano())
		if ok {
			tier, out, status = c.call(t, cfg, model, text, start)
			if record(&t.br, bs, time.Now().UnixNano(), out == OutcomeOK, probe) {
				mTrips.Inc()
				tripLog.Warn("smart model selection: classifier breaker open, requests take the fallback tier without asking it",
					"outcome", out.String(), "probe", probe, "cooldown", t.br.Cooldown(bs))
			}
		} else {
			out = OutcomeBreakerOpen
		}
	}
	lat := time.Since(start)
	if out == OutcomeBreakerOpen {
		mSkipped.Inc()
	} else {
		mLatency.Update(lat.Seconds())
		mRequests[out].Inc()
	}
	src := SourceClassifier
	if out != OutcomeOK {
		src = SourceFallback
		tier = ParseTier(cfg.FallbackTier)
		if tier == TierUnknown {
			tier = TierL2 // validation requires a fallback tier; never index out of range
		}
		if out != OutcomeBreakerOpen {
			logThrottle.Warn("smart model selection: classifier failed, using the fallback tier",
				"outcome", out.String(), "status", status, "fallback", tier.String(), "latency", lat)
		}
	}
	mTiers[tier][src].Inc()
	return Result{Tier: tier, Model: cfg.Tiers.Model(tier.String()), Outcome: out, Source: src, Latency: lat}
}

// Kept returns tier (L1, L2 or L3) and its model for a request whose tier
// is not the classifier's to choose: a Responses follow-up kept on the
// engine holding its previous response, which serves that tier's model
// (another engine cannot know the response). The classifier is not asked;
// infera_smart_selection_total{tier,source="previous_response"} counts it.
func Kept(cfg *config.SmartModelSelection, tier Tier) Result {
	if tier == TierUnknown || tier >= numTiers {
		panic("BUG: classify.Kept without a tier")
	}
	mTiers[tier][SourcePreviousResponse].Inc()
	return Result{Tier: tier, Model: cfg.Tiers.Model(tier.String()), Outcome: OutcomeOK, Source: SourcePreviousResponse}
}

func (c *Client) call(t *target, cfg *config.SmartModelSelection, model, text []byte, start time.Time) (Tier, Outcome, int) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	buf := scratchPool.Get().(*[]byte)
	defer func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if cap(*buf) <= 1<<20 {
			scratchPool.Put(buf)
		}
	}()
	maxText := cfg.MaxTextBytes
	if maxText <= 0 {
		maxText = 8192
	}
	body := AppendRequest((*buf)[:0], model, text, maxText)
	if cfg.ClassifierAPIKey.IsSet() {
		// The header value is built after the body in the same scratch
		// buffer (SetBytesV copies it).
		n := len(body)
		all := cfg.ClassifierAPIKey.AppendBearer(body)
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, all[n:])
		body = all[:n]
	}
	*buf = body
	req.SetBodyRaw(body)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(t.uri)
	req.Header.SetHost(t.host)
	req.Header.SetContentType("application/json")
	req.Header.Set(fasthttp.HeaderAccept, "application/json")
	req.Header.Set(fasthttp.HeaderUserAgent, "infera-smart-selection")
	timeout := time.Duration(cfg.TimeoutMS * float64(time.Millisecond))
	if timeout <= 0 {
		timeout = 300 * time.Millisecond
	}
	err := t.hc.DoDeadline(req, resp, start.Add(timeout))
	switch {
	case err == nil:
	case errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || isNetTimeout(err):
		return TierUnknown, OutcomeTimeout, 0
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return TierUnknown, OutcomeBadAnswer, 0
	default:
		return TierUnknown, OutcomeError, 0
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return TierUnknown, OutcomeBadStatus, code
	}
	tier, err := ParseAnswer(resp.Body())
	if err != nil {
		return TierUnknown, OutcomeBadAnswer, fasthttp.StatusOK
	}
	return tier, OutcomeOK, fasthttp.StatusOK
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// target returns the connection pool for rawURL, building it when the URL
// changed.
func (c *Client) target(rawURL string) (*target, error) {
	if t := c.cur.Load().find(rawURL); t != nil {
		return t, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.cur.Load().find(rawURL); t != nil {
		return t, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, errors.New("invalid classifier URL")
	}
	ep, err := upstream.ParseEndpoint((&url.URL{Scheme: u.Scheme, Host: u.Host}).String())
	if err != nil {
		return nil, err
	}
	t := &target{url: rawURL, host: ep.Host, uri: u.Scheme + "://" + ep.Host + u.RequestURI()}
	t.label, _ = breakerLabel(rawURL)
	isTLS := ep.TLS
	var tlsConf *tls.Config
	if isTLS {
		tlsConf = &tls.Config{ServerName: u.Hostname()}
	}
	t.hc = &fasthttp.HostClient{
		Addr:                ep.Addr,
		Name:                "infera",
		IsTLS:               ep.TLS,
		MaxConns:            4096,
		MaxConnWaitTimeout:  50 * time.Millisecond,
		MaxIdleConnDuration: 30 * time.Second,
		MaxResponseBodySize: MaxAnswerBytes,
		// A pooled connection the classifier closed while it idled (its
		// keep-alive timeout: 5 s for uvicorn and Node) refuses the write
		// (netpeek.Conn) and the call goes on another; nothing else is
		// tried twice.
		//
		// timeout is what is left of the call's budget. The TLS handshake
		// is made here, within it: fasthttp would leave it to the first
		// write of the request, where no read deadline is set yet, so a
		// classifier that accepted the connection and never answered the
		// handshake held the request forever.
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			if timeout <= 0 {
				timeout = fasthttp.DefaultDialTimeout
			}
			deadline := time.Now().Add(timeout)
			nc, err := fasthttp.DialTimeout(addr, timeout)
			if err != nil {
				return nil, err
			}
			c := netpeek.NewConn(nc, isTLS)
			if !isTLS {
				return &c, nil
			}
			return netpeek.Handshake(&c, tlsConf, deadline)
		},
		MaxIdemponentCallAttempts: 4,
		RetryIfErr: func(_ *fasthttp.Request, _ int, err error) (bool, bool) {
			return false, errors.Is(err, netpeek.ErrStale)
		},
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
	}
	if ep.TLS {
		t.hc.TLSConfig = tlsConf
	}
	if c.ms == nil {
		c.ms = metrics.NewSet()
		c.ms.RegisterMetricsWriter(c.writeMetrics)
		metrics.RegisterSet(c.ms)
	}
	next := &targets{cur: t}
	if old := c.cur.Load(); old != nil {
		next.prev = old.cur
		if old.prev != nil {
			old.prev.hc.CloseIdleConnections()
		}
	}
	c.cur.Store(next)
	return t, nil
}

// breakerLabel is the infera_classifier_breaker_state label of the
// classifier at rawURL, quoted: the URL without its query and fragment,
// where a token may ride (user info is refused by validation), with the
// host as requests name it.
func breakerLabel(rawURL string) (string, bool) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return "", false
	}
	ep, err := upstream.ParseEndpoint((&url.URL{Scheme: u.Scheme, Host: u.Host}).String())
	if err != nil {
		return "", false
	}
	return strconv.Quote(u.Scheme + "://" + ep.Host + u.EscapedPath()), true
}

// writeMetrics writes the state of the breaker of the classifier in force
// (Current), or of the one last added.
func (c *Client) writeMetrics(w io.Writer) {
	var label string
	var st breaker.State
	if c.Current != nil {
		cfg := c.Current()
		if cfg == nil || !cfg.Enabled || cfg.ClassifierURL == "" {
			return
		}
		if t := c.cur.Load().find(cfg.ClassifierURL); t != nil {
			label = t.label
		} else if l, ok := breakerLabel(cfg.ClassifierURL); ok {
			label = l // not asked yet: closed
		} else {
			return
		}
		st = c.Breaker(cfg, time.Now()).State
	} else {
		ts := c.cur.Load()
		if ts == nil {
			return
		}
		label, st = ts.cur.label, ts.cur.br.State()
	}
	metrics.WriteMetadataIfNeeded(w, "infera_classifier_breaker_state", "gauge")
	fmt.Fprintf(w, "infera_classifier_breaker_state{classifier=%s} %d\n", label, st)
}

// Close closes the idle connections to the classifier and removes the
// client's series from /metrics.
func (c *Client) Close() {
	c.mu.Lock()
	if c.ms != nil {
		metrics.UnregisterSet(c.ms, true)
	}
	c.mu.Unlock()
	if ts := c.cur.Load(); ts != nil {
		ts.cur.hc.CloseIdleConnections()
		if ts.prev != nil {
			ts.prev.hc.CloseIdleConnections()
		}
	}
}
