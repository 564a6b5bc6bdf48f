package proxy

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/jinja"
	"github.com/infera/infera/protocol"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// The protocol front doors (docs/protocols.md): POST /v1/messages,
// /v1/messages/count_tokens (Anthropic Messages) and /v1/responses (OpenAI
// Responses), passed through to engines that serve them or converted to
// chat completions and back; and, on every chat completions request, the
// reasoning-effort mode and streaming usage. The conversion itself is the
// protocol package's; this file decides what applies to a request, swaps
// the bodies, and is the relay's transform stage.
//
// Whatever the protocol, routing sees a chat completions body: the
// converted body, or in passthrough mode a chat view derived from the
// client's body. Session affinity, model routing, kv-aware routing (the
// view is rendered and tokenized like any chat prompt), quotas and usage
// metrics therefore work the same for all three front doors.

// Kinds of the protocol front doors (parse.go has chat and completion).
const (
	kindMessages = kindCompletion + 1 + iota
	kindCountTokens
	kindResponses
)

// protoMode is what happens to a request's protocol.
type protoMode uint8

const (
	// A chat or completions request (maybe rewritten for the reasoning
	// mode or streaming usage) is the zero mode.
	_ protoMode = iota
	// protoConvert: converted to chat completions; the answer is
	// converted back.
	protoConvert
	// protoPassthrough: forwarded as the client sent it to the engine's
	// same path; routing used a chat view.
	protoPassthrough
)

// stageKind is the relay's transform of the answer.
type stageKind uint8

const (
	stageNone    stageKind = iota
	stageConvert           // a chat stream converted to the client protocol's events
	stageFilter            // a chat stream minus the usage chunk the client did not ask for
)

// maxConvertedAnswer bounds a non-streamed engine answer the router reads
// whole to convert it (the converted answer is about as large).
const maxConvertedAnswer = 32 << 20

// protoState is one request's protocol state, pooled in reqState. reset
// clears protoFlags whole and the rest in place, keeping the buffers
// (TestProtoStateResetClearsEveryField).
type protoState struct {
	protoFlags

	// resp gathers the head of a passthrough Responses answer whose id
	// did not come with the first read (respaffinity.go).
	resp respScan
	// prev is a passthrough follow-up's previous_response_id (decoded)
	// that this router's memory does not hold and Redis may: looked up
	// once the request is admitted (previousShared). Empty otherwise.
	prev []byte

	meta   protocol.Meta
	filter protocol.UsageFilter

	// buf holds a converted or rewritten body; it trades places with
	// rs.body (swapBody), so both buffers stay pooled.
	buf []byte
	out []byte // the transformed answer (relay stage output, converted bodies)
	in  []byte // a non-streamed answer read whole
}

// protoFlags is the part of protoState that holds no buffer: reset
// clears it whole.
type protoFlags struct {
	api   protocol.API
	mode  protoMode
	stage stageKind // wanted for a 200 stream (set before dispatch)
	// relaying is set once the relay transforms the answer (the stage is
	// in effect).
	relaying bool
	// coarse: a passthrough body the converter refused, routed on a
	// minimal view (routingView); its prompt is estimated from its size.
	coarse bool
	// noStore: a passthrough Responses request with "store": false; the
	// engine keeps no answer, so its id is not learned (respaffinity.go).
	noStore bool
	// background: a passthrough Responses create with "background": true.
	// The engine answers it at once "queued" ("usage": null) and
	// generates it afterwards, where no router reads its end: it is
	// charged its estimate for good (admit, scanUsage).
	background bool

	conv *protocol.StreamConverter // while a converted stream is relayed
}

// reset clears p for the next request. Its meta, filter and resp reset
// themselves in place: not copied out and back as a composite literal
// would.
func (p *protoState) reset() {
	if p.conv != nil {
		protocol.ReleaseStreamConverter(p.conv)
	}
	p.protoFlags = protoFlags{}
	p.filter.Reset()
	p.meta.Reset()
	p.resp.reset()
	p.prev = p.prev[:0]
	p.buf, p.out, p.in = trimBuf(p.buf), trimBuf(p.out), trimBuf(p.in)
}

// trimBuf empties b, dropping it when it grew large (a burst of big
// requests must not pin memory).
func trimBuf(b []byte) []byte {
	if cap(b) > 256<<10 {
		return nil
	}
	return b[:0]
}

// protoFront caches the conversion options of the current config snapshot.
type protoFront struct {
	cur atomic.Pointer[protoOptions]
}

type protoOptions struct {
	cfg *config.Config
	opt protocol.Options
}

// options returns the options of cfg, built once per snapshot.
func (f *protoFront) options(cfg *config.Config) *protocol.Options {
	if o := f.cur.Load(); o != nil && o.cfg == cfg {
		return &o.opt
	}
	o := &protoOptions{cfg: cfg, opt: protocol.NewOptions(&cfg.Protocol)}
	f.cur.Store(o)
	return &o.opt
}

