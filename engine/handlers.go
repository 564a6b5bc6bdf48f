package engine

import (
	"net"
	"strconv"
	"strings"
	"time"

	"encoding/json"

	"github.com/valyala/fasthttp"
)

const headerEngineID = "X-Infera-Engine-Id"

// Handler is the engine's fasthttp request handler.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set(headerEngineID, s.cfg.ID)
	path := string(ctx.Path())
	switch path {
	case "/v1/chat/completions", "/v1/completions":
		if !ctx.IsPost() {
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST", "invalid_request_error")
			return
		}
		s.handleGenerate(ctx, path == "/v1/chat/completions", nil, nil)
	case "/v1/messages", "/v1/messages/count_tokens", "/v1/responses":
		if !s.cfg.NativeProtocols {
			s.writeError(ctx, fasthttp.StatusNotFound, "unknown path "+strconv.Quote(path), "invalid_request_error")
			return
		}
		if !ctx.IsPost() {
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST", "invalid_request_error")
			return
		}
		s.handleNative(ctx, path)
	case "/v1/embeddings":
		if !ctx.IsPost() {
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST", "invalid_request_error")
			return
		}
		s.handleEmbeddings(ctx) // embeddings.go
	case "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score":
		if !ctx.IsPost() {
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST", "invalid_request_error")
			return
		}
		if path == "/v1/score" || path == "/score" {
			s.handleScore(ctx) // rerank.go
			return
		}
		s.handleRerank(ctx)
	case "/v1/models":
		ctx.SetContentType("application/json")
		ctx.SetBody(s.modelList)
	case "/health":
		ctx.SetContentType("application/json")
		if s.currentFault().Mode == FaultHealthFail {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"status":"unhealthy"}`)
			return
		}
		ctx.SetBodyString(`{"status":"ok"}`)
	case "/admin/stats":
		b, _ := json.Marshal(s.Stats())
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
	case "/metrics":
		s.handleMetrics(ctx)
	case "/admin/fault":
		s.handleFault(ctx)
	case "/admin/clear-cache", "/reset_prefix_cache":
		if !ctx.IsPost() {
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST", "invalid_request_error")
			return
		}
		s.ClearCache()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	default:
		if rest, ok := strings.CutPrefix(path, "/v1/responses/"); ok && s.cfg.NativeProtocols {
			s.handleStoredResponse(ctx, rest) // respstore.go
			return
		}
		s.writeError(ctx, fasthttp.StatusNotFound, "unknown path "+strconv.Quote(path), "invalid_request_error")
	}
}

func (s *Server) writeError(ctx *fasthttp.RequestCtx, status int, msg, typ string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendError(nil, msg, typ))
}

func (s *Server) handleMetrics(ctx *fasthttp.RequestCtx) {
	st := s.Stats()
	id := strconv.Quote(st.ID)
	id = id[1 : len(id)-1]
	b := make([]byte, 0, 1024)
	for _, m := range [...]struct {
		name string
		v    uint64
	}{
		{"requests_total", st.RequestsTotal},
		{"bad_requests_total", st.BadRequests},
		{"faults_injected_total", st.FaultsInjected},
		{"hung_requests", uint64(st.Hung)},
		{"active_requests", uint64(st.Active)},
		{"running_requests", uint64(st.Running)},
		{"queued_requests", uint64(st.Queued)},
		{"completed_total", st.Completed},
		{"aborted_total", st.Aborted},
		{"generated_tokens_total", st.GeneratedTokens},
		{"prompt_tokens_total", st.PromptTokens},
		{"cached_prompt_tokens_total", st.CachedPromptTokens},
		{"steps_total", st.Steps},
		{"kv_blocks_used", uint64(st.CacheBlocksUsed)},
		{"kv_blocks_cached", uint64(st.CacheBlocksCached)},
		{"kv_blocks_capacity", uint64(st.CacheBlocksCap)},
		{"kv_evictions_total", st.Evictions},
		{"kv_waiting_requests", uint64(st.KVWaiting)},
		{"kv_ready_requests", uint64(st.KVReady)},
		{"kv_held_requests", uint64(st.KVHeld)},
		{"pd_rooms", uint64(st.PDRooms)},
		{"pd_transfers_total", st.Transfers},
		{"pd_transfer_failures_total", st.TransferFailures},
		{"pd_transfer_timeouts_total", st.TransferTimeouts},
		{"pd_blocks_transferred_total", st.BlocksTransferred},
	} {
		b = appendPromMetric(b, m.name, id, m.v)
	}
	ctx.SetContentType("text/plain; version=0.0.4")
	ctx.SetBody(b)
}

func (s *Server) handleFault(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	switch {
	case ctx.IsGet():
	case ctx.IsPost():
		f, err := ParseFault(ctx.PostBody())
		if err != nil {
			s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
			return
		}
		s.setFault(f)
	default:
		s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "use GET or POST", "invalid_request_error")
		return
	}
	b, _ := json.Marshal(s.currentFault().Fault)
	ctx.SetBody(b)
}

// handleGenerate serves a chat or completion request. nat, when set, wraps
// a chat stream into the client protocol of a native endpoint (native.go).
// stop, when not nil, aborts a non-streamed generation when closed (a
// cancelled background Response, background.go), as its client leaving
// does.
func (s *Server) handleGenerate(ctx *fasthttp.RequestCtx, chat bool, nat *nativeStream, stop <-chan struct{}) {
	s.requests.Add(1)
	sq := newSeq()
	var (
		g   genRequest
		err error
	)
	if chat {
		g, sq.req.Prompt, _, err = parseChat(ctx.PostBody(), s.tok, nil, nil)
	} else {
		g, sq.req.Prompt, err = parseCompletion(ctx.PostBody(), s.tok, nil)
	}
	if err != nil {
		s.badRequests.Add(1)
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
		return
	}
	model := g.model
	if model == "" {
		model = s.cfg.Models[0]
	}
	modelJSON, ok := s.models[model]
	if !ok { // not a malformed request: infera_engine_bad_requests_total counts 400s
		s.writeError(ctx, fasthttp.StatusNotFound, "The model `"+model+"` does not exist.", "invalid_request_error")
		return
	}
	if len(sq.req.Prompt) == 0 {
		s.badRequests.Add(1)
		s.writeError(ctx, fasthttp.StatusBadRequest, "prompt encodes to zero tokens", "invalid_request_error")
		return
	}
	sq.req.MaxTokens = g.maxTokens
	if sq.req.MaxTokens == 0 {
		sq.req.MaxTokens = s.cfg.DefaultMaxTokens
	}
	plan, maxTokens := s.plan(&g, sq.req.MaxTokens) // answer.go
	sq.req.MaxTokens = maxTokens
	var pdf pdFields
	if s.pd != nil {
		if pdf, err = s.pdRequest(sq, g, ctx.PostBody()); err != nil {
			s.badRequests.Add(1)
			s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
			return
		}
	}

	closeAfter := -1
	if f := s.currentFault(); f.Mode == FaultError || f.Mode == FaultHang || f.Mode == FaultCloseMidStream {
		if f.hits() {
			s.faultsInjected.Add(1)
			switch f.Mode {
			case FaultError:
				s.writeError(ctx, f.Status, "fault injection: engine error", "server_error")
				return
			case FaultHang:
				if !s.hang(ctx, f) {
					return // client left or shutdown
				}
			case FaultCloseMidStream:
				closeAfter = f.AfterTokens
			}
		}
	}

	sq.everyToken = g.stream || closeAfter >= 0
	if s.pd != nil && s.pd.cfg.Role == RolePrefill && s.pd.cfg.Mode == PDSGLang {
		if !s.prefillSGLang(ctx, sq, pdf) {
			return
		}
	} else {
		if err := s.submit(sq); err != nil {
			s.badRequests.Add(1)
			s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
			return
		}
		if sq.req.Transfer != TransferNone && !s.receiveKV(ctx, sq, pdf) {
			return
		}
	}

	id := s.idBase + s.idSeq.Add(1)
	idPrefix, object := "cmpl-", "text_completion"
	if chat {
		idPrefix, object = "chatcmpl-", "chat.completion"
	}
	created := time.Now().Unix()
	if plan.tool != nil {
		plan.toolID = "call_" + strconv.FormatUint(id, 16)
	}
	var planned *answerPlan
	if plan.active() {
		planned = &plan
	}

	if g.stream {
		if chat {
			object = "chat.completion.chunk"
		}
		t := &tokenStream{
			srv: s, sq: sq, chat: chat,
			head:         appendHead(nil, idPrefix, id, object, created, modelJSON),
			includeUsage: g.includeUsage,
			continuous:   g.continuousUsage,
			promptTokens: len(sq.req.Prompt),
			plan:         planned,
			closeAfter:   closeAfter,
			conn:         ctx.Conn(),
		}
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.Response.ImmediateHeaderFlush = true
		if nat != nil {
			nat.t = t
			ctx.SetBodyStream(nat, -1)
			return
		}
		ctx.SetBodyStream(t, -1)
		return
	}

	// Non-streaming: wait for the end (or the close-mid-stream point),
	// dropping the request if the client closes its connection meanwhile.
	conn := ctx.Conn()
	check := time.NewTicker(peerCheckInterval)
	defer check.Stop()
	for {
		done := sq.done.Load() // before the count: a done sequence's count is final
		n := int(sq.tokens.Load())
		if closeAfter >= 0 && n >= closeAfter {
			// Cut, also when the sequence finished before this handler
			// looked (a finished sequence is not aborted: it completed).
			s.abort(sq)
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(c net.Conn) { _ = c.Close() })
			return
		}
		if done {
			break
		}
		select {
		case <-sq.notify:
		case <-check.C:
			if peerClosed(conn) {
				s.abort(sq)
				ctx.SetConnectionClose()
				return
			}
		case <-stop:
			s.abort(sq)
			s.writeError(ctx, fasthttp.StatusServiceUnavailable, "generation cancelled", "server_error")
			return
		case <-s.stop:
			s.abort(sq)
			s.writeError(ctx, fasthttp.StatusServiceUnavailable, "engine shutting down", "server_error")
			return
		}
	}
	n := int(sq.tokens.Load())
	head := appendHead(nil, idPrefix, id, object, created, modelJSON)
	var body []byte
	if planned != nil {
		body = planned.appendFull(make([]byte, 0, 512+n*8), head, n, len(sq.req.Prompt), sq.req.CachedTokens)
	} else {
		body = appendFullResponse(make([]byte, 0, 384+n*8), chat, head, n, len(sq.req.Prompt), sq.req.CachedTokens)
	}
	if sq.req.HoldKV && s.pd.cfg.Mode == PDVLLM {
		// A vLLM prefill: its blocks wait for the decode engine's read.
		if body = s.holdForRead(sq, body, idPrefix, id); body == nil {
			s.writeError(ctx, fasthttp.StatusServiceUnavailable, "engine shutting down", "server_error")
			return
		}
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// hang holds a request without answering until the hang fault is replaced
// (true: go on serving it) or the client goes away or the engine stops
// (false: drop it).
func (s *Server) hang(ctx *fasthttp.RequestCtx, f *faultState) bool {
	s.hung.Add(1)
	defer s.hung.Add(-1)
	conn := ctx.Conn()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-s.stop:
			ctx.SetConnectionClose()
			return false
		}
		if s.currentFault() != f {
			return true
		}
		if peerClosed(conn) {
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(c net.Conn) { _ = c.Close() })
			return false
		}
	}
}
