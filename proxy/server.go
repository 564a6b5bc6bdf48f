package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/broker"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/lockout"
	"github.com/infera/infera/internal/realip"
	"github.com/infera/infera/mirror"
	"github.com/infera/infera/protocol"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// HealthCheck reports one component's health for GET /health.
type HealthCheck func() (ok bool, detail string)

// Options configures a Server. Flags, Store and Sched are required.
type Options struct {
	Flags *config.Serve
	Store *config.Store
	Sched *sched.Scheduler

	// Tokenizer renders and encodes prompts for kv-aware routing; nil means
	// block hashes are not computed.
	Tokenizer tokenizer.Tokenizer
	// HashBlocks appends the router's block hashes of tokens (kv.HashBlocks).
	HashBlocks func(dst []uint64, tokens []uint32, blockSize int, lora string) []uint64
	// IsLora returns the LoRA adapter a model name is, or "" (kv.Manager's
	// IsLora): an adapter's prompts are hashed with its name, as the engine
	// keys their blocks. nil: none is.
	IsLora func(model []byte) string
	// BlockSize is the engines' KV block size in tokens.
	BlockSize int

	// Health lists named component checks shown in /health: one that
	// fails makes the status "degraded", or "unavailable" (503) when it is
	// named in HealthRequired.
	Health map[string]HealthCheck
	// HealthRequired names the Health components without which no request
	// can reach a worker (the broker, with --request-transport nats).
	HealthRequired []string
	// Extra registers additional routes (path -> handler), behind the API key.
	Extra map[string]fasthttp.RequestHandler

	// Explain backs POST /debug/route (kv-aware cost terms); optional.
	Explain RouteExplainer

	// TLS, when set, serves HTTPS (--tls-cert-file).
	TLS *tls.Config

	// AccessLog, when set, gets a line per inference request
	// (--access-log); the caller opens, reopens and closes it.
	AccessLog *AccessLog

	// NATS, when set, carries every request (--request-transport nats).
	NATS *broker.Client
	// NATSConnected reports the broker connection state (for classifying
	// "no responders" during a broker restart); optional.
	NATSConnected func() bool

	// Beyond the local fleet (docs/upstream.md). The split proxy needs
	// nothing here: its external upstreams are built from the config.
	//
	// Mirror copies sampled requests (traffic mirroring); nil: none.
	Mirror *mirror.Mirror
	// Classifier asks smart model selection's classifier; nil: a client
	// of the server's own (closed by Shutdown; the caller closes its own).
	Classifier *classify.Client
	// Poller knows the member gateways' capacity (global scheduling); nil:
	// requests are never forwarded.
	Poller *upstreams.Poller
	// Saturated, when set, reports whether the local fleet cannot take r
	// now: request rate limiting would refuse or queue it at once (every
	// candidate over its concurrency limit under overlimit reject, or the
	// queue full under overlimit queue). Global scheduling then forwards
	// r. nil: the proxy's own estimate from rate_limit and the fleet's load
	// counters (global.go, localSaturated).
	Saturated func(cfg *config.Config, r *sched.Request) bool
	// QueueLength reports the requests waiting for a concurrency seat (the
	// capacity endpoint's "queued"); nil: 0.
	QueueLength func() int

	// Governor enforces users, quota templates and request rate limiting
	// (docs/governance.md, govern.go); nil: none (no user keys, no limits).
	Governor *govern.Governor
}

// Server is the OpenAI-compatible front door.
type Server struct {
	o     Options
	flags *config.Serve
	// wto is --client-write-timeout, 0 meaning its default (60 s) as the
	// other timeouts' 0 means theirs.
	wto   time.Duration
	store *config.Store
	sched *sched.Scheduler
	srv   *fasthttp.Server
	lst   atomic.Pointer[listener] // the listener Serve serves (its count of open connections)
	// states counts the requests between acquireState and releaseState
	// (streams included): CutOpen waits for it to reach zero. On a cache
	// line of its own: every request writes it twice, and its neighbours
	// (the state pool, the transport) are read by every request.
	states paddedCount
	pool   sync.Pool // *reqState
	tr     transport
	nats   *natsTransport
	live   *liveness
	gov    *govern.Governor
	// access is the access log (accesslog.go); nil: off.
	access *AccessLog
	// debug: --log-level debug, read before a debug line is built
	// (debuglog.go); false, the request path does nothing for them.
	debug bool
	// cors answers browser pages of allowed origins (cors.go); nil: off.
	cors *cors

	policy    sched.Policy
	mode      sched.Mode
	authBytes []byte // "Bearer <key>", nil when no key is set
	keyBytes  []byte
	// fails counts wrong keys per client address (--auth-lockout-*,
	// lockout.go); nil: off.
	fails *lockout.Guard
	// shared counts them in Redis with the other routers (--state redis,
	// lockout.go); nil: this router alone.
	shared *govern.Lockouts
	// trusted are --trusted-proxies, whose X-Forwarded-For names the
	// client (clientaddr.go); nil: every client is its TCP peer.
	trusted *realip.Proxies
	bodies  bodyBudget

	ext        *externals         // split proxy entries and member gateways (external.go)
	splitter   upstreams.Splitter // weight strategy draws
	classifier *classify.Client
	ownClassif bool // classifier is the server's own: Shutdown closes it

	proto protoFront // conversion options per config snapshot (protocols.go)
	// respAff routes Responses follow-ups to the worker that answered
	// their previous response, in passthrough (respaffinity.go).
	respAff respAffinity
}

