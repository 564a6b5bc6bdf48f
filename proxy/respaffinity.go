package proxy

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
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
// for the last respAffinityMax ids, shared fairly among credentials
// (respAffinity). A follow-up whose worker is full waits for its seat
// there (govern.go), one whose worker is on trial (half-open, its trial
// taken) or open (its cooldown not over) is answered 503
// (sched.ErrPreferredOnTrial, sched.ErrPreferredOpen), one whose worker
// is draining is answered 410 (sched.ErrPreferredDraining), and one whose
// worker fails is not retried elsewhere (dispatch.go); one whose worker is
// gone is routed as any request (the engine then says the response is
// unknown). An id that comes after the first read is looked
// for in the answer's head (respScan). With --state redis the table is
// shared through Redis as well (respshared.go), so that other routers, and
// this one after a restart, find the engine of an id this one learned.

// respAffinityMax bounds the ids kept (about 100 bytes each).
const respAffinityMax = 1 << 16

var (
	mPrevResponseRouted  = metrics.NewCounter(`infera_protocol_previous_response_total{result="known"}`)
	mPrevResponseUnknown = metrics.NewCounter(`infera_protocol_previous_response_total{result="unknown"}`)
)

// respAffinity maps response ids to the engine that answered them. The
// ids are kept per credential, each credential's oldest first; when the
// table is full a new id displaces the oldest id of the credential that
// holds the most (its own when it holds as many), so one credential
// cannot push out the ids of another that holds fewer.
type respAffinity struct {
	n      atomic.Int64 // entries, read without the lock
	mu     sync.Mutex
	limit  int // the ids kept; 0: respAffinityMax
	m      map[string]respEntry
	owners map[respCred]*respOwner
	heap   []*respOwner // a max-heap by ids held
	// records shares the table with the routers using the same state
	// store (respshared.go); nil: this router's memory only.
	records *govern.Records
}

// respEntry is what the table keeps of a response: the engine that answered
// it, and the user who asked for it ("" when no users are configured).
type respEntry struct {
	ref  fleet.Ref
	user string
}

// respCred is who asked for a response: the user (users configured),
// else the client's address (the global --api-key, or none, is shared).
// fetched is the one credential of the ids read back from the state store
// (respshared.go): they are found there again, so they are the first
// pushed out of a full table.
type respCred struct {
	user    string
	addr    netip.Addr
	fetched bool
}

// respOwner is a credential's ids, the oldest at head.
type respOwner struct {
	cred respCred
	ids  []string
	head int
	hi   int // its index in the heap
}

func (o *respOwner) held() int { return len(o.ids) - o.head }

// learn records the response id in head, the start of an answer, as
// answered by w for the credential c; with the state store, for ttl there
// (protocol.responses_state_ttl_s; 0: its default). It reports whether
// head held the answer's id, kept or not (one not kept ends the scan:
// respScan).
func (a *respAffinity) learn(head []byte, w *fleet.Worker, c respCred, ttl time.Duration) bool {
	var buf [respIDDecodeMax]byte
	id, found := responseID(&buf, head)
	if id == nil || w == nil {
		return found
	}
	e := respEntry{ref: w.Ref(), user: c.user}
	if a.records != nil {
		if _, ok := a.local(id); ok {
			return true // no round trip for an id known here (the first engine keeps it, below)
		}
		// Recorded before the answer's first bytes are relayed (the
		// caller writes them after learn), on purpose: a client that
		// reads the id and asks another router at once must find the
		// record there; in the background, the record raced the client
		// and lost behind a slow link to Redis
		// (TestAStoredResponsesIDReachesTheClientOnlyOnceRecorded).
		e = a.share(id, e, ttl)
	}
	a.keep(id, e, c)
	return true
}

