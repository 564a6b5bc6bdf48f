package discovery

import (
	"context"
	"encoding/json"
	"log/slog"
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
// without models are asked for their /v1/models; until they answer they
// are retried every few seconds, and a worker that already learned its
// models keeps them through a transient /v1/models failure.
type Static struct {
	fl      *fleet.Fleet
	workers []string
	models  []string
	mu      sync.Mutex // serializes syncs
	stop    chan struct{}
	once    sync.Once
}

var _ Backend = (*Static)(nil)

// NewStatic returns the static backend for fl.
func NewStatic(fl *fleet.Fleet, workers, workerModels []string) *Static {
	return &Static{fl: fl, workers: workers, models: workerModels, stop: make(chan struct{})}
}

// Apply makes the fleet the static list under cfg (call it at start and on
// every config change).
func (s *Static) Apply(cfg *config.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := StaticRecords(s.workers, s.models, cfg)
	for i := range rs {
		if len(rs[i].Models) == 0 {
			if w := s.fl.Get(rs[i].ID); w != nil && w.URL == rs[i].URL && len(w.Models) > 0 {
				rs[i].Models = w.Models
				continue
			}
			rs[i].Models = FetchModels(rs[i].URL)
		}
	}
	for _, err := range s.fl.Sync(rs) {
		slog.Error("static worker skipped", "err", err)
	}
}

// Run retries, every 5 s until stopped, static workers whose models could
// not be listed yet. load returns the current config snapshot.
func (s *Static) Run(load func() *config.Config) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for _, w := range s.fl.View().All {
			if len(w.Models) == 0 {
				s.Apply(load())
				break
			}
		}
	}
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
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		id, u := spec, spec
		if i := strings.Index(spec, "="); i > 0 && !strings.Contains(spec[:i], "/") {
			id, u = spec[:i], spec[i+1:]
		}
		if !strings.Contains(u, "://") {
			u = "http://" + u
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		rs = append(rs, fleet.Record{ID: id, URL: strings.TrimRight(u, "/"), Models: workerModels, Status: fleet.StatusActive})
	}
	for i := range cfg.Workers {
		r := cfg.Workers[i].Record()
		if seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		rs = append(rs, r)
	}
	return rs
}

// FetchModels asks a worker for its model ids (empty on failure).
func FetchModels(base string) []string {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(base + "/v1/models")
	if err := fasthttp.DoTimeout(req, resp, 3*time.Second); err != nil || resp.StatusCode() != 200 {
		slog.Warn("cannot list worker models; pass --worker-model", "url", base, "err", err)
		return nil
	}
	return parseModelList(resp.Body())
}

func parseModelList(b []byte) []string {
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil
	}
	var out []string
	for _, m := range v.Data {
		if m.ID != "" {
			out = append(out, m.ID)
		}
	}
	return out
}