var (
	mReqMessages    = metrics.NewCounter(`infera_requests_total{endpoint="messages"}`)
	mReqCountTokens = metrics.NewCounter(`infera_requests_total{endpoint="count_tokens"}`)
	mReqResponses   = metrics.NewCounter(`infera_requests_total{endpoint="responses"}`)
	mConverted      = metrics.NewCounter(`infera_protocol_requests_total{mode="convert"}`)
	mPassedThrough  = metrics.NewCounter(`infera_protocol_requests_total{mode="passthrough"}`)
	// mPDConverted counts passthrough requests converted because the fleet
	// has prefill/decode workers (also counted as convert).
	mPDConverted   = metrics.NewCounter(`infera_protocol_passthrough_converted_for_pd_total`)
	mConvertErrors = metrics.NewCounter(`infera_protocol_conversion_errors_total`)
	mUsageFiltered = metrics.NewCounter(`infera_stream_usage_chunks_removed_total`)
)

// handleProtocol serves the three protocol paths through the one request
// path (handleInference).
func (s *Server) handleProtocol(ctx *fasthttp.RequestCtx, kind int) {
	switch kind {
	case kindMessages:
		mReqMessages.Inc()
	case kindCountTokens:
		mReqCountTokens.Inc()
	default:
		mReqResponses.Inc()
	}
	s.handleInference(ctx, kind)
}

// apiOfPath is the client protocol of a request path: errors the router
// itself answers on /v1/messages... are in Anthropic's shape.
func apiOfPath(path []byte) protocol.API {
	if bytes.HasPrefix(path, []byte("/v1/messages")) {
		return protocol.Anthropic
	}
	if bytes.HasPrefix(path, []byte("/v1/responses")) {
		return protocol.Responses
	}
	return protocol.Chat
}

// writeProtoError answers a conversion error in the client's shape.
func writeProtoError(ctx *fasthttp.RequestCtx, api protocol.API, e *protocol.Error) {
	mBadRequests.Inc()
	mConvertErrors.Inc()
	countStatus(e.Status)
	resetResponse(ctx)
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(e.Append(nil, api))
}

// asProtoError returns err as a *protocol.Error.
func asProtoError(err error) *protocol.Error {
	if e, ok := err.(*protocol.Error); ok {
		return e
	}
	return &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Message: "malformed request body"}
}

// sameSlice reports whether a and b are the same bytes (a transform that
// returned its input).
func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// swapBody makes b (built in rs.proto.buf) the request's body: the body
// the router parses and forwards. The client's bytes move to proto.buf,
// whose memory is reused by the next request. The new body's bytes are
// reserved in the in-flight body budget.
func (s *Server) swapBody(ctx *fasthttp.RequestCtx, rs *reqState, b []byte) bool {
	if !s.reserveMade(ctx, rs, len(b)) {
		return false
	}
	rs.proto.buf, rs.body = rs.body, b
	return true
}

// reserveMade reserves n bytes the router made from the client's body (a
// converted body, a rewritten one, a passthrough chat view, the settings
// a Response echoes) in the in-flight body budget, given back when the
// request ends; it answers 503 and returns false when the budget is spent.
func (s *Server) reserveMade(ctx *fasthttp.RequestCtx, rs *reqState, n int) bool {
	if n == 0 {
		return true
	}
	if !s.bodies.reserve(int64(n)) {
		mBodyBudget.Inc()
		countStatus(fasthttp.StatusServiceUnavailable)
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, "the router is out of request body memory; retry later", "", "overloaded")
		return false
	}
	rs.reserved += int64(n)
	return true
}