// HTTPHook returns the fleet hook that gives each worker an HTTP connection
// pool. Register it on the fleet before workers are added.
func HTTPHook(f *config.Serve) fleet.Hook {
	return &httpHook{maxConns: f.MaxConnsPerWorker, connectTimeout: f.ConnectTimeout}
}

// New returns a Server.
func New(o Options) *Server {
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	f := o.Flags
	s := &Server{o: o, flags: f, store: o.Store, sched: o.Sched, live: newLiveness(), gov: o.Governor, access: o.AccessLog,
		cors: newCORS(f.CORSAllowOrigins), debug: f.LogLevel == "debug"}
	s.policy, _ = sched.ParsePolicy(f.RouterPolicy)
	s.mode, _ = sched.ParseMode(f.RouterMode)
	if f.APIKey != "" {
		s.keyBytes = []byte(f.APIKey)
		s.authBytes = []byte("Bearer " + f.APIKey)
	}
	if o.Governor != nil {
		s.respAff.records = o.Governor.Records() // nil without --state redis (respshared.go)
	}
	s.fails = lockout.New(lockout.Options{Max: f.AuthLockoutFailures, Window: f.AuthLockoutWindow})
	if s.fails != nil && o.Governor != nil {
		if s.shared = o.Governor.Lockouts("api"); s.shared != nil {
			s.watchLockouts()
		}
	}
	// Refused at start when malformed (config.Serve.Validate); a list that
	// does not parse trusts no one.
	s.trusted, _ = realip.Parse(f.TrustedProxies)
	s.bodies.limit = f.MaxInflightBodyBytes
	if s.bodies.limit <= 0 {
		s.bodies.limit = 256 << 20
	}
	s.pool.New = func() any {
		rs := &reqState{rbuf: make([]byte, relayBufSize)}
		s.live.register(rs)
		return rs
	}
	s.ext = newExternals(f)
	s.ext.latest = s.store.Load
	if s.store != nil {
		s.store.OnChange(func(_, cur *config.Config) { s.ext.sync(cur) })
	}
	if s.classifier = o.Classifier; s.classifier == nil {
		s.classifier, s.ownClassif = &classify.Client{}, true
		if s.store != nil {
			s.classifier.Current = func() *config.SmartModelSelection { return &s.store.Load().SmartModelSelection }
		}
	}
	if o.NATS != nil {
		s.nats = &natsTransport{bc: o.NATS, connected: o.NATSConnected}
		s.tr = s.nats
	} else {
		s.tr = httpTransport{}
	}
	if s.wto = f.ClientWriteTimeout; s.wto <= 0 {
		s.wto = 60 * time.Second
	}
	header := f.HeaderTimeout
	if header <= 0 {
		header = 10 * time.Second
	}
	idle := f.ClientIdleTimeout
	if idle <= 0 {
		idle = 60 * time.Second
	}
	headerBytes := f.MaxHeaderBytes
	if headerBytes <= 0 {
		headerBytes = 16 << 10
	}
	s.srv = &fasthttp.Server{
		Handler: s.handle,
		Name:    "infera",
		// The request line and headers must fit the read buffer (large
		// JWTs, cookies, tracing baggage); a larger head gets 431.
		ReadBufferSize: headerBytes,
		// Bodies are streamed to the handler, which authenticates first and
		// reads them incrementally under the in-flight memory bound.
		StreamRequestBody:  true,
		MaxRequestBodySize: f.MaxBodyBytes,
		// ReadTimeout covers the request line and headers (slowloris); the
		// handler gives the body its own deadline.
		ReadTimeout: header,
		IdleTimeout: idle,
		// Every answer's write is bounded: a client that stops reading
		// (pipelining requests it never reads the answers of) is
		// disconnected. A relay (a stream, a large body) re-arms it before
		// each write, so a stream may last for hours.
		WriteTimeout: s.wto,
		// The listener enforces --max-conns with an answer in the error
		// shape; fasthttp's cap is above it (a closed connection's slot
		// is given back to the listener a moment before fasthttp's).
		Concurrency:           maxConns(f.MaxConns) + 1024,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		SecureErrorLogMessage: true,
		Logger:                serverLogger{},
		ErrorHandler:          s.handleServerError,
		ExpectHandler:         s.handleExpect,
		HeaderReceived:        headerReceived,
		ConnState:             endWireBound,
		CloseOnShutdown:       true,
		// Nothing reads ctx.Time(): no clock read per request for it.
		LazyRequestTime: true,
	}
	return s
}

