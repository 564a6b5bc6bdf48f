package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// BackendStatic names the static backend: workers given by --workers and
// the config file's workers list.
const BackendStatic = "static"

// Static keeps a fleet equal to the static worker list: --workers (with
// --worker-model) plus the config snapshot's workers. Workers listed
// without models are asked for their /v1/models, 64 at a time, each ask
// bounded by ConnectTimeout (its dial) and ModelsTimeout (the whole
// exchange); until they answer each is asked again after its own backoff
// (1-5 s, see Run), and a worker that already learned its models keeps
// them through a transient /v1/models failure. Learned models are asked
// again every StaticModelsRefresh: an engine restarted behind the same URL
// with another model is then routed to for the new one.
type Static struct {
	// ConnectTimeout bounds dialing a worker to ask its /v1/models (the
	// router's --connect-timeout); default 3 s. Set before Apply.
	ConnectTimeout time.Duration
	// ModelsTimeout bounds one /v1/models exchange, its dial included,
	// and so the wait of Apply at start, however many workers do not
	// answer; default StaticModelsTimeout, and never below ConnectTimeout.
	// Set before Apply.
	ModelsTimeout time.Duration

	fl      *fleet.Fleet
	client  *fasthttp.Client
	workers []string
	models  []string
	mu      sync.Mutex    // serializes syncs; never held while asking a worker
	wake    chan struct{} // Run: ask the workers without models now
	stop    chan struct{}
	once    sync.Once
	// retry and retryMax bound Run's backoff for a worker whose models
	// are not known yet, refresh is its period for those that learned
	// theirs (tests shorten them).
	retry, retryMax, refresh time.Duration
}

// StaticModelsRefresh is how often Run asks the static workers listed
// without models for their /v1/models again once they answered.
const StaticModelsRefresh = 30 * time.Second

// StaticModelsTimeout is Static.ModelsTimeout's default.
const StaticModelsTimeout = 3 * time.Second

var _ Backend = (*Static)(nil)

// NewStatic returns the static backend for fl.
func NewStatic(fl *fleet.Fleet, workers, workerModels []string) *Static {
	s := &Static{fl: fl, workers: workers, models: workerModels, wake: make(chan struct{}, 1), stop: make(chan struct{}),
		retry: time.Second, retryMax: 5 * time.Second, refresh: StaticModelsRefresh}
	s.client = &fasthttp.Client{
		// The dial takes the request's remaining time: bounded by it
		// and by ConnectTimeout. A host that never answers the SYN
		// held the ask for 3 s whatever --connect-timeout said.
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			return (&net.Dialer{Timeout: min(timeout, s.connectTimeout())}).Dial("tcp", addr)
		},
		MaxIdemponentCallAttempts: 1, // Run asks again
		MaxResponseBodySize:       4 << 20,
	}
	return s
}

func (s *Static) connectTimeout() time.Duration {
	if s.ConnectTimeout > 0 {
		return s.ConnectTimeout
	}
	return 3 * time.Second
}

func (s *Static) modelsTimeout() time.Duration {
	t := s.ModelsTimeout
	if t <= 0 {
		t = StaticModelsTimeout
	}
	return max(t, s.connectTimeout())
}

// Apply makes the fleet the static list under cfg, first asking the
// workers listed without models for them (at start): it waits
// ModelsTimeout at most, however many do not answer, and asks every one of
// them before then (fetchModels). A worker that has not answered joins
// without models and Run asks it again.
func (s *Static) Apply(cfg *config.Config) {
	fetched := map[string]modelList{}
	s.fetchModels(missingModels(StaticRecords(s.workers, s.models, cfg), s.fl), time.Now().Add(s.modelsTimeout()), func(url string, ml modelList) {
		fetched[url] = ml
	})
	s.apply(func() *config.Config { return cfg }, fetched)
}

