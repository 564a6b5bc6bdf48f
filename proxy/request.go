package proxy

import (
	"errors"
	"io"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/jinja"
	"github.com/infera/infera/mirror"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// reqState is everything one request holds, pooled (fasthttp's
// Acquire/Release discipline): it is taken when an inference request
// arrives and released exactly once, by the handler when the response is
// written in full, or by the relay when a streamed body ends.
type reqState struct {
	body     []byte // the request body, read by readBody
	reserved int64  // body bytes reserved in the in-flight budget
	parsed   reqBody
	sreq     sched.Request
	lease    sched.Lease
	call     call
	scratch  []*fleet.Worker
	start    time.Time
	ttft     time.Duration // request start to the first response bytes
	dur      time.Duration // request start to the answer's end, once known
	usage    usage

	// kv-aware prompt rendering.
	tokens []uint32
	render []byte
	msgs   []tokenizer.Message
	arena  []byte // backs msgs' strings (see decodeMessages)
	// tokCut of tokText bytes were tokenized (--router-tokenize-max-bytes);
	// tokSkip: the prompt was too costly to tokenize at all.
	tokCut, tokText int
	tokSkip         bool

	// fwd is the body forwarded to the engine: the client's bytes, or a copy
	// with the model rewritten (model routing resolved an alias).
	fwd     []byte
	rewrite []byte
	route   []byte
	hdr     []byte // forwarded header block
	path    []byte // canonical path + query

	rbuf       []byte // response read buffer (first chunk, then the relay's)
	scratchOut []byte
	// The last error answer of a worker the request was retried away from.
	errStatus        int
	errBody, errType []byte
	errRetry         [len(retryHeaders)][]byte // the stashed answer's retryHeaders
	// errFrom is the PD prefill worker whose answer is stashed (nil: the
	// worker of rs.acc.tried, a mixed worker or decode leg, answered it).
	errFrom *fleet.Worker

	// Split proxy, global scheduling, smart model selection (external.go).
	ext extState

	// The protocol front door: conversion, passthrough, stream usage
	// (protocols.go).
	proto protoState

	// Users, quotas and concurrency seats (govern.go).
	gov govState

	// The request id (accesslog.go) and the access log's view.
	reqID   []byte
	acc     accessEntry
	accLine []byte

	live      liveSlot // the liveness watchdog's view (liveness.go)
	watched   bool     // under the watchdog (the request goroutine's view)
	handedOff bool
}

// Reset clears rs for reuse, keeping buffers. Large request bodies are not
// kept: they would pin memory after a burst of big requests.
func (rs *reqState) Reset() {
	if cap(rs.body) > 256<<10 {
		rs.body = nil
	}
	rs.body = rs.body[:0]
	rs.reserved = 0
	rs.parsed.reset()
	rs.sreq.Reset()
	rs.lease.Reset()
	rs.call = call{}
	rs.scratch = rs.scratch[:0]
	rs.usage.reset()
	// A burst of big prompts must not pin memory in the pool either.
	rs.tokens, rs.render, rs.arena = trimIDs(rs.tokens), trimBuf(rs.render), trimBuf(rs.arena)
	if rs.msgs = rs.msgs[:0]; cap(rs.msgs) > maxRouteMessages {
		rs.msgs = nil
	}
	rs.tokCut, rs.tokText, rs.tokSkip = 0, 0, false
	rs.fwd, rs.rewrite, rs.route, rs.hdr, rs.path = nil, trimBuf(rs.rewrite), rs.route[:0], rs.hdr[:0], rs.path[:0]
	rs.scratchOut = trimBuf(rs.scratchOut)
	rs.errStatus, rs.errBody, rs.errType = 0, trimBuf(rs.errBody), rs.errType[:0] // a prefill's error answer may reach pdMaxAnswer
	rs.errFrom = nil
	for i := range rs.errRetry {
		rs.errRetry[i] = rs.errRetry[i][:0]
	}
	rs.ext.reset()
	rs.proto.reset()
	rs.gov.reset()
	rs.watched, rs.handedOff = false, false
	rs.reqID, rs.acc, rs.ttft, rs.dur = rs.reqID[:0], accessEntry{}, 0, 0
}

func (s *Server) acquireState() *reqState {
	s.states.n.Add(1)
	return s.pool.Get().(*reqState)
}

// releaseState returns rs: its body memory goes back to the budget. end
// tells how the answer ended, for the access log.
func (s *Server) releaseState(rs *reqState, end string) {
	if rs.lease.Held() {
		panic("BUG: request state released while its lease is held")
	}
	s.live.remove(rs)                    // whatever path ended it: the watchdog must not abort a pooled state
	rs.gov.end(&rs.usage, rs.call.wrote) // the request is over: its ticket ends here, once
	countModel(rs)                       // modelmetrics.go
	if rs.acc.on {
		s.logAccess(rs, end)
	}
	if s.debug {
		s.logDebugRequest(rs, end) // debuglog.go
	}
	s.bodies.release(rs.reserved)
	rs.Reset()
	s.pool.Put(rs)
	s.states.n.Add(-1)
}

// bodyBudget bounds the request body memory held by all requests at once
// (--max-inflight-body-bytes). Bytes are reserved as they arrive, never
// from an announced Content-Length, so a client that announces a large
// body and sends nothing holds nothing.
type bodyBudget struct {
	limit int64
	used  atomic.Int64
}

func (b *bodyBudget) reserve(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *bodyBudget) release(n int64) {
	if n != 0 {
		b.used.Add(-n)
	}
}

var (
	errBodyTooLarge = errors.New("request body too large")
	errBodyBudget   = errors.New("in-flight request body memory exhausted")
)

// readBody reads the request body into rs.body incrementally: memory grows
// with the bytes that actually arrive, within --max-body-bytes and the
// in-flight budget, and a client that stops sending is cut at
// --body-timeout. A chunked body's trailer fields are dropped
// (dropTrailers), those read before an error too: no header the router
// reads after the body comes from them.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, rs *reqState) error {
	chunked := ctx.Request.Header.ContentLength() == -1
	err := s.readBodyBytes(ctx, rs)
	if chunked {
		dropTrailers(&ctx.Request.Header)
	}
	return err
}

