package proxy

import (
	"bytes"
	"errors"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
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
	// BlockSize is the engines' KV block size in tokens.
	BlockSize int

	// Health lists named component checks shown in /health.
	Health map[string]HealthCheck
	// Extra registers additional routes (path -> handler), e.g. /tokenize.
	Extra map[string]fasthttp.RequestHandler

	// Explain backs POST /debug/route (kv-aware cost terms); optional.
	Explain RouteExplainer

	// NATS, when set, carries every request (--request-transport nats).
	NATS *broker.Client

	// DefaultMaxTokens is the output estimate for requests without max_tokens.
	DefaultMaxTokens int
}

// Server is the OpenAI-compatible front door.
type Server struct {
	o     Options
	flags *config.Serve
	store *config.Store
	sched *sched.Scheduler
	srv   *fasthttp.Server
	pool  sync.Pool // *reqState
	now   func() time.Time
}

// HTTPHook returns the fleet hook that gives each worker a HostClient.
// Register it on the fleet before workers are added.
func HTTPHook(f *config.Serve) fleet.Hook {
	return &httpTransport{maxConns: f.MaxConnsPerWorker, connectTimeout: f.ConnectTimeout}
}

// New returns a Server.
func New(o Options) *Server {
	if o.DefaultMaxTokens <= 0 {
		o.DefaultMaxTokens = 1024
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	s := &Server{o: o, flags: o.Flags, store: o.Store, sched: o.Sched, now: time.Now}
	s.pool.New = func() any { return &reqState{} }
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		Name:                  "infera",
		MaxRequestBodySize:    o.Flags.MaxBodyBytes,
		ReadTimeout:           5 * time.Minute,
		WriteTimeout:          0, // streams may last for hours; idle/first-packet are ours
		IdleTimeout:           2 * time.Minute,
		NoDefaultServerHeader: true,
		NoDefaultDate:         false,
		ReduceMemoryUsage:     false,
		ErrorHandler:          s.handleServerError,
		CloseOnShutdown:       true,
	}
	return s
}

// Serve serves connections from ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// Shutdown stops accepting and waits for open requests.
func (s *Server) Shutdown() error { return s.srv.Shutdown() }

// Handler returns the request handler (for tests and embedding).
func (s *Server) Handler() fasthttp.RequestHandler { return s.handle }

func (s *Server) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, typeInvalidRequest,
			"request body exceeds --max-body-bytes ("+strconv.Itoa(s.flags.MaxBodyBytes)+" bytes)", "", "request_too_large")
		return
	}
	writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "cannot parse HTTP request: "+err.Error(), "", "")
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch string(path) {
	case "/v1/chat/completions":
		mReqChat.Inc()
		s.handleInference(ctx, kindChat)
		return
	case "/v1/completions":
		mReqCompletion.Inc()
		s.handleInference(ctx, kindCompletion)
		return
	case "/v1/models":
		if !s.authorized(ctx) {
			return
		}
		s.handleModels(ctx)
		return
	case "/health", "/healthz", "/readyz":
		s.handleHealth(ctx)
		return
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4")
		metrics.WritePrometheus(ctx, true)
		return
	}
	switch string(path) {
	case "/tokenize":
		if s.authorized(ctx) {
			s.handleTokenize(ctx)
		}
		return
	case "/debug/route":
		if s.authorized(ctx) {
			s.handleDebugRoute(ctx)
		}
		return
	}
	if h := s.o.Extra[string(path)]; h != nil {
		if !s.authorized(ctx) {
			return
		}
		h(ctx)
		return
	}
	writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "unknown path "+string(path), "", "")
}

// authorized checks the API key; on failure it writes 401 and returns false.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	key := s.flags.APIKey
	if key == "" {
		return true
	}
	auth := ctx.Request.Header.Peek("Authorization")
	const p = "Bearer "
	if len(auth) == len(p)+len(key) && string(auth[:len(p)]) == p && string(auth[len(p):]) == key {
		return true
	}
	writeError(ctx, fasthttp.StatusUnauthorized, typeAuth, "invalid or missing API key", "", "invalid_api_key")
	return false
}

