package proxy

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// The Responses table shared through the state store (docs/protocols.md,
// "Stored responses across routers"): with --state redis every id a router
// learns is also recorded in Redis, with its engine (worker id and
// address) and its user, so that a retrieve, a cancel or a follow-up sent
// to another router, or to this one after a restart, goes to the engine
// holding the response. This router's memory stays the first lookup (no
// round trip for an id it knows); an id found in Redis is kept in memory
// too (under respCred.fetched). The first record of an id stays, across
// routers as in one (learn): a create that names an id another router
// recorded keeps that record's engine and user. No key is stored: the
// user is its name. A Redis error on a record leaves the id in this
// router's memory only; on a lookup the id is unknown here, as without
// Redis (a retrieve or cancel is 404, a follow-up routed as any request);
// both are counted.

// respSharedPrefix prefixes the records' keys (after --state's prefix).
const respSharedPrefix = "resp:"

var (
	mRespSharedRecordErrors = metrics.NewCounter(`infera_protocol_response_state_errors_total{op="record"}`)
	mRespSharedLookupErrors = metrics.NewCounter(`infera_protocol_response_state_errors_total{op="lookup"}`)
	mRespSharedFound        = metrics.NewCounter(`infera_protocol_response_state_lookups_total{result="found"}`)
	mRespSharedMissing      = metrics.NewCounter(`infera_protocol_response_state_lookups_total{result="missing"}`)
)

// respRecord is an id's record in Redis.
type respRecord struct {
	Worker string `json:"worker"`
	Addr   string `json:"addr"`
	User   string `json:"user,omitempty"`
}

var errBadRecord = errors.New("a response record without its engine")

func decodeRespRecord(b []byte) (respEntry, error) {
	var r respRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return respEntry{}, err
	}
	if r.Worker == "" {
		return respEntry{}, errBadRecord
	}
	return respEntry{ref: fleet.Ref{ID: r.Worker, Addr: r.Addr}, user: r.User}, nil
}

// share records e for the response id in Redis for ttl (0: the default of
// protocol.responses_state_ttl_s) unless Redis has a record of it, and
// returns the entry to keep: the record Redis holds (e, or an earlier
// router's), or e when Redis cannot be asked.
//
// How long: the memory table keeps an id until 65,536 newer ones push it
// out (hours to days, depending on the traffic) and the engine keeps a
// response as long as it runs (vLLM) or for its last 4,096 (the simulated
// engine); the default day covers a conversation's follow-ups and a
// background response's polls while bounding Redis's memory to a day's
// creates (about 250 bytes each).
func (a *respAffinity) share(id []byte, e respEntry, ttl time.Duration) respEntry {
	if ttl <= 0 {
		ttl = config.DefaultResponsesStateTTLSeconds * time.Second
	}
	v, err := json.Marshal(respRecord{Worker: e.ref.ID, Addr: e.ref.Addr, User: e.user})
	if err != nil {
		panic("BUG: a response record does not encode: " + err.Error())
	}
	got, err := a.records.Keep(respSharedPrefix+string(id), v, ttl)
	if err == nil {
		var first respEntry
		if first, err = decodeRespRecord(got); err == nil {
			return first
		}
	}
	mRespSharedRecordErrors.Inc()
	serverLog.Warn("cannot record a response id in the state store: other routers will not find it", "err", err)
	return e
}

// fetch looks the response id up in Redis, and keeps what it finds in
// memory too.
func (a *respAffinity) fetch(id []byte) (respEntry, bool) {
	if !a.shared(id) {
		return respEntry{}, false // never learned, so never recorded
	}
	b, err := a.records.Find(respSharedPrefix + string(id))
	var e respEntry
	if err == nil && b != nil {
		e, err = decodeRespRecord(b)
	}
	if err != nil {
		mRespSharedLookupErrors.Inc()
		serverLog.Warn("cannot look a response id up in the state store: answered as unknown", "err", err)
		return respEntry{}, false
	}
	if b == nil {
		mRespSharedMissing.Inc()
		return respEntry{}, false
	}
	mRespSharedFound.Inc()
	// Another request may have kept it meanwhile: the first entry stays.
	return a.keep(id, e, respCred{fetched: true}), true
}

// previousShared looks a passthrough follow-up's previous_response_id
// that this router's memory does not hold (rs.proto.prev, left by
// frontDoor) up in Redis, once the request is admitted: a lookup is a
// round trip, so made-up ids cost Redis no more lookups than the requests
// their user's limits admit (a refused one is answered 429 before it asks,
// as a retrieve of such an id is: respstored.go). A deferred admission
// runs now, alone. An id Redis holds for another user is answered 404, as
// one in memory is before any limit is asked; the request is answered
// before anything is committed, so its admission is given back when its
// state is released (govState.end) and the refusal does not count against
// the user's limits either. An id Redis does not hold is routed as any
// request. ok is false when the request was answered.
func (s *Server) previousShared(ctx *fasthttp.RequestCtx, rs *reqState) bool {
	if !s.admitPending(ctx, rs) {
		return false
	}
	id := rs.proto.prev
	e, ok := s.respAff.fetch(id)
	if !ok {
		mPrevResponseUnknown.Inc()
		return true
	}
	if e.user != "" && (rs.gov.user == nil || rs.gov.user.Name() != e.user) {
		mBadRequests.Inc()
		writeResponseNotFound(ctx, id)
		return false
	}
	mPrevResponseRouted.Inc()
	rs.sreq.Prefer = e.ref
	return true
}