// readBodyBytes is readBody's reading.
func (s *Server) readBodyBytes(ctx *fasthttp.RequestCtx, rs *reqState) error {
	h := &ctx.Request.Header
	cl := h.ContentLength() // -1 chunked, -2 none
	limit := int64(s.flags.MaxBodyBytes)
	if cl == -2 || cl == 0 {
		return nil
	}
	if int64(cl) > limit {
		return errBodyTooLarge
	}
	r := ctx.RequestBodyStream()
	if r == nil {
		b := ctx.Request.Body()
		if int64(len(b)) > limit {
			return errBodyTooLarge
		}
		if !s.bodies.reserve(int64(len(b))) {
			return errBodyBudget
		}
		rs.reserved += int64(len(b))
		rs.body = append(rs.body[:0], b...)
		return nil
	}
	if cl < 0 || cl > 8<<10 {
		// More than fasthttp pre-read: the rest comes from the client now,
		// under --body-timeout (0: its default, as --header-timeout 0 is
		// its own; the head's deadline would otherwise still cut the body).
		t := s.flags.BodyTimeout
		if t <= 0 {
			t = 60 * time.Second
		}
		ctx.Conn().SetReadDeadline(time.Now().Add(t))
	}
	const step = 32 << 10
	buf := rs.body[:0]
	for {
		if len(buf) == cap(buf) {
			// Grow by what may still arrive (one byte more than allowed or
			// announced, to notice a longer body), doubling, so that a large
			// body is copied O(n) times in all (fixed steps cost a 31 MB
			// body 8 CPU-seconds of copying).
			want := max(int64(step), int64(cap(buf)))
			if cl > 0 {
				want = min(want, int64(cl)+1-int64(len(buf)))
			}
			if cap(buf) == 0 {
				want = max(want, 16<<10) // one size serves most requests: no growth later
			}
			want = max(1, min(want, limit+1-int64(len(buf))))
			nb := make([]byte, len(buf), cap(buf)+int(want))
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		if n > 0 {
			// The budget counts the bytes that arrived (a buffer is at most
			// twice as large), never an announced length.
			if !s.bodies.reserve(int64(n)) {
				rs.body = buf
				return errBodyBudget
			}
			rs.reserved += int64(n)
		}
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit || (cl > 0 && len(buf) > cl) {
			rs.body = buf
			return errBodyTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			rs.body = buf
			if c, ok := ctx.Conn().(*clientConn); ok {
				// fasthttp's chunk errors do not unwrap: the connection tells.
				if c.wireSpent() {
					return errBodyTooLarge // its chunk framing (handle)
				}
				if c.wireTimeout() {
					return os.ErrDeadlineExceeded // --body-timeout in the chunk framing
				}
			}
			return err
		}
	}
	rs.body = buf
	return nil
}

// writeBodyError answers a request whose body readBody did not deliver
// (err): 413 over --max-body-bytes, 503 when the in-flight body memory is
// exhausted, 408 past --body-timeout, else 400. The connection is closed
// after the answer; the rest of a body on its way is read and discarded
// first (a lingering close), so the client can finish sending and read it.
func (s *Server) writeBodyError(ctx *fasthttp.RequestCtx, err error) {
	ctx.SetConnectionClose()
	if err == errBodyTooLarge || err == errBodyBudget {
		closeUnread(ctx) // the rest of the body is on its way (not a slow client's)
	}
	switch err {
	case errBodyTooLarge:
		mBadRequests.Inc()
		s.writeBodyTooLarge(ctx)
	case errBodyBudget:
		mBodyBudget.Inc()
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, "the router is out of request body memory; retry later", "", "overloaded")
	default:
		mBadRequests.Inc()
		if isTimeout(err) {
			writeError(ctx, fasthttp.StatusRequestTimeout, typeInvalidRequest, "request body not received within --body-timeout", "", "request_timeout")
			break
		}
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "request body not received", "", "bad_request")
	}
}