// Changed makes the fleet the static list under cfg without waiting on any
// worker (config change hooks run under the config store's lock, and a
// worker may take seconds to answer or never do): a worker listed without
// models that is not known yet joins without them, and Run asks it at
// once.
func (s *Static) Changed(cfg *config.Config) {
	if s.apply(func() *config.Config { return cfg }, nil) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// apply syncs the fleet with the records under the config cfg returns,
// called under the lock (so that a sync with an older config never
// follows one with a newer); a record without models takes fetched's for
// its URL, else (not asked, or no answer) those of the live worker at the
// same URL, and with them the engine's max_model_len. It reports whether
// some worker was left without models.
func (s *Static) apply(cfg func() *config.Config, fetched map[string]modelList) (missing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := StaticRecords(s.workers, s.models, cfg())
	for i := range rs {
		if len(rs[i].Models) == 0 {
			ml := fetched[rs[i].URL]
			if len(ml.ids) == 0 {
				ml = knownModels(s.fl, &rs[i])
			}
			rs[i].Models, rs[i].MaxModelLen = ml.ids, ml.maxLen
		}
		missing = missing || len(rs[i].Models) == 0
	}
	for _, err := range s.fl.Sync(rs) {
		slog.Error("static worker skipped", "err", err)
	}
	return missing
}

// knownModels returns the models of the live worker r names, if it has the
// same URL.
func knownModels(fl *fleet.Fleet, r *fleet.Record) modelList {
	if w := fl.Get(r.ID); w != nil && w.URL == r.URL && len(w.Models) > 0 {
		return modelList{w.Models, w.MaxModelLen()}
	}
	return modelList{}
}

// modelList is what an engine's /v1/models says: its model ids, and the
// largest max_model_len among them (vLLM's ModelCard; 0 when none says).
type modelList struct {
	ids    []string
	maxLen int
}

// missingModels returns the URLs of the records without models that fl
// does not know the models of.
func missingModels(rs []fleet.Record, fl *fleet.Fleet) []string {
	var urls []string
	seen := map[string]bool{}
	for i := range rs {
		r := &rs[i]
		if len(r.Models) > 0 || seen[r.URL] || knownModels(fl, r).ids != nil {
			continue
		}
		seen[r.URL] = true
		urls = append(urls, r.URL)
	}
	return urls
}

// fetchModels asks each URL for its models, up to fetchParallel at once,
// each ask bounded by ModelsTimeout (so a worker that never answers holds
// up no other beyond that), and calls got with each answer as it comes
// (from the calling goroutine, holding no lock). With a non-zero deadline
// it returns then at the latest, and each ask is also bounded by its share
// of the time left (see askTimeout), so that every URL is asked before the
// deadline however many never answer: with the whole deadline per ask, 64
// that never answered held every slot until it passed, and the URLs after
// them were not asked. The asks still running at the deadline are left to
// end on their own timeout, their answers dropped.
func (s *Static) fetchModels(urls []string, deadline time.Time, got func(url string, ml modelList)) {
	if len(urls) == 0 {
		return
	}
	type answer struct {
		url    string
		models modelList
	}
	answers := make(chan answer, len(urls)) // never blocks a late ask
	sem := make(chan struct{}, fetchParallel)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for i, u := range urls {
			select {
			case sem <- struct{}{}:
			case <-quit:
				return
			}
			timeout := s.modelsTimeout()
			if !deadline.IsZero() {
				timeout = askTimeout(timeout, time.Until(deadline), len(urls)-i)
			}
			go func() {
				defer func() { <-sem }()
				answers <- answer{u, s.fetch(u, timeout)}
			}()
		}
	}()
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	for range urls {
		select {
		case a := <-answers:
			got(a.url, a.models)
		case <-timeout:
			return
		}
	}
}

// fetchParallel bounds the /v1/models requests in flight at once.
const fetchParallel = 64

// minAsk is the least time an ask made before a deadline is given.
const minAsk = 100 * time.Millisecond

// askTimeout bounds an ask begun with left before the deadline and
// unasked URLs (this one included) still to ask, fetchParallel at once:
// full, the ask's own timeout, unless the waves of fetchParallel asks
// still needed, each taking its whole timeout, would not all begin before
// the deadline; then an equal share of the time left for each wave (at
// least minAsk). An engine that answers does so in milliseconds; one that
// needs longer than its share at start is asked again by Run, with its
// full timeout.
func askTimeout(full, left time.Duration, unasked int) time.Duration {
	waves := (unasked + fetchParallel - 1) / fetchParallel
	return max(min(full, left/time.Duration(waves)), minAsk)
}