// frontDoor readies a request body before it is parsed for routing:
//
//   - chat completions: the reasoning mode may rewrite it (map, drop);
//   - messages, responses: converted to chat completions (conversion), or
//     kept as the client sent it with a chat view for routing (passthrough);
//   - count_tokens in conversion mode: answered here with the router's
//     tokenizer.
//
// It returns the body to parse, the kind to parse it as and the kind of
// the upstream path; ok is false when the request was answered.
func (s *Server) frontDoor(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, kind int) (body []byte, parseKind, pathKind int, ok bool) {
	p := &rs.proto
	body = rs.body
	switch kind {
	case kindCompletion, kindEmbeddings, kindRerank, kindScore:
		return body, kind, kind, true
	case kindChat:
		opt := s.proto.options(cfg)
		if r := &opt.Reasoning; r.Mode == protocol.ReasoningPassthrough ||
			r.Mode == protocol.ReasoningMap && r.Target == protocol.TargetReasoningEffort {
			return body, kind, kind, true // nothing to rewrite: no walk of the body
		}
		out, err := protocol.RewriteChatReasoning(p.buf[:0], body, &opt.Reasoning)
		if err != nil {
			// A body that is not a JSON object is refused by parse with
			// the usual message; other errors are the reasoning field's.
			if e := asProtoError(err); e.Param != "" {
				writeProtoError(ctx, protocol.Chat, e)
				return nil, 0, 0, false
			}
			return body, kind, kind, true
		}
		if !sameSlice(out, body) {
			if !s.swapBody(ctx, rs, out) {
				return nil, 0, 0, false
			}
			body = out
		}
		return body, kind, kind, true
	}
	pass := cfg.Protocol.AnthropicPassthrough
	p.api = protocol.Anthropic
	if kind == kindResponses {
		pass = cfg.Protocol.ResponsesPassthrough
		p.api = protocol.Responses
	}
	opt := s.proto.options(cfg)
	var (
		chat []byte
		err  error
	)
	switch kind {
	case kindMessages:
		chat, err = protocol.AnthropicToChat(p.buf[:0], body, opt, &p.meta)
	case kindCountTokens:
		chat, err = protocol.AnthropicCountTokensToChat(p.buf[:0], body, opt, &p.meta)
	default:
		chat, err = protocol.ResponsesToChat(p.buf[:0], body, opt, &p.meta)
	}
	if pass && s.sched.Fleet.View().PD > 0 {
		// Prefill/decode pairs speak chat completions (vLLM's 1-token
		// prefill and kv_transfer_params, SGLang's bootstrap fields exist
		// there only): passed through, a Responses prefill leg kept its
		// max_output_tokens and handed over no KV, so both legs generated
		// the whole answer. With PD workers in the fleet the request is
		// converted (one the converter refuses is refused).
		pass = false
		mPDConverted.Inc()
	}
	if pass {
		mPassedThrough.Inc()
		p.mode = protoPassthrough
		background, kerr := passthroughKeys(body)
		if kerr != nil {
			// The engine gets the client's body: a key it may read in
			// another case than the router did, or a repeated routing key
			// (engines disagree on which copy counts), is refused (parse).
			writeProtoError(ctx, p.api, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Message: kerr.Error()})
			return nil, 0, 0, false
		}
		if err != nil {
			// The engine may accept what the converter does not (stored
			// responses, server tools, PDF documents): route on the model
			// and stream flag alone and let the engine answer.
			var verr error
			if chat, verr = routingView(p.buf[:0], body); verr != nil {
				writeProtoError(ctx, p.api, asProtoError(err))
				return nil, 0, 0, false
			}
			p.coarse = true
		}
		if kind == kindResponses {
			// A follow-up goes to the engine holding its previous
			// response (respaffinity.go).
			var buf [respIDDecodeMax]byte
			e, id, noStore := s.respAff.lookup(&buf, body)
			p.noStore = noStore
			if id != nil {
				if e.user != "" && (rs.gov.user == nil || rs.gov.user.Name() != e.user) {
					// Another user's response: continuing it would hand
					// this user that conversation. Answered as the engine
					// answers an id it does not hold, as a retrieve of it
					// is (respstored.go).
					mBadRequests.Inc()
					writeResponseNotFound(ctx, id)
					return nil, 0, 0, false
				}
				switch {
				case e.ref.ID != "":
					mPrevResponseRouted.Inc()
				case s.respAff.shared(id):
					// Redis may hold it: asked once the request is
					// admitted (previousShared), so that made-up ids
					// cost Redis no more lookups than the user may
					// send requests.
					p.prev = append(p.prev[:0], id...)
				default:
					mPrevResponseUnknown.Inc()
				}
			}
			rs.sreq.Prefer = e.ref
			if background && rs.gov.user.LimitsConcurrency() {
				// Its generation would hold no slot: the exchange ends
				// at once, and the router does not see the engine end it.
				mBadRequests.Inc()
				countStatus(fasthttp.StatusForbidden)
				writeError(ctx, fasthttp.StatusForbidden, typePermission, errBackgroundConcurrency, "background", "background_not_allowed")
				return nil, 0, 0, false
			}
			p.background = background
		}
		p.buf = chat
		// The view is held until the request ends, beside the client's
		// body: it is reserved like a converted body (it is one), with
		// the copies the conversion kept for the answer's echo.
		if !s.reserveMade(ctx, rs, len(chat)+p.meta.EchoSize()) {
			return nil, 0, 0, false
		}
		return chat, kindChat, kind, true
	}
	if err != nil {
		writeProtoError(ctx, p.api, asProtoError(err))
		return nil, 0, 0, false
	}
	mConverted.Inc()
	if kind == kindCountTokens {
		p.buf = chat
		rs.parsed.model = p.meta.Model // the access log's model: no parse follows
		if len(p.meta.Model) == 0 {
			// As a Messages request's model "" is refused (parse).
			mBadRequests.Inc()
			countStatus(fasthttp.StatusBadRequest)
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, errEmptyModel.msg, errEmptyModel.param, "")
			return nil, 0, 0, false
		}
		// The user's model list applies as to Messages (and as the engine
		// applies it in passthrough mode after the router's check).
		if u := rs.gov.user; u != nil && !s.allowsModel(cfg, u, p.meta.Model) {
			mModelNotAllowed.Inc()
			countStatus(fasthttp.StatusForbidden)
			writeError(ctx, fasthttp.StatusForbidden, typePermission, notAllowedModel(p.meta.Model), "model", "model_not_allowed")
			return nil, 0, 0, false
		}
		if s.unservedModel(ctx, cfg, rs, p.meta.Model) {
			return nil, 0, 0, false
		}
		s.countTokens(ctx, rs, chat)
		return nil, 0, 0, false
	}
	p.mode = protoConvert
	// The settings a Response echoes (its tools: up to the body's size)
	// are held until the request ends, beside the two bodies.
	if !s.reserveMade(ctx, rs, p.meta.EchoSize()) || !s.swapBody(ctx, rs, chat) {
		return nil, 0, 0, false
	}
	// Converted answers are read and rewritten by the router: the engine
	// must not compress them.
	ctx.Request.Header.Del(fasthttp.HeaderAcceptEncoding)
	return chat, kindChat, kindChat, true
}

