package proxy

import (
	"bytes"
	"strings"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
	"github.com/valyala/fasthttp"
)

// Stored Responses by id (docs/protocols.md): GET /v1/responses/{id}
// retrieves a Response an engine stored, POST /v1/responses/{id}/cancel
// cancels a background one, as vLLM serves them (api_router.py:
// retrieve_responses with its stream and starting_after query parameters,
// cancel_responses). Only the engine that answered the response holds it,
// so the request goes where a follow-up naming the id goes: the engine the
// Responses affinity table keeps for it (respaffinity.go), through the one
// request path (dispatch), pinned there as a follow-up is (full: waits for
// its seat; on trial or open: 503; draining: 410; failed: not retried
// elsewhere); a response an external split proxy entry made, to that entry
// alone while it is enabled at the same address (dispatchSplit), as the
// request that made it went there: the entry's key, never the client's
// credentials (attemptExternal), the retrieve's query kept. The table is this router's memory and, with --state redis,
// the records other routers share there (respshared.go); it is asked
// only while Responses are passed through (storesResponses). An id the
// table does not hold, any id while they are converted, one it holds for
// another user, or for an engine no longer in the fleet, is answered here as vLLM answers an id it does not hold (404): no other
// engine asked would know it either, and asking every engine would let
// anyone who guesses ids probe the whole fleet. The request needs the key
// as any other; it generates nothing, so it counts as a request against
// the user's limits and costs no tokens.

// Kinds of the stored Response endpoints.
const (
	kindResponseGet = kindScore + 1 + iota
	kindResponseCancel
)

var (
	pathResponsesPrefix = []byte("/v1/responses/")
	suffixCancel        = []byte("/cancel")
	pathResponseGet     = []byte("/v1/responses/{response_id}")
	pathResponseCancel  = []byte("/v1/responses/{response_id}/cancel")
	methodGET           = []byte("GET")
)

// byIDKind reports whether kind is a stored Response endpoint's.
func byIDKind(kind int) bool { return kind == kindResponseGet || kind == kindResponseCancel }

// responseByIDKind is the kind of a /v1/responses/{id} or
// /v1/responses/{id}/cancel path, and the id it names.
func responseByIDKind(path []byte) (kind int, id []byte, ok bool) {
	rest, ok := bytes.CutPrefix(path, pathResponsesPrefix)
	if !ok || len(rest) == 0 {
		return 0, nil, false
	}
	kind = kindResponseGet
	if r, ok := bytes.CutSuffix(rest, suffixCancel); ok {
		rest, kind = r, kindResponseCancel
	}
	if len(rest) == 0 || bytes.IndexByte(rest, '/') >= 0 {
		return 0, nil, false
	}
	return kind, rest, true
}

