package engine

import (
	"bytes"
	"strconv"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
)

// Stored responses (native protocols): like vLLM with its Responses store
// on, the engine keeps the Responses it answered ("store": false ones
// excepted) and answers a follow-up naming one in previous_response_id; an
// id it does not hold is answered as vLLM answers it, 404 "Response with id
// '...' not found.". It keeps the last respStoreMax Responses: a whole
// answer as it was sent, a streamed one as its last event's Response (its
// id, model and status "in_progress" until it ends); a follow-up is generated from its own
// input (the simulated answer does not depend on the conversation), which
// is what a router's routing of follow-ups needs to be tested end to end.
// GET /v1/responses/{id} answers the stored Response, POST
// /v1/responses/{id}/cancel cancels a background Response still running
// (background.go) and refuses any other as vLLM refuses to cancel a
// response that is not queued or in progress.

// respStoreMax bounds the Responses kept.
const respStoreMax = 4096

// respStore is the Responses an engine answered (the Response object each
// retrieve answers), the oldest forgotten first.
type respStore struct {
	mu   sync.Mutex
	max  int // 0: respStoreMax
	ids  map[string][]byte
	ring []string
	next int // the oldest, once ring is full
	// bg holds the background Responses being generated, by id: until
	// they end, ids holds their queued Response.
	bg map[string]*bgResponse
}

// bgResponse is a background Response being generated.
type bgResponse struct {
	stop      chan struct{} // closed by a cancel: the generation is aborted
	cancelled []byte        // the Response a cancel stores and answers
}

func (r *respStore) add(id, resp []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ids[string(id)]; ok {
		return
	}
	if r.ids == nil {
		r.ids = make(map[string][]byte)
	}
	limit := r.max
	if limit <= 0 {
		limit = respStoreMax
	}
	k := string(id)
	if len(r.ring) < limit {
		r.ring = append(r.ring, k)
	} else {
		delete(r.ids, r.ring[r.next])
		delete(r.bg, r.ring[r.next]) // forgotten: its end is not stored, a cancel is 404
		r.ring[r.next] = k
		r.next = (r.next + 1) % len(r.ring)
	}
	r.ids[k] = bytes.Clone(resp)
}

// update replaces the Response stored as id, when it is still held.
func (r *respStore) update(id, resp []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ids[string(id)]; ok {
		r.ids[string(id)] = bytes.Clone(resp)
	}
}

// addBackground stores queued, the Response of a background request
// until it ends, and registers it as running: the returned channel is
// closed when it is cancelled, whose Response is then cancelled.
func (r *respStore) addBackground(id, queued, cancelled []byte) <-chan struct{} {
	r.add(id, queued)
	b := &bgResponse{stop: make(chan struct{}), cancelled: cancelled}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bg == nil {
		r.bg = make(map[string]*bgResponse)
	}
	r.bg[string(id)] = b
	return b.stop
}

// finish stores resp, the final Response of the background request id,
// unless it was cancelled meanwhile (or forgotten): as vLLM, "if the
// response is already cancelled, don't update it".
func (r *respStore) finish(id, resp []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.bg[string(id)]; !ok {
		return
	}
	delete(r.bg, string(id))
	if _, ok := r.ids[string(id)]; ok {
		r.ids[string(id)] = bytes.Clone(resp)
	}
}

// cancel cancels the background Response id if it is still running: its
// generation is stopped and its stored Response becomes the cancelled
// one, which cancel returns. ok false: not a running background Response
// (vLLM cancels only one "queued" or "in_progress").
func (r *respStore) cancel(id []byte) (resp []byte, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.bg[string(id)]
	if !ok {
		return nil, false
	}
	delete(r.bg, string(id))
	close(b.stop)
	r.ids[string(id)] = b.cancelled
	return b.cancelled, true
}

var keyResponseObj = []byte(`"response":`)

// get returns the Response stored as id.
func (r *respStore) get(id []byte) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.ids[string(id)]
	return b, ok
}

func (r *respStore) has(id []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[string(id)]
	return ok
}

var (
	keyPrevResponse = []byte(`"previous_response_id"`)
	keyStore        = []byte(`"store"`)
	keyBackground   = []byte(`"background"`)
)

// followUp is what responsesFollowUp reads of a Responses request body.
type followUp struct {
	// prev is previous_response_id (decoded; nil when absent, null or not
	// a string; empty, not nil, for "").
	prev []byte
	// noStore: the request says not to store its Response.
	noStore bool
	// background: the request asks for a background Response.
	background bool
	// body is the request body to convert: the client's, with every
	// previous_response_id value replaced by null when prev is set and
	// every background value by false when background is (the request
	// conversion refuses both: it is the router's, which stores nothing).
	body []byte
}