// afterParse finishes the body once it is parsed: in passthrough the
// model span is moved to the forwarded (client's) body, so model routing
// rewrites it there; a converted stream is converted by the relay; a chat
// or completions stream always asks the engine for usage, and the usage
// chunk is removed for a client that did not ask for it unless
// protocol.force_stream_usage is on. ok is false when the request was
// answered.
func (s *Server) afterParse(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, body []byte, kind int) ([]byte, bool) {
	p := &rs.proto
	b := &rs.parsed
	switch p.mode {
	case protoPassthrough:
		b.modelStart, b.modelEnd = modelSpan(rs.body)
		if p.coarse {
			// The view's prompt is empty: the user limits and the load
			// weigh the client's body instead (an 8,000-token input was
			// estimated at one token, and four at once passed a 5,000 TPM
			// bucket).
			b.promptTokens = coarseTokens(rs.body)
			rs.tokSkip = true // nothing to hash: routed by load
		}
		return body, true
	case protoConvert:
		if b.stream {
			p.stage = stageConvert
		}
		return body, true
	}
	if !b.stream {
		return body, true
	}
	// The usual stream has no stream_options: it goes in first, and the
	// parse moves with it (no second walk of the body, no second parse).
	moved := !b.streamOpts
	var out []byte
	var asked bool
	if moved {
		out = b.insertStreamUsage(p.buf[:0], body)
	} else {
		var err error
		if out, asked, err = protocol.EnsureStreamUsageForced(p.buf[:0], body, cfg.Protocol.ForceStreamUsage); err != nil {
			return body, true // parse accepted the body; cannot happen
		}
	}
	if !asked && !cfg.Protocol.ForceStreamUsage {
		p.stage = stageFilter
		ctx.Request.Header.Del(fasthttp.HeaderAcceptEncoding) // the filter reads the stream
	}
	if sameSlice(out, body) {
		return body, true
	}
	if !s.swapBody(ctx, rs, out) {
		return nil, false
	}
	if moved {
		return out, true
	}
	if err := b.parse(out, kind); err != nil {
		panic("BUG: a chat body with stream_options added no longer parses: " + err.Error())
	}
	return out, true
}

// modelSpan returns the span of the (last) top-level "model" value of an
// object body, quotes included; 0, 0 when there is none.
func modelSpan(d []byte) (start, end int) {
	forEachField(d, 0, func(key []byte, vs, ve int) error {
		if string(key) == "model" && d[vs] == '"' {
			start, end = vs, ve
		}
		return nil
	})
	return start, end
}

// passthroughKeys refuses a passthrough body whose top level holds a key
// the router reads in another case (foldedKey) or a routing key twice. It
// reports whether the (last) "background" value is true as vLLM reads a
// bool (jsonscan.LaxBool: "true", 1 and "yes" too).
func passthroughKeys(body []byte) (background bool, err error) {
	var seen uint8
	forEachField(body, skipSpace(body, 0), func(k []byte, vs, ve int) error {
		if err != nil {
			return nil
		}
		if string(k) == "background" {
			background = jsonscan.LaxBool(body[vs:ve]) == 't'
		}
		if foldedKey(k) != nil {
			err = caseVariantKey(k)
			return nil
		}
		for i, name := range passthroughRoutingKeys {
			if string(k) == name {
				if seen&(1<<i) != 0 {
					err = duplicateKey(name)
				}
				seen |= 1 << i
			}
		}
		return nil
	})
	return background, err
}

// errBackgroundConcurrency refuses a background Response to a user with a
// concurrency limit (docs/governance.md).
const errBackgroundConcurrency = "background responses are not available to a user with a concurrency limit: the engine generates one after its request has ended, holding no slot; send it without background"

// passthroughRoutingKeys are the keys of a Messages or Responses body the
// router routes or accounts on.
var passthroughRoutingKeys = [...]string{"model", "stream", "max_tokens", "max_output_tokens", "messages", "input"}

// coarseTokens estimates the prompt tokens of a passthrough body the
// converter refused: about 4 bytes a token, as for embeddings, except that
// a run of 1 KiB or more of base64 characters (a PDF's, an image's or
// audio's data, the usual reason the converter refuses) counts nothing,
// as images do not count in a converted prompt's estimate: at 4 bytes a
// token a 2 MB PDF would be 500,000 tokens, past many quota windows.
func coarseTokens(body []byte) int {
	n, run := 0, 0
	for _, c := range body {
		if base64Char[c] {
			run++
			continue
		}
		if run < 1024 {
			n += run
		}
		run = 0
		n++
	}
	if run < 1024 {
		n += run
	}
	return max(1, (n+3)/4)
}

// base64Char holds the characters of base64 (standard and URL-safe).
var base64Char = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_") {
		t[c] = true
	}
	return t
}()