// Run asks, in the background until stopped, the static workers listed
// without models, each on its own schedule, so that however many do not
// answer, one that comes up is asked within seconds. A worker whose models
// are not known is asked at once (at Run's start, and after a Changed that
// added it), then after a backoff that doubles from retry (1 s) to
// retryMax (5 s), each wait drawn between its half and itself (workers
// that failed together are not asked together again); one that learned
// its models is asked again every refresh (a failed ask keeps them). At
// most fetchParallel asks run at once, each bounded by ModelsTimeout, and
// fastAsks of them are kept for the workers whose last ask of Run ended
// within slowAsk (refused at once, as an engine not started yet is, or
// answering): those asked for the first time, and those whose last ask
// held its slot longer (a host dropping SYNs, an engine that accepts and
// never answers), take the others, so a worker that failed fast is never
// queued behind the slow ones. Due asks start earliest first, in list
// order when due together. load returns
// the current config snapshot; each new answer is synced into the fleet
// with the config current when it came (an answer naming the models
// already known changes nothing).
//
// The asks were made in rounds: every 5 s all the workers without models,
// 64 at a time, the next round only once the slowest ask of this one had
// ended. With hundreds that hung, a round took a whole ModelsTimeout per 64
// of them, and an engine that came up waited for the rest of the round and
// its turn in the next (TestAStaticWorkerThatComesUpIsAskedPromptlyWhileHundredsHang).
func (s *Static) Run(load func() *config.Config) {
	asks := map[string]*staticAsk{}
	// Each ask sends its one answer here, without blocking: the buffer
	// holds as many as may run at once, so none is left blocked when Run
	// stops.
	answers := make(chan staticAnswer, fetchParallel)
	var running, runningSlow int
	timer := time.NewTimer(0)
	defer timer.Stop()
	var due []*staticAsk
	rescan := true
	for {
		now := time.Now()
		if rescan {
			s.scanAsks(asks, load(), now)
			rescan = false
		}
		due = due[:0]
		for _, a := range asks {
			if !a.busy && !a.next.After(now) {
				due = append(due, a)
			}
		}
		slices.SortFunc(due, func(a, b *staticAsk) int {
			if c := a.next.Compare(b.next); c != 0 {
				return c
			}
			return a.order - b.order
		})
		for _, a := range due {
			slow := !a.fast
			if running == fetchParallel || slow && runningSlow == fetchParallel-fastAsks {
				continue // it starts when an ask ends
			}
			a.busy = true
			running++
			if slow {
				runningSlow++
			}
			go func(url string, slow bool) {
				start := time.Now()
				ml := s.fetch(url, s.modelsTimeout())
				answers <- staticAnswer{url: url, ml: ml, took: time.Since(start), slow: slow}
			}(a.url, slow)
		}
		// Wake at the next ask due that is not running (one queued for a
		// slot starts when an ask ends), and every retryMax at least to
		// read the workers' list again.
		wait := s.retryMax
		for _, a := range asks {
			if !a.busy && a.next.After(now) {
				wait = min(wait, a.next.Sub(now))
			}
		}
		timer.Reset(wait)
		select {
		case <-s.stop:
			return
		case <-timer.C:
			rescan = true
		case <-s.wake:
			rescan = true
		case an := <-answers:
			running--
			if an.slow {
				runningSlow--
			}
			if a := asks[an.url]; a != nil && a.busy {
				s.answered(a, an, load, time.Now())
			}
		}
	}
}

// staticAsk is Run's schedule for one static worker URL listed without
// models.
type staticAsk struct {
	id    string // the worker's, whose known models a failed ask keeps
	url   string
	order int       // its place in the list
	next  time.Time // when to ask it next
	fails int       // asks failed in a row
	fast  bool      // its last ask ended within slowAsk
	busy  bool      // an ask of it is running
}

// staticAnswer is what one ask of Run got.
type staticAnswer struct {
	url  string
	ml   modelList
	took time.Duration
	slow bool // it ran as a slow ask
}

// fastAsks is the part of fetchParallel kept for the asks of workers whose
// last ask ended within slowAsk.
const fastAsks = 16