// answered finishes an inference request's answer, whoever wrote it (the
// handler, or handleExpect's 413 before any body): every answer carries
// the request id (and smart model selection's tier with the decision
// header on), the access log learns the status (a relayed body follows,
// its head is written), and the state is released unless a relay took it.
func (s *Server) answered(ctx *fasthttp.RequestCtx, rs *reqState) {
	ctx.Response.Header.SetCanonical(hdrRequestIDBytes, rs.reqID)
	if rs.ext.tierHeader { // smart.go: a refusal or failure of the tier's model says which tier too
		ctx.Response.Header.Set("X-Infera-Tier", rs.ext.tier.String())
	}
	if rs.acc.kind == kindMessages || rs.acc.kind == kindCountTokens {
		// Anthropic's own header, which its SDKs expose as the
		// answer's _request_id.
		ctx.Response.Header.SetCanonical(hdrAnthropicRequestID, rs.reqID)
		if !rs.handedOff && ctx.Response.StatusCode() >= 400 {
			addAnthropicRequestID(&ctx.Response, rs.reqID)
		}
	}
	if rs.gov.lim.Any() {
		rs.gov.rlBuf = setRateLimitHeaders(ctx, &rs.gov.lim, rs.gov.rlBuf)
	}
	rs.acc.status = ctx.Response.StatusCode()
	if s.debug {
		rs.acc.noteMethod(ctx.Method()) // debuglog.go
	}
	if s.access != nil {
		rs.acc.on, rs.acc.client = true, s.clientIP(ctx)
	}
	if (s.access != nil || s.debug) && rs.acc.status >= 400 && !rs.handedOff {
		rs.acc.noteErrorCode(ctx.Response.Body())
	}
	if !rs.handedOff {
		end := endComplete
		if rs.acc.status == 499 { // the client left before the answer
			end = endClientGone
		} else if rs.acc.failed {
			end = endUpstreamErr
		}
		s.releaseState(rs, end)
	}
}

func (s *Server) handleInference(ctx *fasthttp.RequestCtx, kind int) {
	rs := s.acquireState()
	rs.start = time.Now()
	takeRequestID(ctx, rs)
	rs.acc.kind = kind // the client's endpoint (a front door changes kind)
	// uncounted marks an answer of the router's own written here, before
	// dispatch: infera_responses_total{class} learns it in the defer (the
	// dispatch and protocol paths count theirs).
	//
	// The request's work is in serveInference, so that this function has
	// one return and its defer is open-coded (a defer in a function with
	// many returns goes through the runtime's defer records, for every
	// request).
	uncounted := false
	defer func() {
		if uncounted {
			countStatus(ctx.Response.StatusCode())
		}
		s.answered(ctx, rs)
	}()
	uncounted = s.serveInference(ctx, rs, kind)
}