// routingView appends a minimal chat body that routes like body: its model,
// stream flag and output limit (max_tokens or max_output_tokens, when the
// engine reads it as an integer), an empty prompt (afterParse estimates it from the body's
// size). For passthrough requests the converter refused.
func routingView(dst, body []byte) ([]byte, error) {
	var model []byte
	stream, maxOut := false, -1
	i := skipSpace(body, 0)
	end, err := forEachField(body, i, func(key []byte, vs, ve int) error {
		switch string(key) {
		case "model":
			model = body[vs:ve]
		case "stream":
			stream = jsonscan.LaxBool(body[vs:ve]) == 't' // as the engine reads it
		case "max_tokens", "max_output_tokens":
			// Read as the engine's lax int reads it ("100000" too),
			// and written plain for parse: the last copy counts.
			maxOut = -1
			if n := laxInt(body[vs:ve]); n >= 0 {
				maxOut = n
			}
		}
		return nil
	})
	if err != nil || skipSpace(body, end) != len(body) {
		return dst, errJSON
	}
	dst = append(dst, '{')
	if model != nil {
		dst = append(dst, `"model":`...)
		dst = append(dst, model...)
		dst = append(dst, ',')
	}
	if stream {
		dst = append(dst, `"stream":true,`...)
	}
	if maxOut >= 0 {
		dst = append(dst, `"max_tokens":`...)
		dst = strconv.AppendInt(dst, int64(maxOut), 10)
		dst = append(dst, ',')
	}
	return append(dst, `"messages":[{"role":"user","content":""}]}`...), nil
}

// unservedModel answers 404 not_found_error, as a Messages request for the
// model gets it, when the router counts tokens for a model nothing serves:
// no canary rule, model mapping, served model (exact, another notation,
// fuzzy) or default model takes it (sched.UnknownModel), no smart model
// selection applies to it and no member region serves it. With the split
// proxy on, an external upstream may serve any name: the count is
// answered. It reports whether it answered.
func (s *Server) unservedModel(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, model []byte) bool {
	if cfg.SplitProxy.Enabled {
		return false
	}
	err := s.sched.UnknownModel(cfg, model)
	if !errors.Is(err, sched.ErrUnknownModel) {
		return false
	}
	if sm := &cfg.SmartModelSelection; sm.Enabled && classify.Applies(sm, model) {
		return false
	}
	if s.globalOn(cfg) && s.o.Poller.Serves(model) {
		return false
	}
	r := &rs.sreq
	r.Model = model
	s.writeSchedError(ctx, r, err)
	return true
}

// countTokens answers POST /v1/messages/count_tokens (conversion mode):
// the converted prompt rendered with the router's chat template and
// encoded with its tokenizer. Exact when --router-tokenizer-path names the
// model's tokenizer and the rendered prompt is within
// --router-tokenize-max-bytes; without one the router counts with the
// built-in Simple tokenizer, an estimate (docs/protocols.md).
func (s *Server) countTokens(ctx *fasthttp.RequestCtx, rs *reqState, chat []byte) {
	tok := s.o.Tokenizer
	if tok == nil {
		tok = tokenizer.Simple{}
	}
	// Bounded like routing's (tokenize): past --router-tokenize-max-bytes,
	// or maxRouteMessages messages, the count is extrapolated from the part
	// rendered and encoded.
	limit := s.o.Flags.RouterTokenizeMaxBytes
	decode := 0
	if limit > 0 {
		decode = maxRouteMessages
	}
	// The converted body and its decoded messages (up to its size again)
	// are reserved in the in-flight body budget like the client's body
	// (six concurrent 20 MB counts held 787 MB outside it).
	if !s.bodies.reserve(2 * int64(len(chat))) {
		mBodyBudget.Inc()
		writeProtoError(ctx, protocol.Anthropic, &protocol.Error{Status: fasthttp.StatusServiceUnavailable, Type: protocol.TypeUnavailable,
			Message: "the router is out of request body memory; retry later"})
		return
	}
	rs.reserved += 2 * int64(len(chat))
	msgs, tools, rest, err := protocol.ChatMessagesN(rs.msgs[:0], chat, &rs.arena, decode)
	rs.msgs = msgs
	k, part, whole := len(msgs), 1, 1
	if limit > 0 {
		k, part, whole = leadingMessages(msgs, rest, limit)
	}
	if err == nil && limit > 0 && len(tools) > limit {
		writeProtoError(ctx, protocol.Anthropic, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest,
			Message: "tools: larger than the router counts (--router-tokenize-max-bytes " + strconv.Itoa(limit) + ")"})
		return
	}
	if err == nil {
		all, cont := k == len(msgs) && rest == 0, rs.proto.meta.ContinueFinal
		// The converted chat's chat_template_kwargs (the reasoning
		// mapping's enable_thinking) render as the request's would.
		var kw []byte
		forEachField(chat, skipSpace(chat, 0), func(key []byte, vs, ve int) error {
			if string(key) == "chat_template_kwargs" {
				kw = chat[vs:ve]
			}
			return nil
		})
		f, _ := chatFieldsOf(tools, nil, kw) // the router's own kwargs: always renderable
		rs.render, err = tokenizer.RenderChatFields(tok, rs.render[:0], msgs[:k], f, all && !cont)
		if err == nil && all && cont && k > 0 {
			rs.render = tokenizer.ContinueFinalMessage(rs.render, tokenizer.FinalContent(tok, &msgs[k-1])) // a prefill is continued
		}
	}
	if err != nil {
		msg := "messages: the prompt cannot be rendered with the model's chat template"
		if jinja.IsLimit(err) {
			msg = "messages: the prompt is beyond what the router renders to count (its tools' values, nesting or the template's work)"
		}
		writeProtoError(ctx, protocol.Anthropic, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Message: msg})
		return
	}
	n := tokenizer.Cut(tok, rs.render, limit)
	rs.tokCut, rs.tokText = n, int(int64(len(rs.render))*int64(whole)/int64(max(part, 1)))
	rs.tokens = tok.Encode(rs.tokens[:0], rs.render[:n])
	countStatus(200)
	rs.proto.out = protocol.AppendCountTokens(rs.proto.out[:0], rs.promptTokens())
	ctx.SetContentType("application/json")
	ctx.SetBody(rs.proto.out)
}

