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
// /v1/responses/{id}/cancel refuses it as vLLM refuses to cancel a
// response that is not queued or in progress (the engine runs no
// background responses: a request with "background": true is generated
// as any other).

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
)

// responsesFollowUp reads a Responses request body's previous_response_id
// (decoded; nil when absent, null or not a string; empty, not nil, for "") and whether it
// says not to store the Response (the last copy of a key counts, as vLLM's
// decoder reads it; a lax bool, jsonscan.LaxBool, as its pydantic model
// reads it: 0, "false", "off" are false too; null is not true, so not
// stored). A store pydantic cannot read as a bool ("maybe", 2, []) is
// refused with its 400, as vLLM refuses the request. When body names a
// previous response, next is body with every previous_response_id value
// replaced by null (the request conversion refuses one: it is the router's,
// which stores nothing). A body that is not a JSON object is left to the
// conversion to refuse.
func responsesFollowUp(body []byte) (prev []byte, noStore bool, next []byte, err error) {
	// A body naming neither key is passed over unread, unless it holds an
	// escape: "st\u006fre" is the key store, as vLLM's decoder reads it.
	if !bytes.Contains(body, keyPrevResponse) && !bytes.Contains(body, keyStore) && bytes.IndexByte(body, '\\') < 0 {
		return nil, false, body, nil
	}
	var (
		spans    [][2]int
		badStore bool
	)
	_, werr := jsonscan.WalkObject(body, 0, 64, func(k []byte, vs, ve int) error {
		switch string(k) {
		case "previous_response_id":
			prev = nil
			if body[vs] == '"' {
				// "" is an id too: vLLM looks it up ("if
				// prev_response_id is not None") and answers 404.
				if raw, _, err := jsonscan.ScanString(body, vs); err == nil {
					prev = jsonscan.Unescape(make([]byte, 0, len(raw)), raw)
					spans = append(spans, [2]int{vs, ve})
				}
			}
		case "store":
			// A lax bool, as vLLM's pydantic model reads it: 0,
			// "false", "off", "No" are false too; null (None) is not
			// stored either, as vLLM stores only "if request.store".
			v := jsonscan.LaxBool(body[vs:ve])
			noStore = v != 't'
			badStore = v == 0 && string(body[vs:ve]) != "null"
		}
		return nil
	})
	if werr != nil {
		return nil, false, body, nil
	}
	if badStore {
		return nil, true, body, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Param: "store",
			Message: "store: Input should be a valid boolean, unable to interpret input"}
	}
	if prev == nil {
		return nil, noStore, body, nil
	}
	next = make([]byte, 0, len(body))
	at := 0
	for _, sp := range spans {
		next = append(append(next, body[at:sp[0]]...), "null"...)
		at = sp[1]
	}
	return prev, noStore, append(next, body[at:]...), nil
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
// (_make_not_found_error); a held Response is answered whole, and its
// cancel is refused with 400 "Cannot cancel a synchronous response." (it is
// completed: only a queued or in-progress background Response can be).
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
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetBody(protocol.AppendError(nil, protocol.Responses, 400, protocol.TypeInvalidRequest, "", "Cannot cancel a synchronous response."))
	default:
		ctx.SetBody(resp)
	}
}