// keep records e as what the table keeps of the response id, learned for
// the credential c, unless it keeps one already, and returns what it keeps.
func (a *respAffinity) keep(id []byte, e respEntry, c respCred) respEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = make(map[string]respEntry)
		a.owners = make(map[respCred]*respOwner)
	}
	if first, ok := a.m[string(id)]; ok {
		// The first engine keeps it: vLLM lets a client choose a
		// response's id (request_id), and a client that knew another's
		// id must not move that conversation's follow-ups to an engine
		// holding a response it planted.
		return first
	}
	key := string(id)
	o := a.owners[c]
	limit := a.limit
	if limit <= 0 {
		limit = respAffinityMax
	}
	if len(a.m) >= limit {
		v := a.heap[0]
		if o != nil && o.held() >= v.held() {
			v = o
		}
		a.evict(v)
		if v == o && o.held() == 0 {
			o = nil // evict dropped it
		}
	}
	if o == nil {
		o = &respOwner{cred: c, hi: len(a.heap)}
		a.owners[c] = o
		a.heap = append(a.heap, o)
	}
	o.ids = append(o.ids, key)
	a.up(o.hi)
	a.m[key] = e
	a.n.Store(int64(len(a.m)))
	return e
}

// evict forgets o's oldest id, and o when it holds none then. Lock must
// be held.
func (a *respAffinity) evict(o *respOwner) {
	delete(a.m, o.ids[o.head])
	o.ids[o.head] = ""
	if o.head++; o.head >= 64 && o.head*2 >= len(o.ids) {
		o.ids = o.ids[:copy(o.ids, o.ids[o.head:])]
		o.head = 0
	}
	if o.held() > 0 {
		a.down(o.hi)
		return
	}
	delete(a.owners, o.cred)
	last := len(a.heap) - 1
	i := o.hi
	a.swap(i, last)
	a.heap[last] = nil
	a.heap = a.heap[:last]
	if i < last {
		a.down(i)
		a.up(i)
	}
}

func (a *respAffinity) swap(i, j int) {
	a.heap[i], a.heap[j] = a.heap[j], a.heap[i]
	a.heap[i].hi, a.heap[j].hi = i, j
}

func (a *respAffinity) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if a.heap[p].held() >= a.heap[i].held() {
			return
		}
		a.swap(i, p)
		i = p
	}
}

func (a *respAffinity) down(i int) {
	for {
		l, big := 2*i+1, i
		if l < len(a.heap) && a.heap[l].held() > a.heap[big].held() {
			big = l
		}
		if r := l + 1; r < len(a.heap) && a.heap[r].held() > a.heap[big].held() {
			big = r
		}
		if big == i {
			return
		}
		a.swap(i, big)
		i = big
	}
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
	cred  respCred
	ttl   time.Duration
	head  []byte
	reads int
}

