package proxy

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/jsonscan"
)

// Responses affinity: in passthrough mode an engine that stores responses
// (vLLM's Responses API) answers a follow-up's previous_response_id only
// when it holds that response, so the follow-up goes to the worker that
// answered the response it names. The router learns the id from the
// answer's first read (a whole Response's "id", or a stream's first
// event's "response":{"id":...}) and keeps which engine answered it (its
// worker's id and address: a worker a reload or discovery replaced with the
// same id and address is the same engine, which still holds the response),
// for the last respAffinityMax ids. A follow-up whose worker is gone,
// tried, open or full is routed as any request (the engine then says the
// response is unknown). An id that comes after the first read is looked
// for in the answer's head (respScan).

// respAffinityMax bounds the ids kept (about 100 bytes each).
const respAffinityMax = 1 << 16

var (
	mPrevResponseRouted  = metrics.NewCounter(`infera_protocol_previous_response_total{result="known"}`)
	mPrevResponseUnknown = metrics.NewCounter(`infera_protocol_previous_response_total{result="unknown"}`)
)

// respAffinity maps response ids to the engine that answered them, the
// oldest evicted first.
type respAffinity struct {
	n    atomic.Int64 // entries, read without the lock
	mu   sync.Mutex
	m    map[string]fleet.Ref
	ring []string // ids in the order learned; next is the oldest at capacity
	next int
}

// learn records the response id in head, the start of an answer, as
// answered by w. It reports whether head held one.
func (a *respAffinity) learn(head []byte, w *fleet.Worker) bool {
	id := responseID(head)
	if id == nil || w == nil {
		return id != nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = make(map[string]fleet.Ref)
	}
	if _, ok := a.m[string(id)]; ok {
		// The first engine keeps it: vLLM lets a client choose a
		// response's id (request_id), and a client that knew another's
		// id must not move that conversation's follow-ups to an engine
		// holding a response it planted.
		return true
	}
	key := string(id)
	if len(a.ring) < respAffinityMax {
		a.ring = append(a.ring, key)
	} else {
		delete(a.m, a.ring[a.next])
		a.ring[a.next] = key
		a.next = (a.next + 1) % respAffinityMax
	}
	a.m[key] = w.Ref()
	a.n.Store(int64(len(a.m)))
	return true
}

// An answer's id may come after the router's first read (readFirst): a
// stream whose first packet is an SSE field of no event (retry:), an
// engine that orders the Response's fields otherwise. The relay then
// gathers the answer's head, up to respScanMax bytes and respScanReads
// reads, until it holds the id.
const (
	respScanMax   = 64 << 10
	respScanReads = 32
)

// respScan gathers the head of a passthrough Responses answer whose first
// read held no response id. Part of the pooled request state.
type respScan struct {
	a     *respAffinity // nil: not scanning
	w     *fleet.Worker
	head  []byte
	reads int
}

// start learns the id in an answer's first read from w, or starts
// gathering its head when the first read holds none.
func (sc *respScan) start(a *respAffinity, first []byte, w *fleet.Worker) {
	if a.learn(first, w) || len(first) >= respScanMax {
		return
	}
	sc.a, sc.w, sc.reads = a, w, 0
	sc.head = append(sc.head[:0], first...)
}

// more adds the next read p of the answer and learns its id once the head
// holds it; it stops at the bounds.
func (sc *respScan) more(p []byte) {
	if sc.a == nil || len(p) == 0 {
		return
	}
	sc.head = append(sc.head, p[:min(len(p), respScanMax-len(sc.head))]...)
	sc.reads++
	if sc.a.learn(sc.head, sc.w) || len(sc.head) >= respScanMax || sc.reads >= respScanReads {
		sc.a, sc.w = nil, nil
	}
}

// reset clears sc for the next request; a large head is dropped.
func (sc *respScan) reset() {
	h := sc.head[:0]
	if cap(h) > 16<<10 {
		h = nil
	}
	*sc = respScan{head: h}
}

// lookup returns the engine that answered the response a Responses
// body's previous_response_id names (the zero Ref when it names none or
// one not known), and whether the body asks the engine not to store its
// answer ("store": false: nothing to learn from the answer).
func (a *respAffinity) lookup(body []byte) (ref fleet.Ref, noStore bool) {
	var prev []byte
	forEachField(body, skipSpace(body, 0), func(k []byte, vs, ve int) error {
		switch string(k) {
		case "previous_response_id":
			prev = nil
			if body[vs] == '"' {
				prev = body[vs+1 : ve-1]
			}
		case "store":
			// The last copy counts, as the engine's JSON decoder reads it.
			noStore = string(body[vs:ve]) == "false"
		}
		return nil
	})
	if len(prev) == 0 || a.n.Load() == 0 {
		if len(prev) > 0 {
			mPrevResponseUnknown.Inc()
		}
		return fleet.Ref{}, noStore
	}
	a.mu.Lock()
	ref = a.m[string(prev)]
	a.mu.Unlock()
	if ref.ID == "" {
		mPrevResponseUnknown.Inc()
	} else {
		mPrevResponseRouted.Inc()
	}
	return ref, noStore
}

var (
	errFound    = errors.New("found")
	keyResponse = []byte(`"response"`)
)

// responseID returns the id of the Response an answer's first read holds:
// a whole Response's top-level "id", or in a stream the "id" of the first
// event's "response" object (response.created). nil when there is none, it
// is cut, or it is not a plain id (1-128 visible ASCII characters, no
// escapes).
func responseID(b []byte) []byte {
	i := skipSpace(b, 0)
	if i >= len(b) {
		return nil
	}
	if b[i] != '{' {
		k := jsonscan.IndexKey(b, keyResponse)
		if k < 0 {
			return nil
		}
		i = skipSpace(b, k+len(keyResponse))
		if i >= len(b) || b[i] != ':' {
			return nil
		}
		if i = skipSpace(b, i+1); i >= len(b) || b[i] != '{' {
			return nil
		}
	}
	var id []byte
	forEachField(b, i, func(k []byte, vs, ve int) error {
		if string(k) == "id" {
			if b[vs] == '"' {
				id = b[vs+1 : ve-1]
			}
			return errFound
		}
		return nil
	})
	if !validRequestID(id) {
		return nil
	}
	for _, c := range id {
		if c == '\\' || c == '"' {
			return nil
		}
	}
	return id
}