// passesResponses reports a Responses request passed through whose answer
// names a response the engine stored (not "store": false;
// respaffinity.go).
func (p *protoState) passesResponses() bool {
	return p.mode == protoPassthrough && p.api == protocol.Responses && !p.noStore
}

// transforms reports whether the answer may be rewritten (converted or
// filtered) on its way to the client.
func (p *protoState) transforms() bool { return p.mode == protoConvert || p.stage != stageNone }

// transformHead handles the answer's head when the request is converted or
// its stream filtered, before it is committed. first is the first body
// chunk (eof: the whole body). A converted non-streamed answer or error is
// read whole, converted and written here (done). Otherwise it returns the
// first chunk to send; the relay transforms the rest.
func (s *Server) transformHead(ctx *fasthttp.RequestCtx, rs *reqState, up upResponse, status int, first []byte, eof bool, outcome sched.Outcome) (out []byte, eofOut, done bool) {
	p := &rs.proto
	h := &ctx.Response.Header
	encoded := len(h.Peek(fasthttp.HeaderContentEncoding)) > 0
	// A converted stream request answered with one body that is not an
	// event stream (plain JSON) is read whole too, and written as the
	// client's stream (commitConverted).
	if p.mode == protoConvert && (status >= 400 || !rs.sreq.Stream || encoded || !eventStream(up.contentType())) {
		s.commitConverted(ctx, rs, up, status, first, eof, outcome, encoded)
		return nil, false, true
	}
	if status >= 400 || encoded {
		return first, eof, false // a chat error or an encoded stream: relayed as is
	}
	p.meta.PromptTokens = rs.promptTokens()
	p.relaying = true
	switch p.stage {
	case stageConvert:
		p.conv = protocol.AcquireStreamConverter(&p.meta)
		h.SetContentType("text/event-stream")
	case stageFilter:
		p.filter.Reset()
	}
	out = p.feed(first)
	if eof {
		out = p.finish(out)
	}
	return out, eof, false
}

// commitConverted answers a converted request whose answer is not a
// stream (or is an error): the engine's body is read whole and converted.
func (s *Server) commitConverted(ctx *fasthttp.RequestCtx, rs *reqState, up upResponse, status int, first []byte, eof bool, outcome sched.Outcome, encoded bool) {
	p := &rs.proto
	var f *failure
	body := first
	if encoded {
		f = fail(failProtocol, nil)
	} else if !eof {
		body, f = s.readAnswer(rs, up, first)
	}
	var out []byte
	ctype := "application/json"
	if f != nil {
		up.finish(false)
		if f.kind == failCanceled {
			mClientGone.Inc()
		} else if f.kind != failProtocol {
			s.countFailure(rs.lease.Worker, f)
		}
		outcome = f.outcome()
		status = f.httpStatus()
		c := f.class()
		msg := c.msg
		if f.kind == failBroken {
			msg = "the worker's answer broke before it was complete"
		}
		if encoded {
			msg = "the worker answered with a Content-Encoding the router cannot convert"
		}
		if f.kind == failWallClock || isTimeout(f.cause) {
			status, msg = fasthttp.StatusGatewayTimeout, "the worker's answer did not arrive in time"
		}
		out = protocol.AppendError(p.out[:0], p.api, status, c.typ, "", msg)
	} else {
		up.finish(true)
		rs.scanUsage(body)
		if status >= 400 {
			out = protocol.ConvertError(p.out[:0], p.api, status, body)
		} else if rs.sreq.Stream && s.streamWholeAnswer(rs, body) {
			// The client asked for a stream: it gets one (an SDK's stream
			// reader finds no events in a JSON body).
			ctype, out = "text/event-stream", p.out
		} else {
			var err error
			if p.api == protocol.Anthropic {
				out, err = protocol.ChatToAnthropic(p.out[:0], body, &p.meta)
			} else {
				out, err = protocol.ChatToResponses(p.out[:0], body, &p.meta)
			}
			if err != nil {
				e := asProtoError(err)
				status, outcome = fasthttp.StatusBadGateway, sched.OutcomeFault
				out = protocol.AppendError(p.out[:0], p.api, status, protocol.TypeServer, "", e.Message)
				mConvertErrors.Inc()
			}
		}
	}
	p.out = out
	resp := &ctx.Response
	resp.Header.SetStatusCode(status)
	resp.Header.Del(fasthttp.HeaderContentEncoding)
	resp.Header.SetContentType(ctype)
	resp.SetBody(out) // a copy: rs (and out) is reused once the handler returns
	countStatus(status)
	rs.lease.Done(outcome)
	rs.usage.record(rs.lease.Worker)
	rs.dur = time.Since(rs.start)
	mDuration.Update(rs.dur.Seconds())
}

// streamWholeAnswer writes the whole chat completion body, the answer to
// a converted stream request, as the client protocol's stream into
// rs.proto.out. It reports false, writing nothing, when body is not a
// readable chat completion.
func (s *Server) streamWholeAnswer(rs *reqState, body []byte) bool {
	p := &rs.proto
	p.meta.PromptTokens = rs.promptTokens()
	c := protocol.AcquireStreamConverter(&p.meta)
	defer protocol.ReleaseStreamConverter(c)
	out, ok := c.FeedAnswer(p.out[:0], body)
	if ok {
		p.out = out
	}
	return ok
}