// start learns the id in an answer's first read from w, or starts
// gathering its head when the first read holds none (an id there but not
// kept ends it: no later read can change it). ttl is learn's.
func (sc *respScan) start(a *respAffinity, first []byte, w *fleet.Worker, c respCred, ttl time.Duration) {
	if a.learn(first, w, c, ttl) || len(first) >= respScanMax {
		return
	}
	sc.a, sc.w, sc.cred, sc.ttl, sc.reads = a, w, c, ttl, 0
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
	if sc.a.learn(sc.head, sc.w, sc.cred, sc.ttl) || len(sc.head) >= respScanMax || sc.reads >= respScanReads {
		sc.a, sc.w, sc.cred = nil, nil, respCred{}
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

// lookup returns what this router's memory keeps of the response a
// Responses body's previous_response_id names (the zero entry when it
// names none or one not held there: the state store is asked after the
// request's admission, previousShared), that id as the engine reads it
// (decoded into buf; nil when the body names none), and whether the body
// asks the engine not to store its answer ("store" false, or 0, "false", "off"... as jsonscan.LaxBool reads
// it, or null: nothing to learn from the answer; absent is true).
func (a *respAffinity) lookup(buf *[respIDDecodeMax]byte, body []byte) (e respEntry, id []byte, noStore bool) {
	var prev []byte
	forEachField(body, skipSpace(body, 0), func(k []byte, vs, ve int) error {
		switch string(k) {
		case "previous_response_id":
			prev = nil
			if body[vs] == '"' {
				prev = body[vs+1 : ve-1]
			}
		case "store":
			// The last copy counts, as the engine's JSON decoder reads
			// it, and as a lax bool, as vLLM's pydantic model reads it:
			// 0, "false", "off", "No" are false too. vLLM stores only
			// "if request.store" (serving_responses.py): null (None)
			// is not stored either, nor a value it refuses (400).
			noStore = jsonscan.LaxBool(body[vs:ve]) != 't'
		}
		return nil
	})
	if len(prev) == 0 {
		return respEntry{}, nil, noStore
	}
	// The engine decodes the id's escapes ("resp_\u0041..." is
	// "resp_A..."): look it up decoded. The ids kept are decoded, at most
	// respIDMax bytes (responseID), so a longer one is not among them, and
	// the caller's buffer on the stack holds any that may be.
	id = prev
	if hasEscape(id) {
		id = prev[:0] // decodes to more than respIDMax bytes: not kept
		if len(prev) <= len(buf) {
			if d := unescape(buf[:0], prev); len(d) <= respIDMax {
				id = d
			}
		}
	}
	if len(id) > 0 {
		e, _ = a.local(id)
	}
	return e, id, noStore
}

var (
	errFound    = errors.New("found")
	keyResponse = []byte(`"response"`)
)

// respIDMax bounds the ids kept: a longer one (decoded) is not learned, and
// a follow-up naming one is routed as any request.
const respIDMax = 128

// respIDDecodeMax is the size of the buffer an escaped id is decoded into,
// on the stack. A JSON escape never decodes to more bytes than it takes
// (\uXXXX, 6 bytes, is at most 3 in UTF-8), so contents of at most this
// many bytes decode in it without growing it onto the heap; and no decoded
// byte takes more than 6, so longer contents decode to more than
// respIDMax bytes.
const respIDDecodeMax = 6 * respIDMax

// responseID returns the id of the Response an answer's first read holds:
// a whole Response's top-level "id", or in a stream the "id" of the first
// event's "response" object (response.created), decoded as the client and
// the engine read it ("resp_\u0061bc" is resp_abc; escapes are decoded into
// buf, on the caller's stack). nil when there is none, it is cut, or it is
// not an id kept (1-respIDMax visible ASCII characters once decoded);
// found reports whether b held the answer's id whole, kept or not.
func responseID(buf *[respIDDecodeMax]byte, b []byte) (id []byte, found bool) {
	i := skipSpace(b, 0)
	if i >= len(b) {
		return nil, false
	}
	if b[i] != '{' {
		k := jsonscan.IndexKey(b, keyResponse)
		if k < 0 {
			return nil, false
		}
		i = skipSpace(b, k+len(keyResponse))
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		if i = skipSpace(b, i+1); i >= len(b) || b[i] != '{' {
			return nil, false
		}
	}
	forEachField(b, i, func(k []byte, vs, ve int) error {
		if string(k) == "id" {
			if b[vs] == '"' {
				id = b[vs+1 : ve-1]
			}
			found = true
			return errFound
		}
		return nil
	})
	if hasEscape(id) {
		// An escape is at most 6 bytes for one: longer contents decode
		// to more than respIDMax bytes.
		if len(id) > len(buf) {
			return nil, found
		}
		d := unescape(buf[:0], id) // in buf: decoding never grows
		if len(d) > respIDMax {
			return nil, found // not kept
		}
		id = d
	}
	if !validRequestID(id) {
		return nil, found
	}
	return id, found
}

// find returns what the table keeps of the response id (decoded, as a
// request path is), and whether it is known: in this router's memory
// first, else in the state store (respshared.go).
func (a *respAffinity) find(id []byte) (respEntry, bool) {
	if e, ok := a.local(id); ok || a.records == nil {
		return e, ok
	}
	return a.fetch(id)
}

// shared reports whether the response id, not in this router's memory,
// may be in the state store: there is one, and the id is one learn could
// have recorded.
func (a *respAffinity) shared(id []byte) bool {
	return a.records != nil && validRequestID(id) && len(id) <= respIDMax
}

// local is find in this router's memory only.
func (a *respAffinity) local(id []byte) (respEntry, bool) {
	if a.n.Load() == 0 {
		return respEntry{}, false
	}
	a.mu.Lock()
	e, ok := a.m[string(id)]
	a.mu.Unlock()
	return e, ok
}