// handleExpect answers a request with Expect: 100-continue before its
// body when its answer does not depend on it (RFC 9110 10.1.1: a server
// may answer a final status instead of 100 Continue): a Content-Length
// over --max-body-bytes gets its 413 (instead of a 100 Continue that
// invites a body the router would refuse after its first 8 KiB), an
// unknown path its 404, an inference endpoint a method it does not take
// its 405, and a missing or wrong key its 401 (or a locked-out address its
// 429), in the client's shape. fasthttp then closes the connection without
// calling the handler or reading the body. Anything else gets the 100.
func (s *Server) handleExpect(ctx *fasthttp.RequestCtx) int {
	path := ctx.Path()
	kind, inference := inferenceKind(path)
	switch {
	case s.flags.MaxBodyBytes > 0 && ctx.Request.Header.ContentLength() > s.flags.MaxBodyBytes:
		mBadRequests.Inc()
		s.writeBodyTooLarge(ctx)
		countStatus(fasthttp.StatusRequestEntityTooLarge)
	case !inference:
		switch pathKey(s, path) {
		case keyNone:
			return fasthttp.StatusContinue
		case keyUnknownPath:
			writeUnknownPath(ctx, path)
			if apiOfPath(path) == protocol.Anthropic { // its ids are set
				closeUnread(ctx)
				if s.cors != nil {
					s.cors.decorate(ctx)
				}
				return fasthttp.StatusNotFound
			}
		default:
			if !s.authorized(ctx) {
				break
			}
			return fasthttp.StatusContinue
		}
	default:
		if allow := inferenceMethod(kind); string(ctx.Method()) != allow {
			methodNotAllowed(ctx, "use "+allow, allow) // as the handler answers it
		} else if s.authorized(ctx) {
			return fasthttp.StatusContinue
		}
		countStatus(ctx.Response.StatusCode())
	}
	// The client may send its body anyway (curl does after 1 s): the
	// connection lingers after the answer instead of being reset.
	closeUnread(ctx)
	// Its request id, its CORS headers and, on an inference endpoint,
	// its access-log line: the handler never runs after this hook's
	// answer.
	s.answeredEarly(ctx, path)
	return ctx.Response.StatusCode()
}

// headerReceived drops the body of an HTTP/1.0 request to an inference
// endpoint that expects 100 Continue, before fasthttp reads its first
// bytes: HTTP/1.0 gets 426 there (or 405) whatever its body, and fasthttp,
// which ignores the expectation in HTTP/1.0 (RFC 9110 10.1.1), waited for
// the first min(Content-Length, 8 KiB) of a body its client holds back
// for a 100 that never comes. The connection closes after the answer, so
// the body is never read as a request. Only the raw path of an inference
// endpoint is looked at: another path's answer may depend on the body.
func headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if h.IsHTTP11() || h.ContentLength() <= 0 || laterHTTP1(h.Protocol()) ||
		!bytes.EqualFold(h.PeekBytes(hdrExpect), str100Continue) {
		return fasthttp.RequestConfig{}
	}
	path := h.RequestURI()
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if _, ok := inferenceKind(path); ok {
		h.SetContentLength(0)
		h.SetConnectionClose()
	}
	return fasthttp.RequestConfig{}
}

var (
	hdrExpect      = []byte("Expect")
	str100Continue = []byte("100-continue")
)

// inferenceMethod is the method an inference endpoint of kind takes.
func inferenceMethod(kind int) string {
	if kind == kindResponseGet {
		return fasthttp.MethodGet
	}
	return fasthttp.MethodPost
}

// What route asks of a request to a path other than an inference
// endpoint's before it could read its body (pathKey).
const (
	keyNone        = iota // nothing: served without a key (health, metrics)
	keyChecked            // the client's key
	keyUnknownPath        // no such path: 404
)

// pathKey is what route asks of a request to path (no inference
// endpoint's) before its body: it must list the paths route serves.
func pathKey(s *Server, path []byte) int {
	switch string(path) {
	case "/health", "/healthz", "/readyz", "/metrics",
		"/v1/models": // a GET (else 405 before the key)
		return keyNone
	case "/tokenize", "/detokenize", "/debug/route", upstreams.CapacityPath:
		return keyChecked
	}
	if id, ok := bytes.CutPrefix(path, modelsPrefix); ok && len(id) > 0 {
		return keyChecked
	}
	if s.o.Extra[string(path)] != nil {
		return keyChecked
	}
	return keyUnknownPath
}