// slowAsk is how long an ask may hold its slot for its worker to be
// asked next among the fast ones: an engine that is up answers, and one
// that is not listening is refused, in milliseconds.
const slowAsk = 500 * time.Millisecond

// scanAsks makes asks the URLs of cfg's static records without models: a
// new URL is asked at once, unless its worker knows its models (a
// --workers entry that answered Apply): then after refresh; a URL no
// longer listed is dropped (the answer of its running ask is ignored).
func (s *Static) scanAsks(asks map[string]*staticAsk, cfg *config.Config, now time.Time) {
	rs := StaticRecords(s.workers, s.models, cfg)
	listed := make(map[string]bool, len(asks))
	for i := range rs {
		r := &rs[i]
		if len(r.Models) > 0 || listed[r.URL] {
			continue
		}
		listed[r.URL] = true
		if a := asks[r.URL]; a != nil {
			a.order = i
			continue
		}
		a := &staticAsk{id: r.ID, url: r.URL, order: i, next: now}
		if knownModels(s.fl, r).ids != nil {
			a.next = now.Add(s.refresh)
		}
		asks[r.URL] = a
	}
	for u := range asks {
		if !listed[u] {
			delete(asks, u)
		}
	}
}

// answered schedules a's next ask after an, and syncs the fleet with a new
// answer.
func (s *Static) answered(a *staticAsk, an staticAnswer, load func() *config.Config, now time.Time) {
	a.busy, a.fast = false, an.took < slowAsk
	known := knownModels(s.fl, &fleet.Record{ID: a.id, URL: a.url})
	switch {
	case len(an.ml.ids) > 0:
		a.fails = 0
		a.next = now.Add(s.refresh)
	case known.ids != nil:
		// A transient failure: it keeps its models, asked again at
		// its refresh.
		a.next = now.Add(s.refresh)
		return
	default:
		a.fails++
		a.next = now.Add(s.backoff(a.fails))
		return
	}
	if slices.Equal(an.ml.ids, known.ids) && an.ml.maxLen == known.maxLen {
		return
	}
	if known.ids != nil {
		slog.Info("static worker's models changed", "url", a.url, "was", known.ids, "now", an.ml.ids, "max_model_len", an.ml.maxLen)
	}
	s.apply(load, map[string]modelList{a.url: an.ml})
}

// backoff is the wait before the next ask of a worker whose asks failed
// fails times in a row: retry doubled for each failure after the first,
// at most retryMax, drawn between its half and itself.
func (s *Static) backoff(fails int) time.Duration {
	d := s.retryMax
	if fails < 32 {
		d = min(s.retry<<(fails-1), s.retryMax)
	}
	return d/2 + rand.N(d/2+1)
}

// Start implements Backend (the list is applied by Apply).
func (s *Static) Start() {}

// WaitSynced implements Backend: the static list is always in sync.
func (s *Static) WaitSynced(ctx context.Context) error { return nil }

// Health implements Backend.
func (s *Static) Health() (bool, string) { return true, "static worker list" }

// Close stops Run.
func (s *Static) Close() { s.once.Do(func() { close(s.stop) }) }

// StaticRecords builds worker records from --workers entries (URL or
// id=URL), --worker-model, and the config's workers; the first entry for an
// id wins.
func StaticRecords(workers, workerModels []string, cfg *config.Config) []fleet.Record {
	var rs []fleet.Record
	seen := map[string]bool{}
	for _, spec := range workers {
		id, u := workerSpec(spec)
		if id == "" {
			continue
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		rs = append(rs, fleet.Record{ID: id, URL: fleet.EngineRoot(strings.TrimRight(u, "/")), Models: workerModels, Status: fleet.StatusActive})
	}
	for i := range cfg.Workers {
		r := cfg.Workers[i].Record()
		r.URL = fleet.EngineRoot(r.URL) // as Validate leaves it: models are asked, and known, by it
		if seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		rs = append(rs, r)
	}
	return rs
}

// CheckWorkerFlag refuses --workers (INFERA_WORKERS) entries the fleet
// could not take, or an id given twice, as the config file's workers are
// refused: a bad entry was logged and skipped, and the router started with
// part of its fleet, or none, as if all were well.
func CheckWorkerFlag(workers []string) error {
	seen := map[string]bool{}
	// A placeholder model: the records are checked for what the flag
	// gives (id, URL), not for models, which may be asked later.
	for _, r := range StaticRecords(workers, []string{"m"}, &config.Config{}) {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("--workers %s: %w", r.ID, err)
		}
	}
	for _, spec := range workers {
		if id, _ := workerSpec(spec); id != "" {
			if seen[id] {
				return fmt.Errorf("--workers: id %q is given twice", id)
			}
			seen[id] = true
		}
	}
	return nil
}