// responsesFollowUp reads a Responses request body's
// previous_response_id, whether it says not to store the Response and
// whether it asks for a background one (the last copy of a key counts, as
// vLLM's decoder reads it). store and background are lax bools,
// jsonscan.LaxBool, as its pydantic model reads them: 0, "false", "off"
// are false too; a null store is not true, so not stored. A store pydantic
// cannot read as a bool ("maybe", 2, []) is refused with its 400, as vLLM
// refuses the request; so is a background request that is not stored
// (vLLM's validate_background: "background can only be used when `store`
// is true"). A body that is not a JSON object is left to the conversion to
// refuse.
func responsesFollowUp(body []byte) (f followUp, err error) {
	f.body = body
	// A body naming none of the keys is passed over unread, unless it
	// holds an escape: "st\u006fre" is the key store, as vLLM's decoder
	// reads it.
	if !bytes.Contains(body, keyPrevResponse) && !bytes.Contains(body, keyStore) && !bytes.Contains(body, keyBackground) && bytes.IndexByte(body, '\\') < 0 {
		return f, nil
	}
	type span struct {
		vs, ve int
		prev   bool // a previous_response_id value, else a background one
	}
	var (
		spans    []span
		badStore bool
	)
	_, werr := jsonscan.WalkObject(body, 0, 64, func(k []byte, vs, ve int) error {
		switch string(k) {
		case "previous_response_id":
			f.prev = nil
			if body[vs] == '"' {
				// "" is an id too: vLLM looks it up ("if
				// prev_response_id is not None") and answers 404.
				if raw, _, err := jsonscan.ScanString(body, vs); err == nil {
					f.prev = jsonscan.Unescape(make([]byte, 0, len(raw)), raw)
					spans = append(spans, span{vs, ve, true})
				}
			}
		case "store":
			// A lax bool, as vLLM's pydantic model reads it: 0,
			// "false", "off", "No" are false too; null (None) is not
			// stored either, as vLLM stores only "if request.store".
			v := jsonscan.LaxBool(body[vs:ve])
			f.noStore = v != 't'
			badStore = v == 0 && string(body[vs:ve]) != "null"
		case "background":
			f.background = jsonscan.LaxBool(body[vs:ve]) == 't'
			spans = append(spans, span{vs, ve, false})
		}
		return nil
	})
	if werr != nil {
		return followUp{body: body}, nil
	}
	if badStore {
		return followUp{noStore: true, body: body}, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Param: "store",
			Message: "store: Input should be a valid boolean, unable to interpret input"}
	}
	if f.background && f.noStore {
		return followUp{noStore: true, body: body}, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Param: "background",
			Message: "background can only be used when `store` is true"}
	}
	if f.prev == nil && !f.background {
		return f, nil
	}
	next := make([]byte, 0, len(body))
	at := 0
	for _, sp := range spans {
		switch {
		case sp.prev && f.prev != nil:
			next = append(append(next, body[at:sp.vs]...), "null"...)
		case !sp.prev && f.background:
			next = append(append(next, body[at:sp.vs]...), "false"...)
		default:
			continue
		}
		at = sp.ve
	}
	f.body = append(next, body[at:]...)
	return f, nil
}

// appendStreamedResponse appends the Response the engine keeps of a
// streamed answer until the stream ends (then its last event's Response):
// its id, model and status.
func appendStreamedResponse(dst []byte, m *protocol.Meta) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonscan.AppendString(dst, string(m.ID))
	dst = append(dst, `,"object":"response","status":"in_progress","model":`...)
	dst = jsonscan.AppendString(dst, string(m.Model))
	return append(dst, `,"output":[]}`...)
}

// handleStoredResponse serves GET /v1/responses/{id} (retrieve) and POST
// /v1/responses/{id}/cancel as vLLM does (api_router.py, serving.py
// retrieve_responses and cancel_responses): an id not held is 404
// (_make_not_found_error); a held Response is answered whole; a cancel of
// a background Response still running cancels it and answers it
// "cancelled", any other cancel is refused with 400 "Cannot cancel a
// synchronous response." (only a queued or in-progress background
// Response can be).
func (s *Server) handleStoredResponse(ctx *fasthttp.RequestCtx, rest string) {
	id, cancel := strings.CutSuffix(rest, "/cancel")
	if id == "" || strings.Contains(id, "/") {
		s.writeError(ctx, fasthttp.StatusNotFound, "unknown path "+strconv.Quote(string(ctx.Path())), "invalid_request_error")
		return
	}
	if cancel && !ctx.IsPost() || !cancel && !ctx.IsGet() {
		s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed", "invalid_request_error")
		return
	}
	ctx.SetContentType("application/json")
	resp, ok := s.resp.get([]byte(id))
	switch {
	case !ok:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBody(protocol.AppendResponseNotFound(nil, []byte(id)))
	case cancel:
		if cancelled, ok := s.resp.cancel([]byte(id)); ok {
			ctx.SetBody(cancelled)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetBody(protocol.AppendError(nil, protocol.Responses, 400, protocol.TypeInvalidRequest, "", "Cannot cancel a synchronous response."))
	default:
		ctx.SetBody(resp)
	}
}