// inferenceKind is the kind of an inference endpoint's path (handle's
// routes), false for other paths.
func inferenceKind(path []byte) (int, bool) {
	switch string(path) {
	case "/v1/chat/completions":
		return kindChat, true
	case "/v1/completions":
		return kindCompletion, true
	case "/v1/embeddings":
		return kindEmbeddings, true
	case "/v1/rerank", "/rerank", "/v2/rerank":
		return kindRerank, true
	case "/v1/score", "/score":
		return kindScore, true
	case "/v1/messages":
		return kindMessages, true
	case "/v1/messages/count_tokens":
		return kindCountTokens, true
	case "/v1/responses":
		return kindResponses, true
	}
	if kind, _, ok := responseByIDKind(path); ok { // respstored.go
		return kind, true
	}
	return 0, false
}

// writeBodyTooLarge answers a body over --max-body-bytes (announced,
// prefetched or streamed): 413 in the client's shape.
func (s *Server) writeBodyTooLarge(ctx *fasthttp.RequestCtx) {
	writeError(ctx, fasthttp.StatusRequestEntityTooLarge, typeInvalidRequest,
		"request body exceeds --max-body-bytes ("+strconv.Itoa(s.flags.MaxBodyBytes)+" bytes)", "", "request_too_large")
}

// Serve serves connections from ln until Shutdown. Temporary accept errors
// (out of file descriptors above all) are retried with backoff; they never
// stop the server.
func (s *Server) Serve(ln net.Listener) error {
	go s.live.run()
	l := &listener{Listener: ln, tls: s.o.TLS, max: int64(maxConns(s.flags.MaxConns)), refusal: tooManyConns}
	if s.cors != nil && len(s.cors.origins) > 0 {
		// Written before the request is read: its Origin is unknown, so
		// no Access-Control-Allow-Origin, but the Vary every answer carries.
		l.refusal = tooManyConnsVary
	}
	s.lst.Store(l)
	return s.srv.Serve(l)
}

// Shutdown stops accepting, closes idle connections and waits for open
// requests (streams included) until ctx ends.
func (s *Server) Shutdown() error { return s.ShutdownContext(context.Background()) }

// ShutdownContext is Shutdown bounded by ctx.
// When ctx ends first, the liveness watchdog and the external upstreams
// stay up for CutOpen, which closes them once the requests it cut ended.
func (s *Server) ShutdownContext(ctx context.Context) error {
	err := s.srv.ShutdownWithContext(ctx)
	if err == nil {
		s.live.close()
		s.ext.close()
		if s.ownClassif {
			s.classifier.Close()
		}
	}
	return err
}

// Every series /metrics exposes gets its # HELP and # TYPE lines: without
// them Prometheus stores counters and gauges as untyped. (The library has
// no help texts: the HELP lines carry the name; docs/*.md describe each
// series.)
func init() { metrics.ExposeMetadata(true) }

// Handler returns the request handler (for tests and embedding).
func (s *Server) Handler() fasthttp.RequestHandler { return s.handle }

// CutOpen ends what a drain left open: every client connection still open
// is shut down, and it waits, until ctx ends, for the requests on them to
// end as requests whose client left (their engine requests cancelled,
// their leases and seats released, their access-log lines written). A
// stream is cut at its next write, so one whose engine is silent ends
// only then. It returns the connections cut and the requests still open
// when it gave up.
func (s *Server) CutOpen(ctx context.Context) (cut int, left int64) {
	// The watchdog notices the cut of a request still waiting for its
	// first byte (a non-streamed answer, a prefill); then it stops.
	defer s.ext.close()
	defer s.live.close()
	if l := s.lst.Load(); l != nil {
		cut = l.cutAll()
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.states.n.Load() > 0 {
		select {
		case <-ctx.Done():
			return cut, s.states.n.Load()
		case <-t.C:
		}
	}
	return cut, 0
}

// paddedCount is a counter alone on its cache line.
type paddedCount struct {
	_ [64]byte
	n atomic.Int64
	_ [56]byte
}

// OpenConnections is the number of client connections being served: the
// listener's count (fasthttp's own is one short once Shutdown has
// returned, when the drain timeout's warning reads it).
func (s *Server) OpenConnections() int32 {
	if l := s.lst.Load(); l != nil {
		return int32(l.open.Load())
	}
	return s.srv.GetOpenConnectionsCount()
}

// BrokerReconnected tells the NATS transport the broker connection is back.
func (s *Server) BrokerReconnected() {
	if s.nats != nil {
		s.nats.Reconnected()
	}
}

// handleServerError answers requests fasthttp could not parse. The error
// text is never echoed: it can hold raw request bytes (credentials).
//
// Every answer carries a request id, these too. fasthttp resets the
// request before it calls this hook when the head, or the first bytes of
// the body, could not be read: the path, the client's own X-Request-Id and
// so the protocol are then unknown (the answer is in OpenAI's shape, with
// a new id). When the head was read (its Host or request target is no URI
// fasthttp can parse), the request target's path names the protocol, and
// an inference endpoint's answer is finished as any other's: the client's
// id, Anthropic's Request-Id and request_id, the access log.
func (s *Server) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	mBadRequests.Inc()
	path := ctx.Request.Header.RequestURI() // empty when the request was reset
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	api := apiOfPath(path)
	var to interface{ Timeout() bool }
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		closeUnread(ctx)
		s.writeBodyTooLarge(ctx)
	case errors.As(err, &small):
		headerBytes := s.flags.MaxHeaderBytes
		if headerBytes <= 0 {
			headerBytes = 16 << 10
		}
		writeErrorAPI(ctx, api, fasthttp.StatusRequestHeaderFieldsTooLarge, typeInvalidRequest,
			"request line and headers exceed --max-header-bytes ("+strconv.Itoa(headerBytes)+" bytes)", "", "headers_too_large")
		closeUnread(ctx)
	case errors.As(err, &to) && to.Timeout():
		writeErrorAPI(ctx, api, fasthttp.StatusRequestTimeout, typeInvalidRequest, "request not received in time", "", "request_timeout")
	default:
		writeErrorAPI(ctx, api, fasthttp.StatusBadRequest, typeInvalidRequest, "malformed HTTP request", "", "bad_request")
	}
	s.answeredEarly(ctx, path)
}