// serveInference serves the inference request rs holds (handleInference
// answers it when this returns, or panics): it reports an answer of the
// router's own written before dispatch, which the responses counter has
// not counted (uncounted).
func (s *Server) serveInference(ctx *fasthttp.RequestCtx, rs *reqState, kind int) (uncounted bool) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "use POST", "POST")
		return true
	}
	if refuseHTTP10(ctx) {
		return true
	}
	user, ok := s.authenticate(ctx) // a refusal closes the connection, the body unread
	if !ok {
		return true
	}
	rs.gov.user = user
	if err := s.readBody(ctx, rs); err != nil {
		s.writeBodyError(ctx, err)
		return true
	}
	if user != nil && s.gov.Stale(user) {
		// A reload while the body arrived: the key is checked again, as a
		// new request's (its user may be disabled, removed, or limited
		// otherwise now).
		if user, ok = s.authenticate(ctx); !ok {
			return true
		}
		rs.gov.user = user
	}
	cfg := s.store.Load()
	// Protocol front doors, reasoning mode (protocols.go): body is what
	// routing parses, kind how; pathKind names the engine's path.
	body, kind, pathKind, ok := s.frontDoor(ctx, cfg, rs, kind)
	if !ok {
		return false
	}
	err := rs.parsed.parse(body, kind)
	if mr := &cfg.ModelRouting; err == errNoModel && mr.Enabled && mr.DefaultModel != "" && sameSlice(body, rs.body) {
		// The default model serves a request without one: the body gets it,
		// so access control, routing, the engine and the logs all see it.
		// (Not in passthrough, where the engine gets the client's own body.)
		out := insertModel(make([]byte, 0, len(body)+len(mr.DefaultModel)+16), body, rs.parsed.objStart, mr.DefaultModel)
		if !s.swapBody(ctx, rs, out) {
			return false
		}
		body = out
		err = rs.parsed.parse(body, kind)
	}
	if err != nil {
		mBadRequests.Inc()
		var br *badRequestError
		if errors.As(err, &br) {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, br.msg, br.param, "")
		} else {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "malformed request body", "", "")
		}
		return true
	}
	if u := rs.gov.user; u != nil && !s.allowsModel(cfg, u, rs.parsed.model) { // docs/governance.md#models-a-user-may-call
		mModelNotAllowed.Inc()
		writeError(ctx, fasthttp.StatusForbidden, typePermission, notAllowedModel(rs.parsed.model), "model", "model_not_allowed")
		return true
	}
	if body, ok = s.afterParse(ctx, cfg, rs, body, kind); !ok { // streaming usage (protocols.go)
		return false
	}
	r := &rs.sreq
	r.Model = rs.parsed.model
	r.Stream = rs.parsed.stream
	r.MaxTokens = rs.parsed.maxTokens
	r.PromptTokens = rs.parsed.estimateTokens()
	r.Prompts = rs.parsed.prompts
	r.Prompt = rs.parsed.text
	if len(r.Prompt) == 0 && len(rs.parsed.tokenIDs) > 0 {
		rs.parsed.idText = sched.AppendTokenPrompt(rs.parsed.idText[:0], rs.parsed.tokenIDs)
		r.Prompt = rs.parsed.idText
	}
	r.LoadOnly = poolingKind(kind) // no prefix cache to follow (embeddings.go)
	if cfg.SessionAffinity.Enabled {
		r.SessionID = ctx.Request.Header.Peek(cfg.SessionAffinity.Header)
		if err := s.sched.CheckSession(cfg, r); err != nil {
			s.writeSchedError(ctx, r, err)
			return false
		}
	}
	if s.mode == sched.ModeDirect {
		r.DirectWorker = ctx.Request.Header.Peek(hdrWorkerID)
		r.DirectPrefill = ctx.Request.Header.Peek(hdrPrefillID)
	}
	if s.o.HashBlocks != nil && s.o.Tokenizer != nil && s.policy == sched.PolicyKVAware && !poolingKind(kind) {
		if err := s.hashPrompt(rs, body, kind); err != nil {
			mBadRequests.Inc()
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "messages", "")
			return true
		}
	}
	if !s.admit(ctx, cfg, rs) { // user limits (govern.go), before anything is spent on the request
		return false
	}
	if len(rs.proto.prev) > 0 && !s.previousShared(ctx, rs) { // after the admission (respshared.go)
		return false
	}
	if cfg.SmartModelSelection.Enabled && !poolingKind(kind) {
		asked := s.selectModel(cfg, rs) // smart.go: may change r.Model before model routing
		if asked {
			// The classifier took up to timeout_ms: a client that left
			// meanwhile is not sent to an engine (it was, and cancelled
			// only once the liveness watchdog noticed).
			if fd, tls := clientFD(ctx); fd >= 0 && clientLeft(fd, tls) {
				dropClient(ctx)
				return false
			}
		}
		if u := rs.gov.user; u.LimitsModels() && rs.ext.model != "" && !s.allowsModel(cfg, u, r.Model) {
			// The tier's model is outside the user's list (its admission is
			// refunded when the request state is released: nothing served).
			mModelNotAllowed.Inc()
			writeError(ctx, fasthttp.StatusForbidden, typePermission, notAllowedModel(r.Model)+" (chosen by smart model selection)", "model", "model_not_allowed")
			return false
		}
	}
	if cfg.Mirror.Enabled && s.o.Mirror != nil && len(ctx.Request.Header.Peek(mirror.MirrorHeader)) == 0 {
		// The body the engine gets, at its path (smart selection rewrites a
		// copy; protocols.go may have converted it). A mirrored copy (from
		// this gateway's mirror or another's) is never mirrored again: two
		// gateways mirroring to each other do not bounce copies.
		s.o.Mirror.Offer(&cfg.Mirror, canonicalPath(pathKind), rs.body, rs.reqID, r.Stream)
	}
	rs.path = appendCanonicalPath(rs.path[:0], pathKind, ctx.URI().QueryString())
	s.dispatch(ctx, cfg, rs)
	return false
}