// CheckConfigAgainstFlag refuses a config whose workers reuse an id of
// --workers: the flag's entry won and the config's was dropped without a
// word (its edits did nothing).
func CheckConfigAgainstFlag(cfg *config.Config, workers []string) error {
	for _, spec := range workers {
		id, _ := workerSpec(spec)
		for i := range cfg.Workers {
			if id != "" && cfg.Workers[i].Record().ID == id {
				return &config.FieldError{Path: fmt.Sprintf("workers[%d].id", i), Msg: fmt.Sprintf("%q is also a worker of --workers: give each worker one id", id)}
			}
		}
	}
	return nil
}

// CheckSameEngine refuses two static workers, of --workers or of cfg's
// workers, whose urls name one engine (fleet.EngineKey), naming both: each
// became a worker of its own, and the engine got two shares of the
// traffic, two breakers and two load counters that each saw half its
// load. With --request-transport nats a worker's url is its sidecar's view
// of its engine (http://127.0.0.1:8000 on every host), so it is not
// checked.
func CheckSameEngine(workers []string, cfg *config.Config, requestTransport string) error {
	if requestTransport == "nats" {
		return nil
	}
	type owner struct{ id, where string }
	seen := map[string]owner{}
	for _, spec := range workers {
		id, u := workerSpec(spec)
		if id == "" {
			continue
		}
		k := fleet.EngineKey(u)
		if o, dup := seen[k]; dup && o.id != id {
			return fmt.Errorf("--workers: %q and %q name one engine, %s: give each engine one worker", o.id, id, fleet.EngineRoot(strings.TrimRight(u, "/")))
		}
		seen[k] = owner{id, "--workers"}
	}
	for i := range cfg.Workers {
		r := cfg.Workers[i].Record()
		k := fleet.EngineKey(r.URL)
		if o, dup := seen[k]; dup && o.id != r.ID {
			return &config.FieldError{Path: fmt.Sprintf("workers[%d].url", i),
				Msg: fmt.Sprintf("worker %q names the engine of %s worker %q, %s: give each engine one worker", r.ID, o.where, o.id, fleet.EngineRoot(r.URL))}
		}
		seen[k] = owner{r.ID, fmt.Sprintf("workers[%d]", i)}
	}
	return nil
}

// workerSpec reads one --workers entry, URL or id=URL (a URL without a
// scheme is http): its id and URL, "" for an empty entry.
func workerSpec(spec string) (id, url string) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return "", ""
	}
	id, url = spec, spec
	if i := strings.Index(spec, "="); i > 0 && !strings.Contains(spec[:i], "/") {
		id, url = spec[:i], spec[i+1:]
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	return id, url
}

// fetch asks a worker for its model ids (empty on failure) and
// max_model_len, within timeout, its dial within ConnectTimeout.
func (s *Static) fetch(base string, timeout time.Duration) modelList {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(base + "/v1/models")
	err := s.client.DoTimeout(req, resp, timeout)
	if err == nil && resp.StatusCode() != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode())
	}
	if err != nil {
		slog.Warn("cannot list worker models; pass --worker-model", "url", base, "err", err)
		return modelList{}
	}
	return parseModelList(resp.Body())
}

// parseModelList reads an OpenAI model list; vLLM's entries (ModelCard)
// also give max_model_len, the longest sequence, prompt and output, the
// engine serves (a LoRA's is its base model's).
func parseModelList(b []byte) modelList {
	var v struct {
		Data []struct {
			ID     string `json:"id"`
			MaxLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return modelList{}
	}
	var out modelList
	for _, m := range v.Data {
		if m.ID != "" {
			out.ids = append(out.ids, m.ID)
			out.maxLen = max(out.maxLen, m.MaxLen)
		}
	}
	return out
}