// answeredEarly finishes an answer the router wrote before a handler took
// the request (path is its request target's path, empty when unknown):
// an inference endpoint's as any other's (the client's id, Anthropic's
// Request-Id and request_id, the access log), another's with its id.
func (s *Server) answeredEarly(ctx *fasthttp.RequestCtx, path []byte) {
	if s.cors != nil {
		// What every answer carries with origins listed (cors.go): the
		// handler's deferred decoration never runs for these. When
		// fasthttp reset the request, Origin is unknown: Vary alone.
		s.cors.decorate(ctx)
	}
	if kind, ok := inferenceKind(path); ok {
		rs := s.acquireState()
		rs.start = time.Now()
		takeRequestID(ctx, rs)
		rs.acc.kind = kind
		s.answered(ctx, rs)
		return
	}
	var id [128]byte
	ctx.Response.Header.SetCanonical(hdrRequestIDBytes, appendClientRequestID(id[:0], ctx))
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	if c, ok := ctx.Conn().(*clientConn); ok {
		// A chunked request's framing (sizes, extensions, trailers) takes
		// at most as many bytes on the wire as its body may have, read by
		// readBody or discarded by fasthttp after an answer that left it
		// (one-byte chunks of a body of a third of the limit pass).
		c.boundWire(ctx.Request.Header.ContentLength() == -1, 2*int64(s.flags.MaxBodyBytes)+64<<10)
	}
	if h := &ctx.Request.Header; !h.IsHTTP11() && !isHTTP1(h.Protocol()) {
		// fasthttp reads any HTTP/d.d request line as HTTP/1.0: HTTP/2.0
		// or HTTP/0.9 in HTTP/1 syntax is a version this server does not
		// speak (RFC 9110 section 15.6.6), as Go's net/http and nginx
		// answer it.
		mBadRequests.Inc()
		closeUnread(ctx)
		writeError(ctx, fasthttp.StatusHTTPVersionNotSupported, typeInvalidRequest,
			"HTTP version not supported: send HTTP/1.1", "", "http_version_not_supported")
		s.answeredEarly(ctx, ctx.Path())
		return
	}
	if h := &ctx.Request.Header; h.ContentLength() != -1 && (h.ContentLength() <= 0 || h.ConnectionClose()) &&
		hasTransferEncoding(h.RawHeaders()) {
		// fasthttp accepts Transfer-Encoding: identity and drops it, leaving
		// the length to Content-Length or to nothing, so that what follows
		// would be read as the next request. RFC 9112 6.3: a transfer
		// coding other than chunked makes the length unknown: 400, close.
		mBadRequests.Inc()
		closeUnread(ctx)
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest,
			"Transfer-Encoding other than chunked: the request's length is unknown", "", "bad_request")
		s.answeredEarly(ctx, ctx.Path())
		return
	}
	if s.cors != nil { // cors.go
		if s.cors.preflight(ctx) {
			return
		}
		defer s.cors.decorate(ctx) // after the handler: an error answer resets the headers
	}
	s.route(ctx)
}

