package fleet

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A discovery record is input from the network: fields routing and the KV
// subscriber would trust are bounded, and credentials never enter the
// fleet (they would be logged and shown).
func TestAHostileRecordIsRefused(t *testing.T) {
	ok := Record{ID: "w1", URL: "http://127.0.0.1:8000", Models: []string{"m"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a plain record: %v", err)
	}
	for name, edit := range map[string]func(r *Record){
		"block_size 2^62":             func(r *Record) { r.BlockSize = 1 << 62 },
		"negative block_size":         func(r *Record) { r.BlockSize = -5 },
		"id with a newline":           func(r *Record) { r.ID = "d\n\x00" },
		"id with a space":             func(r *Record) { r.ID = "a b" },
		"id too long":                 func(r *Record) { r.ID = strings.Repeat("x", 300) },
		"url with credentials":        func(r *Record) { r.URL = "http://admin:s3cret@127.0.0.1:8000" },
		"kv endpoint not zmq":         func(r *Record) { r.KVEventsEndpoint = "http://127.0.0.1:5557" },
		"kv port past 65535":          func(r *Record) { r.KVEventsEndpoint = "tcp://127.0.0.1:65535"; r.DPSize = 2 },
		"kv replay port not number":   func(r *Record) { r.KVReplayEndpoint = "tcp://127.0.0.1:x" },
		"too many models":             func(r *Record) { r.Models = make([]string, 2000) },
		"an empty model name":         func(r *Record) { r.Models = []string{"m", ""} },
		"a model name with a newline": func(r *Record) { r.Models = []string{"m\nlevel=ERROR"} },
		"a model name of 1 KB":        func(r *Record) { r.Models = []string{strings.Repeat("m", 1024)} },
	} {
		r := ok
		edit(&r)
		err := r.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
	for _, ep := range []string{"tcp://*:5557", "tcp://127.0.0.1:5557", "ipc:///tmp/kv"} {
		r := ok
		r.KVEventsEndpoint, r.DPSize = ep, 4
		if err := r.Validate(); err != nil {
			t.Errorf("endpoint %s: %v", ep, err)
		}
	}
}

// A model listed twice in a record counts once: the worker is one
// candidate for it, not two.
func TestAModelListedTwiceMakesOneCandidate(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	if errs := f.Sync([]Record{{ID: "w1", URL: "http://127.0.0.1:8000", Models: []string{"m", "m", "n", "m"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if n := len(f.View().ByModel["m"]); n != 1 {
		t.Fatalf("the worker is %d candidates for m", n)
	}
}

// refuseHook refuses workers while refuse is set (as discovery's
// AgreementHook refuses a record whose transports disagree).
type refuseHook struct{ refuse bool }

func (h *refuseHook) WorkerAdded(w *Worker) error {
	if h.refuse {
		return errors.New("transport mismatch")
	}
	return nil
}

func (h *refuseHook) WorkerRemoved(w *Worker) {}

// metricLine returns the line of f's metrics that starts with prefix, or "".
func metricLine(f *Fleet, prefix string) string {
	var b bytes.Buffer
	f.ms.WritePrometheus(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// A worker a hook refuses is not in the fleet (docs/admin.md: "Workers
// refused at registration ... are not in the fleet"): its per-worker
// gauges must not be left behind, and above all must not stand in for the
// worker once a later record of the same id is admitted. They used to:
// the gauges were registered before the hooks ran and never unregistered
// on a refusal, so the refused worker was exported as routable, and the
// admitted one's GetOrCreateGauge got back the gauges reading the refused
// worker (no load, breaker closed) for as long as it lived.
func TestARefusedWorkerLeavesNoGaugesBehind(t *testing.T) {
	f := NewFleet(BreakerConfig{Threshold: 1, Cooldown: time.Minute, MaxCooldown: time.Minute})
	defer f.Close()
	h := &refuseHook{refuse: true}
	f.AddHook(h)
	rec := Record{ID: "w1", URL: "http://127.0.0.1:9001", Models: []string{"m"}, KVEventTransport: "zmq"}
	if err := f.Upsert(rec); err == nil {
		t.Fatal("the hook's refusal was not reported")
	}
	if l := metricLine(f, `infera_router_worker_`); l != "" {
		t.Errorf("refused worker still exported: %q", l)
	}
	// The operator fixes the record; the worker joins.
	h.refuse = false
	rec.KVEventTransport = ""
	if err := f.Upsert(rec); err != nil {
		t.Fatal(err)
	}
	w := f.Get("w1")
	w.Acquire(100, 50, 1)
	w.Acquire(100, 50, 1)
	w.Fault(time.Now().UnixNano(), false) // threshold 1: the breaker opens
	for _, want := range []string{
		`infera_router_worker_routable{worker="w1"} 1`,
		`infera_router_worker_active_requests{worker="w1"} 2`,
		`infera_router_worker_active_tokens{worker="w1"} 200`,
		`infera_router_worker_breaker_state{worker="w1"} 2`,
		`infera_router_worker_failures_total{worker="w1"} 1`,
	} {
		name := want[:strings.LastIndexByte(want, ' ')+1]
		if got := metricLine(f, name); got != want {
			t.Errorf("admitted worker: %q, want %q", got, want)
		}
	}
	// Removed, it leaves no series either.
	f.Remove("w1")
	if l := metricLine(f, `infera_router_worker_`); l != "" {
		t.Errorf("removed worker still exported: %q", l)
	}
}

// A worker url with an empty or out-of-range port was admitted and
// routed to: "http://127.0.0.1:" became the address 127.0.0.1::80, and
// ports 0 and 99999 cannot be dialled, so every request picked for the
// worker failed to connect (503 no_workers_reachable when it was the only
// one). Such a record is refused as a bad one.
func TestAWorkerURLWithAnUnusablePortIsRefused(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:", "http://127.0.0.1:0", "http://127.0.0.1:99999", "https://[::1]:", "http://[::1]:65536"} {
		r := Record{ID: "w1", URL: u, Models: []string{"m"}}
		if err := r.Validate(); err == nil {
			t.Errorf("%s: accepted", u)
		}
	}
	for _, u := range []string{"http://127.0.0.1", "http://127.0.0.1:1", "http://127.0.0.1:65535", "https://[::1]", "http://[::1]:8000", "http://engine.local:8100/"} {
		r := Record{ID: "w1", URL: u, Models: []string{"m"}}
		if err := r.Validate(); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// The router sends the engine's own paths to a worker's host:port. A url
// given as an OpenAI base URL (http://host:8000/v1) had its models asked at
// /v1/v1/models and never served (503 no_workers for good); its /v1 is
// dropped. Another path was ignored by requests but not by that lookup: it
// is refused, but for a worker reached over NATS (its sidecar talks to the
// engine at the URL as given).
func TestAWorkerURLsPathIsItsEnginesRootOrRefused(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000/v1":  "http://127.0.0.1:8000",
		"http://127.0.0.1:8000/v1/": "http://127.0.0.1:8000",
		"https://engine:8443/":      "https://engine:8443/",
		"http://127.0.0.1:8000":     "http://127.0.0.1:8000",
	} {
		r := Record{ID: "w1", URL: in, Models: []string{"m"}}
		if err := r.Validate(); err != nil || r.URL != want {
			t.Errorf("%s: %q, %v; want %q", in, r.URL, err, want)
		}
	}
	for _, u := range []string{"http://127.0.0.1:8000/engine-a", "http://127.0.0.1:8000/v1/chat/completions", "http://127.0.0.1:8000/v1?x=1", "http://127.0.0.1:8000?key=1"} {
		r := Record{ID: "w1", URL: u, Models: []string{"m"}}
		if err := r.Validate(); err == nil {
			t.Errorf("%s: accepted", u)
		}
		r = Record{ID: "w1", URL: u, Models: []string{"m"}, RequestTransport: "nats"}
		if err := r.Validate(); err != nil || r.URL != u {
			t.Errorf("%s over NATS: %q, %v", u, r.URL, err)
		}
	}
}

// parseLabelValue reads a Prometheus text-format label value after its
// opening quote as Prometheus's parser (expfmt) does: \\, \" and \n are
// the only escapes; any other one refuses the whole scrape.
func parseLabelValue(s string) (v string, rest string, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 == len(s) {
				return "", "", errors.New("unterminated escape")
			}
			i++
			switch s[i] {
			case '\\', '"':
				b.WriteByte(s[i])
			case 'n':
				b.WriteByte('\n')
			default:
				return "", "", errors.New(`invalid escape sequence \` + string(s[i]))
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("unterminated label value")
}

// A worker id is any run of 1-253 bytes without spaces or ASCII control
// characters, so it may hold quotes, backslashes and Unicode that is not
// printable (a no-break space, a line separator, a zero-width space from a
// copied annotation). Every per-worker series names it in a label value
// Prometheus reads back as the id: %q wrote such runes as \u00a0, an
// escape the text format does not have (expfmt refuses the whole scrape;
// Prometheus's own scraper keeps the six characters, so the label was not
// the id /health and the access log show).
func TestAWorkerIDOfAnyRunesIsExportedAsALabelPrometheusReadsBack(t *testing.T) {
	f := NewFleet(BreakerConfig{Threshold: 1, Cooldown: time.Minute, MaxCooldown: time.Minute})
	defer f.Close()
	ids := []string{"w\u00a0nbsp", "w\u2028ls", "w\u200bzw", "q\"uote", `back\slash`, "w\u0085nel", "é"}
	for i, id := range ids {
		r := Record{ID: id, URL: "http://127.0.0.1:" + strconv.Itoa(9001+i), Models: []string{"m"}}
		if err := f.Upsert(r); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
	}
	var b bytes.Buffer
	f.ms.WritePrometheus(&b)
	seen := map[string]int{}
	for _, l := range strings.Split(b.String(), "\n") {
		i := strings.Index(l, `{worker="`)
		if !strings.HasPrefix(l, "infera_router_worker_") || i < 0 {
			continue
		}
		v, rest, err := parseLabelValue(l[i+len(`{worker="`):])
		if err != nil {
			t.Fatalf("%v in %q", err, l)
		}
		if !strings.HasPrefix(rest, "} ") {
			t.Fatalf("label value not closed where the id ends: %q", l)
		}
		seen[v]++
	}
	for _, id := range ids {
		if seen[id] != 8 { // 2 counters, 5 gauges, breaker trips
			t.Errorf("worker %q: %d series read back with its id, want 8 (%v)", id, seen[id], seen)
		}
	}
}