func (s *Server) handleModels(ctx *fasthttp.RequestCtx) {
	v := s.sched.Fleet.View()
	models := s.sched.Models(s.store.Load(), v)
	b := make([]byte, 0, 64+64*len(models))
	b = append(b, `{"object":"list","data":[`...)
	for i, m := range models {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, m)
		b = append(b, `,"object":"model","created":0,"owned_by":"infera"}`...)
	}
	b = append(b, "]}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (s *Server) handleHealth(ctx *fasthttp.RequestCtx) {
	v := s.sched.Fleet.View()
	ok := len(v.Routable) > 0
	b := make([]byte, 0, 256)
	b = append(b, `{"status":`...)
	names := make([]string, 0, len(s.o.Health))
	for n := range s.o.Health {
		names = append(names, n)
	}
	sort.Strings(names)
	var detail []byte
	for _, n := range names {
		cok, d := s.o.Health[n]()
		detail = append(detail, ',')
		detail = appendJSONString(detail, n)
		detail = append(detail, `:{"ok":`...)
		detail = strconv.AppendBool(detail, cok)
		detail = append(detail, `,"detail":`...)
		detail = appendJSONString(detail, d)
		detail = append(detail, '}')
	}
	if ok {
		b = append(b, `"ok"`...)
	} else {
		b = append(b, `"unavailable"`...)
	}
	b = append(b, `,"workers":{"routable":`...)
	b = strconv.AppendInt(b, int64(len(v.Routable)), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(len(v.All)), 10)
	b = append(b, `,"list":[`...)
	for i, w := range v.All {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, w.ID)
		b = append(b, `,"url":`...)
		b = appendJSONString(b, w.URL)
		b = append(b, `,"draining":`...)
		b = strconv.AppendBool(b, w.Draining())
		b = append(b, `,"breaker":`...)
		b = strconv.AppendInt(b, int64(w.Breaker.State()), 10)
		b = append(b, `,"active_requests":`...)
		b = strconv.AppendInt(b, w.Load.Requests.Load(), 10)
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	if len(detail) > 0 {
		b = append(b, `,"components":{`...)
		b = append(b, detail[1:]...)
		b = append(b, '}')
	}
	b = append(b, '}')
	if !ok {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// reqState is the per-request scratch space, pooled.
type reqState struct {
	body    reqBody
	sreq    sched.Request
	scratch []*fleet.Worker
	tokens  []uint32
	render  []byte
	// fwd is the body forwarded to the engine: the client's bytes, or a
	// copy with the model rewritten (model routing resolved an alias).
	fwd     []byte
	rewrite []byte
	route   []byte
	fail    failure
	msgs    []tokenizer.Message
	arena   []byte // backs msgs' strings (see decodeMessages)
}

func (s *Server) handleInference(ctx *fasthttp.RequestCtx, kind int) {
	if !ctx.IsPost() {
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "use POST", "", "")
		return
	}
	if !s.authorized(ctx) {
		return
	}
	cfg := s.store.Load()
	rs := s.pool.Get().(*reqState)
	defer s.pool.Put(rs)
	body := ctx.PostBody()
	if err := rs.body.parse(body, kind); err != nil {
		mBadRequests.Inc()
		var br *badRequestError
		if errors.As(err, &br) {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, br.msg, br.param, "")
		} else {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "", "")
		}
		return
	}
	r := &rs.sreq
	r.Reset()
	r.Model = rs.body.model
	r.Stream = rs.body.stream
	r.MaxTokens = rs.body.maxTokens
	if r.MaxTokens < 0 {
		r.MaxTokens = s.o.DefaultMaxTokens
	}
	r.PromptTokens = rs.body.estimateTokens()
	r.Prompt = rs.body.text
	if cfg.SessionAffinity.Enabled {
		r.SessionID = ctx.Request.Header.Peek(cfg.SessionAffinity.Header)
		if err := s.sched.CheckSession(cfg, r); err != nil {
			s.writeSchedError(ctx, r, err)
			return
		}
	}
	if s.flags.RouterMode == "direct" {
		r.DirectWorker = ctx.Request.Header.Peek(hdrWorkerID)
		r.DirectPrefill = ctx.Request.Header.Peek(hdrPrefillID)
	}
	if s.o.HashBlocks != nil && s.o.Tokenizer != nil && s.flags.RouterPolicy == "kv-aware" {
		if err := s.hashPrompt(rs, body, kind); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "messages", "")
			return
		}
	}
	s.dispatch(ctx, cfg, rs)
}

// hashPrompt fills r.BlockHashes from the rendered, tokenized prompt.
func (s *Server) hashPrompt(rs *reqState, body []byte, kind int) error {
	if err := s.tokenize(rs, body, kind); err != nil {
		return err
	}
	rs.sreq.PromptTokens = len(rs.tokens)
	rs.sreq.BlockHashes = s.o.HashBlocks(rs.sreq.BlockHashes[:0], rs.tokens, s.o.BlockSize, "")
	return nil
}

// tokenize fills rs.tokens with the prompt's token ids: a token-id prompt
// as is, a chat rendered with the chat template, or the prompt text.
func (s *Server) tokenize(rs *reqState, body []byte, kind int) error {
	b := &rs.body
	rs.tokens = rs.tokens[:0]
	switch {
	case len(b.tokenIDs) > 0:
		rs.tokens = append(rs.tokens, b.tokenIDs...)
	case kind == kindChat:
		msgs, err := decodeMessages(rs.msgs[:0], body[b.msgStart:b.msgEnd], &rs.arena)
		rs.msgs = msgs
		if err != nil {
			return err
		}
		var tools []byte
		if b.toolsEnd > 0 {
			tools = body[b.toolsStart:b.toolsEnd]
		}
		rs.render, err = s.o.Tokenizer.RenderChat(rs.render[:0], msgs, tools, true)
		if err != nil {
			return err
		}
		rs.tokens = s.o.Tokenizer.Encode(rs.tokens, rs.render)
	default:
		rs.tokens = s.o.Tokenizer.Encode(rs.tokens, b.text)
	}
	return nil
}

// Headers consumed by the router and never forwarded.
const (
	hdrWorkerID  = "x-worker-instance-id"
	hdrPrefillID = "x-prefill-instance-id"
)

var hopHeaders = [...]string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Proxy-Authenticate", "Proxy-Authorization"}

func isHopHeader(k []byte) bool {
	for _, h := range hopHeaders {
		if len(k) == len(h) && bytes.EqualFold(k, []byte(h)) {
			return true
		}
	}
	return false
}

var upstreamLog = &logx.Throttle{Every: time.Second}

func logUpstreamError(w *fleet.Worker, err error) {
	upstreamLog.Warn("upstream request failed", "worker", w.ID, "err", err)
}