// route answers the request by its path. It is apart from handle so that
// handle's returns are few enough for its defer to be open-coded (with
// many, the runtime's defer records are pushed and popped per request,
// CORS on or off).
func (s *Server) route(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	if kind, ok := inferenceKind(path); ok {
		switch kind {
		case kindMessages, kindCountTokens, kindResponses:
			s.handleProtocol(ctx, kind) // protocols.go
			return
		case kindResponseGet, kindResponseCancel:
			s.handleResponseByID(ctx, kind) // respstored.go
			return
		case kindChat:
			mReqChat.Inc()
		case kindCompletion:
			mReqCompletion.Inc()
		case kindEmbeddings:
			mReqEmbeddings.Inc() // embeddings.go
		case kindRerank:
			mReqRerank.Inc() // rerank.go
		case kindScore:
			mReqScore.Inc()
		}
		s.handleInference(ctx, kind)
		return
	}
	switch string(path) {
	case "/v1/models":
		if !readOnly(ctx) {
			return
		}
		if u, ok := s.authenticate(ctx); ok {
			s.handleModels(ctx, u)
		}
		return
	case "/health", "/healthz", "/readyz":
		if readOnly(ctx) {
			s.handleHealth(ctx)
		}
		return
	case "/metrics":
		if !readOnly(ctx) {
			return
		}
		ctx.SetContentType("text/plain; version=0.0.4")
		metrics.WritePrometheus(ctx, true) // with # TYPE lines (init)
		return
	case "/tokenize":
		if u, ok := s.authenticate(ctx); ok {
			s.handleTokenize(ctx, u)
		}
		return
	case "/detokenize":
		if s.authorized(ctx) {
			s.handleDetokenize(ctx) // debug.go
		}
		return
	case "/debug/route":
		if u, ok := s.authenticate(ctx); ok {
			s.handleDebugRoute(ctx, u)
		}
		return
	case upstreams.CapacityPath:
		if s.authorized(ctx) {
			s.handleCapacity(ctx) // global.go
		}
		return
	}
	if id, ok := bytes.CutPrefix(path, modelsPrefix); ok && len(id) > 0 {
		if u, ok := s.authenticate(ctx); ok {
			s.handleModel(ctx, u, id)
		}
		return
	}
	if h := s.o.Extra[string(path)]; h != nil {
		if s.authorized(ctx) {
			h(ctx)
		}
		return
	}
	writeUnknownPath(ctx, path)
}

// writeUnknownPath answers a path the router does not serve: 404.
func writeUnknownPath(ctx *fasthttp.RequestCtx, path []byte) {
	writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "unknown path", "", "unknown_path")
	if apiOfPath(path) == protocol.Anthropic {
		// Anthropic's answers carry a request id (header and error body),
		// which its SDKs report: an unknown path under /v1/messages too.
		id := appendClientRequestID(nil, ctx)
		ctx.Response.Header.SetCanonical(hdrRequestIDBytes, id)
		ctx.Response.Header.SetCanonical(hdrAnthropicRequestID, id)
		addAnthropicRequestID(&ctx.Response, id)
	}
}

// methodNotAllowed answers 405 method_not_allowed with the Allow header
// RFC 9110 requires.
func methodNotAllowed(ctx *fasthttp.RequestCtx, msg, allow string) {
	writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, msg, "", "method_not_allowed")
	ctx.Response.Header.Set("Allow", allow)
}

// readOnly reports whether the request is a GET or HEAD, else answers 405.
func readOnly(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	methodNotAllowed(ctx, "use GET", "GET, HEAD")
	return false
}

// authorized checks the request's credentials (authenticate); on failure
// it has written the error answer.
// authOn reports whether the router authenticates clients (--api-key, or
// users configured): the key is then the router's, never forwarded.
func (s *Server) authOn() bool {
	return s.authBytes != nil || (s.gov != nil && s.gov.AuthRequired())
}

func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	_, ok := s.authenticate(ctx)
	return ok
}

// authenticate checks the key the client presented (clientKey: a bearer
// token, or x-api-key as Anthropic clients send it): the global --api-key,
// compared in constant time, or, once users are configured, a user's key
// (govern.Identify). It returns the user, nil for the global key or when
// the router is open (no --api-key, no users). On failure it writes 401
// (403 for a disabled user) and returns false. A client address locked out
// for wrong keys (lockout.go) gets 429 before its key is even looked at.
func (s *Server) authenticate(ctx *fasthttp.RequestCtx) (*govern.User, bool) {
	users := s.gov != nil && s.gov.AuthRequired()
	if s.authBytes == nil && !users {
		return nil, true
	}
	var ip netip.Addr
	if s.fails != nil {
		ip = s.lockoutKey(ctx) // the TCP peer's, or X-Forwarded-For's behind --trusted-proxies
		// Redis's answers about ip's wrong keys sent before (lockout.go).
		s.fails.Await(ip, govern.AnswerWait)
		if wait, locked := s.fails.Locked(ip); locked {
			writeLockedOut(ctx, wait)
			return nil, false
		}
	}
	k := clientKey(&ctx.Request.Header)
	if s.keyBytes != nil && len(k) > 0 && subtle.ConstantTimeCompare(k, s.keyBytes) == 1 {
		return nil, true
	}
	if users {
		u, rej := s.gov.Identify(k)
		if rej == nil {
			return u, true
		}
		if rej.Code == govern.CodeInvalidKey {
			s.wrongKey(ctx, ip, k) // a disabled user's key is no guess
		}
		mUnauthorized.Inc()
		writeError(ctx, rej.Status, rej.Type(), rej.Message, "", rej.Code.String())
		closeUnread(ctx)
		return nil, false
	}
	s.wrongKey(ctx, ip, k)
	mUnauthorized.Inc()
	writeError(ctx, fasthttp.StatusUnauthorized, typeAuth, "invalid or missing API key", "", "invalid_api_key")
	// Every endpoint, not only inference: the connection closes and no
	// more of the body is read (/tokenize, /debug/route read up to 256 KiB
	// of it to serve the next request on the connection).
	closeUnread(ctx)
	return nil, false
}