// readAnswer reads the rest of a non-streamed answer after first (the
// deadline set before the head bounds it).
func (s *Server) readAnswer(rs *reqState, up upResponse, first []byte) ([]byte, *failure) {
	p := &rs.proto
	in := append(p.in[:0], first...)
	for {
		if len(in) == cap(in) {
			if len(in) >= maxConvertedAnswer {
				p.in = in
				return nil, fail(failProtocol, errAnswerTooLarge)
			}
			in = slices.Grow(in, max(len(in), 32<<10))
		}
		n, err := up.read(in[len(in):cap(in)])
		in = in[:len(in)+n]
		if err == io.EOF {
			p.in = in
			return in, nil
		}
		if err != nil {
			p.in = in
			return nil, up.readFailure(err, true)
		}
	}
}

var errAnswerTooLarge = &protocol.Error{Status: 502, Message: "the engine's answer is too large to convert"}

// feed transforms an upstream chunk for the client (relay stage).
func (p *protoState) feed(src []byte) []byte {
	switch p.stage {
	case stageConvert:
		p.out = p.conv.Feed(p.out[:0], src)
	case stageFilter:
		p.out = p.filter.Filter(p.out[:0], src)
	default:
		return src
	}
	return p.out
}

// finish appends the stage's closing bytes after the upstream body ended.
func (p *protoState) finish(dst []byte) []byte {
	switch p.stage {
	case stageConvert:
		dst = p.conv.Finish(dst)
	case stageFilter:
		dst = p.filter.Flush(dst)
		if p.filter.Usage.Seen {
			mUsageFiltered.Inc()
		}
	}
	p.out = dst
	return dst
}

// failEvent is the event a converted stream ends with when the upstream
// failed after the first byte; nil when the stream is not converted.
func (p *protoState) failEvent(dst []byte, status int, typ, msg string) []byte {
	if p.conv == nil {
		return nil
	}
	return p.conv.Fail(dst, status, typ, msg)
}

// appendSSEError appends the error event a relayed stream ends with, in
// the client's protocol: a passthrough Anthropic or Responses stream gets
// the event its SDK parses, a chat stream the OpenAI-shaped data line.
//
// seq is the sequence_number of the last Responses event relayed (-1:
// none); the error event, which requires one, takes the next.
func (p *protoState) appendSSEError(b []byte, status int, typ, msg, code string, seq int64) []byte {
	switch p.api {
	case protocol.Anthropic:
		b = append(b, "event: error\ndata: "...)
		b = protocol.AppendError(b, protocol.Anthropic, status, typ, "", msg)
		return append(b, "\n\n"...)
	case protocol.Responses:
		b = append(b, `event: error`+"\n"+`data: {"type":"error","sequence_number":`...)
		b = strconv.AppendInt(b, seq+1, 10)
		b = append(b, `,"code":`...)
		b = appendJSONString(b, typ)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, msg)
		return append(b, `,"param":null}`+"\n\n"...)
	}
	return appendSSEError(b, typ, msg, code)
}

// errorBody is the body of a worker's error answer relayed after retries:
// converted to the client's protocol for a converted request.
func (rs *reqState) errorBody() []byte {
	p := &rs.proto
	if p.mode != protoConvert {
		return rs.errBody
	}
	p.out = protocol.ConvertError(p.out[:0], p.api, rs.errStatus, rs.errBody)
	rs.errType = append(rs.errType[:0], "application/json"...)
	return p.out
}

// scanUsage records the usage in an answer chunk: chat usage, or in
// passthrough the client protocol's usage object (and a Responses
// answer's id the first read did not hold).
func (rs *reqState) scanUsage(b []byte) {
	if byIDKind(rs.acc.kind) {
		return // a stored Response's usage was counted when it was generated
	}
	if rs.proto.mode != protoPassthrough {
		rs.usage.lines = rs.sreq.Stream            // a stream's usage chunk is told by its line (judge)
		rs.usage.once = !rs.parsed.continuousUsage // as forwarded (afterParse)
		rs.usage.single = rs.parsed.generations() == 1
		rs.usage.scan(b)
		return
	}
	if !rs.proto.background { // a queued Response's usage is null: its generation comes later
		rs.usage.scanProtocol(b, rs.proto.api)
	}
	if rs.proto.resp.a != nil {
		rs.proto.resp.more(b) // an id not in the first read (respaffinity.go)
	}
}

var (
	keyInputTokens  = []byte(`"input_tokens"`)
	keyOutputTokens = []byte(`"output_tokens"`)
	keyCacheRead    = []byte(`"cache_read_input_tokens"`)
	keyCacheWrite   = []byte(`"cache_creation_input_tokens"`)
)