var (
	pathChat        = []byte("/v1/chat/completions")
	pathCompletion  = []byte("/v1/completions")
	pathMessages    = []byte("/v1/messages")
	pathCountTokens = []byte("/v1/messages/count_tokens")
	pathResponses   = []byte("/v1/responses")
	pathEmbeddings  = []byte("/v1/embeddings")
	pathRerank      = []byte("/v1/rerank")
	pathScore       = []byte("/v1/score")
)

// canonicalPath is the endpoint's path.
func canonicalPath(kind int) []byte {
	switch kind {
	case kindChat:
		return pathChat
	case kindMessages:
		return pathMessages
	case kindCountTokens:
		return pathCountTokens
	case kindResponses:
		return pathResponses
	case kindEmbeddings:
		return pathEmbeddings
	case kindRerank:
		return pathRerank
	case kindScore:
		return pathScore
	case kindResponseGet:
		return pathResponseGet
	case kindResponseCancel:
		return pathResponseCancel
	}
	return pathCompletion
}

// appendCanonicalPath appends the endpoint's canonical path plus the query:
// the engine never sees the client's raw request target.
func appendCanonicalPath(dst []byte, kind int, query []byte) []byte {
	dst = append(dst, canonicalPath(kind)...)
	if len(query) > 0 {
		dst = append(dst, '?')
		for _, c := range query {
			if c > ' ' && c < 0x7f && c != '#' {
				dst = append(dst, c)
			}
		}
	}
	return dst
}

// hashPrompt fills r.BlockHashes from the rendered, tokenized prompt.
func (s *Server) hashPrompt(rs *reqState, body []byte, kind int) error {
	if err := s.tokenize(rs, body, kind); err != nil {
		return err
	}
	if rs.tokSkip {
		return nil // routed without block hashes; PromptTokens stays the estimate
	}
	rs.sreq.PromptTokens = rs.promptTokens()
	lora := ""
	if s.o.IsLora != nil {
		lora = s.o.IsLora(rs.sreq.Model) // an adapter's blocks are its own, never the base model's
	}
	rs.sreq.BlockHashes = s.o.HashBlocks(rs.sreq.BlockHashes[:0], rs.tokens, s.o.BlockSize, lora)
	return nil
}

// maxRouteMessages bounds the chat messages rendered for routing: a
// template costs 15-20 us a message, and a 32 MiB body holds a million
// small ones.
const maxRouteMessages = 1024

// maxRouteElems bounds the tool calls of the rendered messages (and their
// content parts, for a template that gets contents as parts), and the
// tools, for routing: the template builds objects for each (kilobytes
// for a 40-byte call), so a body of many small ones would cost far more
// than its size. Past it the chat is not tokenized (rs.tokSkip).
const maxRouteElems = 1024

var errTooManyElems = errors.New("too many elements to render for routing")

// rendersParts reports whether t's chat template gets message contents as
// lists of parts (tokenizer.HF.RendersContentParts).
func rendersParts(t tokenizer.Tokenizer) bool {
	p, ok := t.(interface{ RendersContentParts() bool })
	return ok && p.RendersContentParts()
}

// elems counts the elements of the array at d[i], up to limit+1 (it
// stops there).
func elems(d []byte, i, limit int) int {
	n := 0
	forEachElem(d, i, func(int, int) error {
		if n++; n > limit {
			return errTooManyElems
		}
		return nil
	})
	return n
}