// handleModels lists the models served, those u may call (users[].models).
func (s *Server) handleModels(ctx *fasthttp.RequestCtx, u *govern.User) {
	v := s.sched.Fleet.View()
	models := s.sched.Models(s.store.Load(), v)
	b := make([]byte, 0, 96+128*len(models))
	b = append(b, `{"object":"list","data":[`...)
	first, last := "", ""
	for _, m := range models {
		if !u.AllowsModel(m) {
			continue
		}
		if last != "" {
			b = append(b, ',')
		}
		if first == "" {
			first = m
		}
		last = m
		b = appendModel(b, m)
	}
	// Anthropic's list fields beside OpenAI's: both SDKs' models.list()
	// read one body (each ignores the other's fields).
	b = append(b, `],"has_more":false,"first_id":`...)
	b = appendNullableString(b, first)
	b = append(b, `,"last_id":`...)
	b = appendNullableString(b, last)
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// appendModel appends the model object of m in OpenAI's shape (id, object,
// created, owned_by) with Anthropic's fields (type, display_name,
// created_at), so that either SDK reads what it expects.
func appendModel(b []byte, m string) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, m)
	b = append(b, `,"object":"model","created":0,"owned_by":"infera","type":"model","display_name":`...)
	b = appendJSONString(b, m)
	return append(b, `,"created_at":"1970-01-01T00:00:00Z"}`...)
}

func appendNullableString(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendJSONString(b, s)
}

var modelsPrefix = []byte("/v1/models/")

// handleModel answers GET /v1/models/{id} (the SDKs' models.retrieve) with
// the model object of a model /v1/models lists, or OpenAI's 404
// model_not_found. The id is the decoded path, so ids with slashes
// (Qwen/Qwen3-8B) work written either way.
func (s *Server) handleModel(ctx *fasthttp.RequestCtx, u *govern.User, id []byte) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "only GET is allowed on /v1/models/{model}", "GET, HEAD")
		return
	}
	for _, m := range s.sched.Models(s.store.Load(), s.sched.Fleet.View()) {
		if m == string(id) && u.AllowsModel(m) {
			b := appendModel(make([]byte, 0, 128+2*len(m)), m)
			ctx.SetContentType("application/json")
			ctx.SetBody(b)
			return
		}
	}
	writeError(ctx, fasthttp.StatusNotFound, typeNotFound, unknownModel(id), "model", "model_not_found")
}

// unknownModel is the message of a model_not_found error. It names the
// model as the client wrote it, cut to its first 256 bytes (on a character
// boundary): an error never echoes a client's megabyte.
func unknownModel(model []byte) string {
	if len(model) > 256 {
		model = model[:256]
	}
	return "The model `" + strings.ToValidUTF8(string(model), "") + "` does not exist or is not served by any worker"
}

// allowsModel reports whether u may call model: the name asked for and,
// when model routing turns it into another served model (a fuzzy match,
// the default model for an unknown name), that model too.
func (s *Server) allowsModel(cfg *config.Config, u *govern.User, model []byte) bool {
	if !u.AllowsModel(arenaString(model)) { // not kept
		return false
	}
	if !u.LimitsModels() {
		return true
	}
	served := s.sched.ServedModel(cfg, model)
	return served == "" || u.AllowsModel(served)
}

// notAllowedModel is the message of a model_not_allowed error (the model
// cut as unknownModel cuts it).
func notAllowedModel(model []byte) string {
	if len(model) > 256 {
		model = model[:256]
	}
	return "This API key may not use the model `" + strings.ToValidUTF8(string(model), "") + "`"
}

// healthyWorkers counts routable workers whose breaker is closed (or due
// for a probe).
func (s *Server) healthyWorkers() int {
	now := time.Now().UnixNano()
	n := 0
	for _, w := range s.sched.Fleet.View().Routable {
		if w.Breaker.State() == fleet.BreakerClosed || w.Breaker.Available(now) {
			n++
		}
	}
	return n
}