// scanProtocol is scan for Anthropic and Responses usage objects: prompt
// tokens are Anthropic's input plus cache reads and cache writes (Anthropic
// counts both apart from input_tokens), or Responses' input_tokens. Unlike a chat stream's, the
// numbers come in parts (Anthropic's message_start holds the input,
// message_delta the output, often in one read), so every usage object of
// b is read in order; one cut by a read boundary is carried to the next
// scan as scan does.
func (u *usage) scanProtocol(b []byte, api protocol.API) {
	if api != protocol.Anthropic {
		u.scanAPI(b, api)
		return
	}
	// An event type cut by the boundary between the last read and b.
	var w [2 * (markerLen - 1)]byte
	n := copy(w[:], u.tail[:u.ntail])
	n += copy(w[n:], b[:min(len(b), markerLen-1)])
	u.inMessageStart(w[:n])
	u.scanAPI(b, api)
	// Keep the last markerLen-1 bytes read.
	if len(b) >= len(u.tail) {
		u.ntail = copy(u.tail[:], b[len(b)-len(u.tail):])
	} else {
		keep := min(u.ntail, len(u.tail)-len(b))
		copy(u.tail[:], u.tail[u.ntail-keep:u.ntail])
		u.ntail = keep + copy(u.tail[keep:], b)
	}
}

// parseProtocol reads every usage object of b in order (reading one twice
// is harmless: the later ones still come after it).
func (u *usage) parseProtocol(b []byte, api protocol.API) {
	off := 0
	for {
		i := jsonscan.IndexKey(b[off:], keyUsage)
		if i < 0 {
			break
		}
		i += off
		obj := b[i+len(keyUsage):]
		end := objectEnd(obj)
		start := api == protocol.Anthropic && u.inMessageStart(b[off:i])
		if end < 0 {
			u.applyProtocol(obj, api, start, false)
			if len(b)-i <= usageMax {
				u.carryCut(b[i:])
			}
			return
		}
		u.applyProtocol(obj[:end], api, start, true)
		off = i + len(keyUsage) + end
	}
	if api == protocol.Anthropic {
		u.inMessageStart(b[off:]) // the event type a later read's usage belongs to
	}
	// The next key may be cut: carry a tail of b (after the last object)
	// that begins it.
	for k := min(len(keyUsage)-1, len(b)-off); k > 0; k-- {
		if bytes.HasSuffix(b, keyUsage[:k]) {
			u.ncarry = copy(u.carry[:], b[len(b)-k:])
			return
		}
	}
}

// inMessageStart reports whether a usage object after pre (the bytes of
// a read since the previous usage object) is an Anthropic
// message_start's: the last event type pre names, or when it names none
// the last one an earlier read named (u.inStart, which it updates).
func (u *usage) inMessageStart(pre []byte) bool {
	s, d := bytes.LastIndex(pre, evMessageStart), bytes.LastIndex(pre, evMessageDelta)
	if s != d { // one of them found
		u.inStart = s > d
	}
	return u.inStart
}

var (
	evMessageStart = []byte(`"message_start"`)
	evMessageDelta = []byte(`"message_delta"`)
)

// markerLen is the length of evMessageStart and evMessageDelta.
const markerLen = 15

// applyProtocol records the numbers of one usage object (or of its part
// read so far). An Anthropic message_start's (start) tells the input
// only: its output_tokens (0 at vLLM, 1 at Anthropic) is no count of what
// was generated, so the usage is known (seen) only once the output comes
// in a later event (message_delta). A stream cut after message_start (the
// client left, the engine died) keeps its estimate, as a chat stream
// without usage does; it was reconciled with the output of message_start,
// nothing, however much the client had received.
//
// whole tells that obj is the whole object: the numbers of a whole usage
// object other than message_start's are the answer's final count (an
// Anthropic stream sends it once, in message_delta; a Responses stream in
// its terminal event), settled however the stream ends after it.
func (u *usage) applyProtocol(obj []byte, api protocol.API, start, whole bool) {
	seen := u.seen // a count of message_start's tells no usage yet
	okOut := !start && u.count(&u.completion, bitCompletion, obj, keyOutputTokens)
	in := false
	if api == protocol.Anthropic {
		// Each input count as last set (null or absent leaves it); the
		// cache reads are the cache hits, the cache writes computed.
		for part, key := range anthropicInputKeys {
			in = u.count(&u.input[part], bitInput<<part, obj, key) || in
		}
		if in {
			u.prompt, u.cached = u.input.Total(), u.input[protocol.AnthropicCacheRead]
		}
	} else {
		in = u.count(&u.prompt, bitPrompt, obj, keyInputTokens)
		if in {
			u.count(&u.cached, bitCached, obj, keyCached)
		}
	}
	u.seen = seen || !start && (in || okOut)
	if !start && (in || okOut) {
		u.whole, u.final = whole, whole
	}
}

// anthropicInputKeys are the keys of an Anthropic usage's input counts,
// indexed as protocol.AnthropicInput.
var anthropicInputKeys = [len(protocol.AnthropicInput{})][]byte{
	protocol.AnthropicInputTokens:   keyInputTokens,
	protocol.AnthropicCacheCreation: keyCacheWrite,
	protocol.AnthropicCacheRead:     keyCacheRead,
}

// leadingMessages is routeMessages for decoded messages; rest weighs the
// messages left undecoded.
func leadingMessages(msgs []tokenizer.Message, rest, limit int) (k, part, whole int) {
	size := func(i int) int {
		m := &msgs[i]
		n := 1 + len(m.Content) + len(m.ReasoningContent)
		for j := range m.ToolCalls {
			n += len(m.ToolCalls[j].Function.Arguments)
		}
		return n
	}
	return leading(len(msgs), rest, limit, size, func(i int) bool { return msgs[i].Role == "user" })
}