// tokenize fills rs.tokens with the prompt's token ids: a token-id prompt
// as is, a chat rendered with the chat template, or the prompt text. Within
// --router-tokenize-max-bytes: a chat renders only the leading messages
// whose contents fill it (and at most maxRouteMessages in any case); a chat
// whose tools alone exceed it, or whose leading messages the template
// refuses, is not tokenized (rs.tokSkip).
func (s *Server) tokenize(rs *reqState, body []byte, kind int) error {
	b := &rs.parsed
	rs.tokens = rs.tokens[:0]
	switch {
	case len(b.tokenIDs) > 0:
		rs.tokens = append(rs.tokens, b.tokenIDs...)
		// Past maxRouteIDs only the leading ids were kept: the count is
		// the whole prompt's (promptTokens scales by these two).
		rs.tokCut, rs.tokText = len(b.tokenIDs), b.promptTokens
	case kind == kindChat:
		limit := s.o.Flags.RouterTokenizeMaxBytes
		f, ok := b.chatFields(body)
		if !ok || limit > 0 && len(f.Tools)+len(f.Documents)+len(f.Kwargs) > limit ||
			len(f.Tools) > 0 && elems(f.Tools, 0, maxRouteElems) > maxRouteElems {
			rs.tokSkip = true
			mTokenizeCut.Inc()
			return nil
		}
		arr := body[b.msgStart:b.msgEnd]
		k, part, whole := routeMessages(arr, b.msgSpans, b.restSize, limit)
		calls := 0
		parts := rendersParts(s.o.Tokenizer)
		for i := range b.msgSpans[:k] {
			if c := b.msgSpans[i].toolCalls; c.e > c.s && arr[c.s] == '[' {
				if calls += elems(arr, c.s, maxRouteElems-calls); calls > maxRouteElems {
					rs.tokSkip = true
					mTokenizeCut.Inc()
					return nil
				}
			}
			// A template that loops over contents gets an object per
			// content part, as per tool call.
			if c := b.msgSpans[i].content; parts && c.e > c.s && arr[c.s] == '[' {
				if calls += elems(arr, c.s, maxRouteElems-calls); calls > maxRouteElems {
					rs.tokSkip = true
					mTokenizeCut.Inc()
					return nil
				}
			}
		}
		all := k == len(b.msgSpans) && b.restSize == 0
		rs.msgs = decodeMessages(rs.msgs[:0], arr, b.msgSpans[:k], &rs.arena, parts)
		var err error
		// As the engine renders it: the generation prompt unless the chat
		// turns it off or continues its final message (then cut after it).
		rs.render, err = tokenizer.RenderChatFields(s.o.Tokenizer, rs.render[:0], rs.msgs, f, all && !b.noGenPrompt && !b.continueFinal)
		if err == nil && all && b.continueFinal && len(rs.msgs) > 0 {
			rs.render = tokenizer.ContinueFinalMessage(rs.render, tokenizer.FinalContent(s.o.Tokenizer, &rs.msgs[len(rs.msgs)-1]))
		}
		if err != nil {
			// A part the template wants whole, or a render the router's
			// own bounds stopped (the engine renders it with its own):
			// routed without block hashes. A whole conversation the
			// template refuses (a raise_exception) is the client's error.
			if !all || jinja.IsLimit(err) {
				rs.tokSkip = true
				mTokenizeCut.Inc()
				return nil
			}
			return err
		}
		if b.addSpecial == 't' {
			// The client's add_special_tokens: the engine encodes the
			// rendered chat between the tokenizer's special tokens too.
			rs.tokens = tokenizer.AppendPromptPrefix(s.o.Tokenizer, rs.tokens)
			rs.tokens = s.encodeLeading(rs, rs.render)
			if all && rs.tokCut == rs.tokText {
				rs.tokens = tokenizer.AppendPromptSuffix(s.o.Tokenizer, rs.tokens)
			}
		} else {
			rs.tokens = s.encodeLeading(rs, rs.render)
		}
		if !all {
			// The rest of the conversation renders about like its part.
			if rs.tokCut == rs.tokText {
				mTokenizeCut.Inc()
			}
			rs.tokText = int(int64(rs.tokText) * int64(whole) / int64(max(part, 1)))
		}
	default:
		// As the engine encodes a prompt: after the tokenizer's special
		// tokens (a BOS), if it adds any, unless the client's
		// add_special_tokens is false.
		if b.addSpecial != 'f' {
			rs.tokens = tokenizer.AppendPromptPrefix(s.o.Tokenizer, rs.tokens)
		}
		rs.tokens = s.encodeLeading(rs, b.text)
		if b.addSpecial != 'f' && rs.tokCut == rs.tokText && b.prompts == 1 {
			// And after them (an EOS), when the prompt was encoded whole.
			rs.tokens = tokenizer.AppendPromptSuffix(s.o.Tokenizer, rs.tokens)
		}
	}
	return nil
}