// untriedWorker reports whether some routable worker that r has not tried
// would take a request (its breaker lets one through): when none is left,
// every worker was tried and refused, or none is healthy, and the fleet is
// down for r (503, not 502).
func (s *Server) untriedWorker(r *sched.Request) bool {
	now := time.Now().UnixNano()
	for _, w := range s.sched.Fleet.View().Routable {
		if !slices.Contains(r.Tried, w.Idx) && (w.Breaker.State() == fleet.BreakerClosed || w.Breaker.Available(now)) {
			return true
		}
	}
	return false
}

// classifierHealth is the health of smart model selection's classifier:
// not ok while its breaker is open or half-open (requests take the
// fallback tier without asking it, but for the probe).
func (s *Server) classifierHealth(sm *config.SmartModelSelection) (bool, string) {
	st := s.classifier.Breaker(sm, time.Now())
	switch st.State {
	case classify.BreakerOpen:
		return false, fmt.Sprintf("breaker open: requests take the fallback tier %s without asking the classifier; probe in %.1fs",
			sm.FallbackTier, st.ProbeIn.Seconds())
	case classify.BreakerHalfOpen:
		return false, "breaker half-open: one request probes the classifier, the others take the fallback tier " + sm.FallbackTier
	}
	return true, "breaker closed"
}

// handleHealth answers 200 "ok" when some worker is routable and its
// breaker lets requests through and every component is up, 200 "degraded"
// when every routable worker's breaker is open (requests are still
// dispatched, to probably bad workers) or a component is down (discovery:
// the last known fleet is served), and 503 "unavailable" when no worker is
// routable or a required component is down (the broker that carries the
// requests).
func (s *Server) handleHealth(ctx *fasthttp.RequestCtx) {
	v := s.sched.Fleet.View()
	healthy := s.healthyWorkers()
	names := make([]string, 0, len(s.o.Health))
	for n := range s.o.Health {
		names = append(names, n)
	}
	sort.Strings(names)
	type comp struct {
		ok     bool
		detail string
	}
	comps := make([]comp, len(names))
	compDown, requiredDown := false, false
	for i, n := range names {
		comps[i].ok, comps[i].detail = s.o.Health[n]()
		if !comps[i].ok {
			compDown = true
			requiredDown = requiredDown || slices.Contains(s.o.HealthRequired, n)
		}
	}
	if sm := &s.store.Load().SmartModelSelection; sm.Enabled {
		// Smart model selection's classifier, while the section is on:
		// down (degraded) while its breaker is open.
		ok, detail := s.classifierHealth(sm)
		names = append(names, "classifier")
		comps = append(comps, comp{ok, detail})
		compDown = compDown || !ok
	}
	status := "ok"
	switch {
	case len(v.Routable) == 0 || requiredDown:
		status = "unavailable"
	case healthy == 0 || compDown:
		status = "degraded"
	}
	b := make([]byte, 0, 256)
	b = append(b, `{"status":"`...)
	b = append(b, status...)
	b = append(b, `","workers":{"routable":`...)
	b = strconv.AppendInt(b, int64(len(v.Routable)), 10)
	b = append(b, `,"healthy":`...)
	b = strconv.AppendInt(b, int64(healthy), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(len(v.All)), 10)
	b = append(b, `,"list":[`...)
	for i, w := range v.All {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, w.ID)
		b = append(b, `,"role":`...)
		b = appendJSONString(b, w.Role.String())
		b = append(b, `,"draining":`...)
		b = strconv.AppendBool(b, w.Draining())
		b = append(b, `,"breaker":`...)
		b = appendJSONString(b, fleet.BreakerStateName(w.Breaker.State()))
		b = append(b, `,"active_requests":`...)
		b = strconv.AppendInt(b, w.Load.Requests.Load(), 10)
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	if len(names) > 0 {
		b = append(b, `,"components":{`...)
		for i, n := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, n)
			b = append(b, `:{"ok":`...)
			b = strconv.AppendBool(b, comps[i].ok)
			b = append(b, `,"detail":`...)
			b = appendJSONString(b, comps[i].detail)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	b = append(b, '}')
	if status == "unavailable" {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// hasTransferEncoding reports whether a raw request head has a
// Transfer-Encoding field. It is read only for the requests fasthttp left
// without a chunked body and either with no or an empty body or closing
// (where it drops a Transfer-Encoding: identity), never on a keep-alive
// request with a body of a known length.
func hasTransferEncoding(raw []byte) bool {
	const name = "transfer-encoding"
	for len(raw) > len(name) {
		if raw[len(name)] == ':' && bytes.EqualFold(raw[:len(name)], []byte(name)) {
			return true
		}
		i := bytes.IndexByte(raw, '\n')
		if i < 0 {
			break
		}
		raw = raw[i+1:]
	}
	return false
}