// handleResponseByID serves GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel.
func (s *Server) handleResponseByID(ctx *fasthttp.RequestCtx, kind int) {
	mReqResponses.Inc()
	rs := s.acquireState()
	rs.start = time.Now()
	takeRequestID(ctx, rs)
	rs.acc.kind = kind
	uncounted := false
	defer func() {
		if uncounted {
			countStatus(ctx.Response.StatusCode())
		}
		s.answered(ctx, rs)
	}()
	if kind == kindResponseGet && !ctx.IsGet() {
		methodNotAllowed(ctx, "use GET", "GET")
		uncounted = true
		return
	}
	if kind == kindResponseCancel && !ctx.IsPost() {
		methodNotAllowed(ctx, "use POST", "POST")
		uncounted = true
		return
	}
	if refuseHTTP10(ctx) {
		uncounted = true
		return
	}
	user, ok := s.authenticate(ctx)
	if !ok {
		uncounted = true
		return
	}
	rs.gov.user = user
	if err := s.readBody(ctx, rs); err != nil { // vLLM reads none: it is not forwarded
		s.writeBodyError(ctx, err)
		uncounted = true
		return
	}
	_, id, _ := responseByIDKind(ctx.Path())
	cfg := s.store.Load()
	r := &rs.sreq
	q := ctx.URI().QueryArgs()
	r.Stream = kind == kindResponseGet && jsonscan.LaxBool(q.Peek("stream")) == 't'
	rs.body = rs.body[:0]
	var e respEntry
	known, admitted := false, false
	if s.storesResponses(cfg) {
		// In conversion mode (set, or in effect while the fleet has
		// prefill/decode workers) the router stores nothing and the ids
		// it answers are its own: an id of the table (learned in
		// passthrough, here before a reload or before the pair joined,
		// or by another router sharing Redis) names a response the
		// engines were asked to store in a mode this router does not
		// serve now. Neither memory nor Redis is asked.
		if e, known = s.respAff.local(id); !known && s.respAff.shared(id) {
			// A round trip to Redis: only for a request its user's
			// limits admit, so that made-up ids cost Redis no more
			// lookups than the user may send requests.
			if !s.admitNow(ctx, cfg, rs) {
				return
			}
			admitted = true
			e, known = s.respAff.fetch(id)
		}
	}
	if known && e.user != "" && (user == nil || user.Name() != e.user) {
		known = false // another user's: not this one's to read or cancel
	}
	var w *fleet.Worker
	if known {
		if w = s.sched.Fleet.Get(e.ref.ID); w == nil || !e.ref.Is(w) {
			// Not a fleet engine's: an enabled external split proxy
			// entry's, at the address that made it (split.go learns
			// their answers), is sent there; otherwise its engine left
			// the fleet, and the response with it.
			w = nil
			known = s.heldByEntry(cfg, e.ref)
		}
	}
	if !known {
		if admitted {
			// Answered, as the engine would answer it: the request
			// counts against the user's limits (Done refunds a ticket
			// no answer began).
			rs.gov.committed(fasthttp.StatusNotFound)
		}
		writeResponseNotFound(ctx, id)
		return
	}
	mPrevResponseRouted.Inc()
	r.Prefer = e.ref
	// The engine's own model names it a candidate of model routing (an
	// external entry's request names none: it is pinned to the entry).
	if w != nil && len(w.Models) > 0 {
		rs.parsed.modelBuf = append(rs.parsed.modelBuf[:0], w.Models[0]...)
		r.Model = rs.parsed.modelBuf
	}
	rs.parsed.model = r.Model
	if !admitted && !s.admit(ctx, cfg, rs) {
		return
	}
	rs.path = append(rs.path[:0], pathResponsesPrefix...)
	rs.path = appendPathSegment(rs.path, id)
	if kind == kindResponseCancel {
		rs.path = append(rs.path, suffixCancel...)
	} else if qs := ctx.URI().QueryString(); len(qs) > 0 {
		rs.path = append(rs.path, '?')
		for _, c := range qs {
			if c > ' ' && c < 0x7f && c != '#' {
				rs.path = append(rs.path, c)
			}
		}
	}
	s.dispatch(ctx, cfg, rs)
}

// heldByEntry reports whether ref is the upstream of an enabled external
// split proxy entry of cfg (split proxy on): a response it made is
// retrieved and cancelled there (dispatchSplit sends the request to that
// entry alone).
func (s *Server) heldByEntry(cfg *config.Config, ref fleet.Ref) bool {
	if !cfg.SplitProxy.Enabled || ref.ID == "" {
		return false
	}
	return heldExternal(&cfg.SplitProxy, s.ext.splitTable(&cfg.SplitProxy), ref) >= 0
}

// storesResponses reports whether Responses creates are passed through
// to the engines, which store them, under cfg: passthrough mode, and no
// prefill/decode worker in the fleet (frontDoor converts them while there
// is one: the PD legs speak chat completions). Otherwise the router
// stores nothing, and a retrieve or cancel looks nothing up.
func (s *Server) storesResponses(cfg *config.Config) bool {
	return cfg.Protocol.ResponsesPassthrough && s.sched.Fleet.View().PD == 0
}

// heldName names what a request pinned to the engine holding a Response
// names: the response of a retrieve or cancel, a follow-up's
// previous_response_id.
func heldName(ctx *fasthttp.RequestCtx) string {
	if _, _, ok := responseByIDKind(ctx.Path()); ok {
		return "the response"
	}
	return "previous_response_id"
}

// appendPathSegment appends id percent-encoded as one path segment.
func appendPathSegment(dst, id []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range id {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hex[c>>4], hex[c&15])
	}
	return dst
}

// writeResponseNotFound answers vLLM's 404 for a response id the router
// will not send on: one it does not know, or another user's.
func writeResponseNotFound(ctx *fasthttp.RequestCtx, id []byte) {
	mPrevResponseUnknown.Inc()
	countStatus(fasthttp.StatusNotFound)
	resetResponse(ctx)
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendResponseNotFound(nil, id))
}

// appendResponseNotFound appends vLLM's 404 (protocol.AppendResponseNotFound)
// with the id cut to respIDMax bytes and its invalid UTF-8 dropped: an
// error never echoes a client's megabyte.
func appendResponseNotFound(dst, id []byte) []byte {
	if len(id) > respIDMax {
		id = id[:respIDMax]
	}
	return protocol.AppendResponseNotFound(dst, []byte(strings.ToValidUTF8(string(id), "")))
}