// maxKwargsDepth bounds the nesting of a chat_template_kwargs, and of
// documents, rendered for routing (their values, at most maxRouteElems,
// are bounded too).
const maxKwargsDepth = 16

// chatFields returns the fields of the chat body d (which b was parsed
// from) that its template reads besides the messages (chatFieldsOf).
func (b *reqBody) chatFields(d []byte) (tokenizer.ChatFields, bool) {
	var tools, docs, kw []byte
	if b.toolsEnd > 0 {
		tools = d[b.toolsStart:b.toolsEnd]
	}
	if b.auxEnd > 0 {
		docs = d[b.auxStart:b.auxEnd]
	}
	if b.kwEnd > 0 {
		kw = d[b.kwStart:b.kwEnd]
	}
	f, ok := chatFieldsOf(tools, docs, kw)
	if b.effortEnd > 0 {
		f.ReasoningEffort = reasoningEffort(d[b.effortStart:b.effortEnd])
	}
	return f, ok
}

// reasoningEffort returns the reasoning_effort value v (raw JSON) as vLLM
// accepts it, or "" for null and for values vLLM refuses (it answers 400:
// no prompt to match).
// The string is decoded first, as the engine reads it: "\u006cow" is "low".
func reasoningEffort(v []byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	raw := v[1 : len(v)-1]
	var buf [16]byte
	if hasEscape(raw) {
		if len(raw) > len(buf) {
			return ""
		}
		raw = unescape(buf[:0], raw)
	}
	switch string(raw) {
	case "none":
		return "none"
	case "minimal":
		return "minimal"
	case "low":
		return "low"
	case "medium":
		return "medium"
	case "high":
		return "high"
	case "xhigh":
		return "xhigh"
	case "max":
		return "max"
	}
	return ""
}

// chatFieldsOf returns a chat's tools, documents and chat_template_kwargs
// values (nil when absent) as vLLM passes them to the template: tools and
// documents when they are arrays, chat_template_kwargs when it is not null.
// ok is false when the router cannot render the chat as the engine would:
// chat_template_kwargs is not an object, names a key with an escape, a
// template of its own, or apply_chat_template's tokenize or conversation
// (or the messages: transformers refuses them twice; a
// continue_final_message there is the request's own, which vLLM merges
// over it), or holds more than maxRouteElems values or nests
// deeper than maxKwargsDepth; or documents hold more than maxRouteElems
// values or nest deeper than maxKwargsDepth (the template gets an object
// for each value: 256 KB of [{"text":[0,0,...]}] cost 54 MB and 90 ms of
// routing, 218 times the body).
func chatFieldsOf(tools, docs, kw []byte) (f tokenizer.ChatFields, ok bool) {
	if len(tools) > 0 && tools[0] == '[' {
		f.Tools = tools
	}
	n := 0
	if len(docs) > 0 && docs[0] == '[' {
		f.Documents = docs
		if !countValues(docs, 0, 0, &n) {
			return f, false
		}
		n = 0
	}
	if len(kw) == 0 || kw[0] == 'n' {
		return f, true
	}
	f.Kwargs = kw
	if kw[0] != '{' {
		return f, false
	}
	_, err := forEachField(kw, 0, func(key []byte, vs, ve int) error {
		switch string(key) {
		case "chat_template":
			if kw[vs] == 'n' {
				break // the model's template, as without it
			}
			return errTooManyElems
		case "tokenize", "conversation", "messages":
			return errTooManyElems
		}
		if hasEscape(key) || !countValues(kw, vs, 1, &n) {
			return errTooManyElems
		}
		return nil
	})
	return f, err == nil
}

// countValues adds the JSON value at d[i], and the values nested in it, to
// *n; false when *n passes maxRouteElems or the value nests deeper than
// maxKwargsDepth.
func countValues(d []byte, i, depth int, n *int) bool {
	if *n++; *n > maxRouteElems || depth > maxKwargsDepth {
		return false
	}
	var err error
	switch d[i] {
	case '{':
		_, err = forEachField(d, i, func(_ []byte, vs, _ int) error {
			if !countValues(d, vs, depth+1, n) {
				return errTooManyElems
			}
			return nil
		})
	case '[':
		_, err = forEachElem(d, i, func(vs, _ int) error {
			if !countValues(d, vs, depth+1, n) {
				return errTooManyElems
			}
			return nil
		})
	}
	return err == nil
}

// routeMessages returns how many leading messages of the messages array d
// to render: those whose contents fill limit bytes (all the parse located
// when limit <= 0; it locates at most maxRouteMessages), ending on a user
// message when some are left out, with the sizes (msgSpan.size) of their
// part and of the whole; rest is the size of the messages the parse did
// not locate.
func routeMessages(d []byte, spans []msgSpan, rest, limit int) (k, part, whole int) {
	return leading(len(spans), rest, limit,
		func(i int) int { return spans[i].size() },
		func(i int) bool { r := spans[i].role; return string(d[r.s:r.e]) == `"user"` })
}

// leading is routeMessages over n messages given their sizes and roles:
// it fills limit (no bound when limit <= 0) with at most maxRouteMessages
// of them and, when some are left out (or rest, the size of messages not
// given, is not 0), ends the part on a user message, as every earlier turn
// of the conversation did: templates render the last message (and those
// after the last user message) their own way.
func leading(n, rest, limit int, size func(i int) int, isUser func(i int) bool) (k, part, whole int) {
	if limit <= 0 {
		limit = math.MaxInt
	}
	for k < n && k < maxRouteMessages && part < limit {
		part += size(k)
		k++
	}
	if k < n || rest > 0 {
		for j := k; j >= 1; j-- {
			if isUser(j - 1) {
				for i := j; i < k; i++ {
					part -= size(i)
				}
				k = j
				break
			}
		}
	}
	whole = part + rest
	for i := k; i < n; i++ {
		whole += size(i)
	}
	return k, part, whole
}

// encodeLeading encodes text, or as much of it as --router-tokenize-max-bytes
// allows (cut where the tokens of the part are those of the whole), noting
// the proportion for promptTokens.
func (s *Server) encodeLeading(rs *reqState, text []byte) []uint32 {
	n := tokenizer.Cut(s.o.Tokenizer, text, s.o.Flags.RouterTokenizeMaxBytes)
	rs.tokCut, rs.tokText = n, len(text)
	if n < len(text) {
		mTokenizeCut.Inc()
	}
	return s.o.Tokenizer.Encode(rs.tokens, text[:n])
}

// promptTokens is the prompt's token count: exact when it was tokenized
// whole, extrapolated from the tokenized part's bytes per token when it was
// cut.
func (rs *reqState) promptTokens() int {
	n := len(rs.tokens)
	if rs.tokCut > 0 && rs.tokCut < rs.tokText {
		n += int(int64(rs.tokText-rs.tokCut) * int64(n) / int64(rs.tokCut))
	}
	return n
}

// insertModel appends to dst the JSON object body with "model": model as
// its first member (the object starts at body[obj]).
func insertModel(dst, body []byte, obj int, model string) []byte {
	dst = append(dst, body[:obj+1]...)
	dst = append(dst, `"model":`...)
	dst = appendJSONString(dst, model)
	if j := skipSpace(body, obj+1); j < len(body) && body[j] != '}' {
		dst = append(dst, ',')
	}
	return append(dst, body[obj+1:]...)
}

// laterHTTP1 reports whether proto is HTTP/1.x with x above 1 (no such
// version exists yet): RFC 9110 section 6.2 has a server answer it as the
// highest 1.x it speaks, 1.1, where fasthttp treats it as 1.0. It is
// served (its client knows chunked framing); fasthttp closes the
// connection after the answer unless the request asked for keep-alive,
// which is allowed.
func laterHTTP1(proto []byte) bool {
	return len(proto) == 8 && string(proto[:7]) == "HTTP/1." && proto[7] >= '2' && proto[7] <= '9'
}

// isHTTP1 reports whether proto, a request line's version (fasthttp's
// HTTP/d.d), is HTTP/1.x.
func isHTTP1(proto []byte) bool {
	return len(proto) == 8 && string(proto[:7]) == "HTTP/1."
}

// refuseHTTP10 answers 426 to a request older than HTTP/1.1 and reports
// whether it did: streams and relayed bodies go out chunked, which
// HTTP/1.0 does not know (fasthttp cannot end a body by closing instead).
// As Envoy does by default.
func refuseHTTP10(ctx *fasthttp.RequestCtx) bool {
	if ctx.Request.Header.IsHTTP11() || laterHTTP1(ctx.Request.Header.Protocol()) {
		return false
	}
	closeUnread(ctx)
	writeError(ctx, fasthttp.StatusUpgradeRequired, typeInvalidRequest, "inference requests need HTTP/1.1", "", "http_version_not_supported")
	ctx.Response.Header.Set("Upgrade", "HTTP/1.1")
	return true
}
