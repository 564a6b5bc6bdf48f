package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"encoding/json"

	"github.com/valyala/fasthttp"
	"github.com/zeebo/xxh3"

	"github.com/infera/infera/tokenizer"
)

// Config configures a Server.
type Config struct {
	// ID is the engine instance id, sent as X-Infera-Engine-Id.
	ID string
	// Models are the served model names; the first is the default when a
	// request names none.
	Models []string
	// Core configures batching, the KV cache and the time model. Its Sink is
	// set by the Server.
	Core CoreConfig
	// DefaultMaxTokens is generated when a request sets no max_tokens.
	DefaultMaxTokens int
	// Tokenizer encodes prompts; nil means tokenizer.Simple{}.
	Tokenizer tokenizer.Tokenizer
	// Fault is the fault injected from the start.
	Fault Fault
	// Sink receives KV cache events; nil for none. The Server closes it.
	Sink KVEventSink
	// PD makes the engine a prefill or decode engine of a disaggregated
	// pair; the zero value is the mixed role.
	PD PDConfig

	// Reasoning: chat answers that are asked to reason (answer.go) send
	// their first half as reasoning_content.
	Reasoning bool
	// ToolCalls: chat requests that offer tools are answered with a call.
	ToolCalls bool
	// NativeProtocols also serves /v1/messages, /v1/messages/count_tokens
	// and /v1/responses (native.go).
	NativeProtocols bool
}

// Server is the simulated engine's HTTP server. One scheduler goroutine
// drives a Core with the real clock; request handlers submit to it and wait
// for tokens.
type Server struct {
	cfg   Config
	tok   tokenizer.Tokenizer
	srv   *fasthttp.Server
	start time.Time

	mu   sync.Mutex // guards core
	core *Core

	wake chan struct{}
	stop chan struct{}
	done chan struct{}

	fault     atomic.Pointer[faultState]
	models    map[string][]byte // name -> JSON string
	modelList []byte            // GET /v1/models body
	idBase    uint64
	idSeq     atomic.Uint64
	engineID  []byte

	requests, badRequests, faultsInjected atomic.Uint64
	hung                                  atomic.Int64

	pd *pd // nil for the mixed role

	resp respStore // the Responses answered (native protocols)

	closeOnce sync.Once
}

// NewServer builds a Server and starts its scheduler. Serve it with Serve and
// stop it with Close.
func NewServer(cfg Config) (*Server, error) {
	if len(cfg.Models) == 0 {
		return nil, errors.New("at least one model name is required")
	}
	if cfg.DefaultMaxTokens < 1 {
		return nil, fmt.Errorf("default max tokens must be at least 1, got %d", cfg.DefaultMaxTokens)
	}
	if cfg.ID == "" {
		cfg.ID = "engine"
	}
	fault, err := cfg.Fault.normalize()
	if err != nil {
		return nil, err
	}
	if err := cfg.PD.normalize(cfg.ID); err != nil {
		return nil, err
	}
	cfg.Core.Sink = cfg.Sink
	core, err := NewCore(cfg.Core)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		tok:      cfg.Tokenizer,
		core:     core,
		start:    time.Now(),
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		models:   make(map[string][]byte, len(cfg.Models)),
		idBase:   xxh3.HashString(cfg.ID) &^ (1<<32 - 1),
		engineID: []byte(cfg.ID),
	}
	if s.tok == nil {
		s.tok = tokenizer.Simple{}
	}
	created := s.start.Unix()
	type modelEntry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		MaxLen  int    `json:"max_model_len"`
	}
	list := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list"}
	for _, m := range cfg.Models {
		if m == "" {
			return nil, errors.New("model names must not be empty")
		}
		b, _ := json.Marshal(m)
		s.models[m] = b
		list.Data = append(list.Data, modelEntry{ID: m, Object: "model", Created: created, OwnedBy: "infera", MaxLen: cfg.Core.CapacityBlocks * cfg.Core.BlockSize})
	}
	s.modelList, _ = json.Marshal(list)
	s.setFault(fault)
	s.srv = &fasthttp.Server{
		Handler:                       s.Handler,
		Name:                          "infera-engine",
		NoDefaultServerHeader:         true,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		MaxRequestBodySize:            64 << 20,
		ReadBufferSize:                16 << 10,
		CloseOnShutdown:               true,
		Logger:                        debugLogger{},
	}
	if cfg.PD.Role != RoleMixed {
		s.pd = newPD(s, cfg.PD)
	}
	go s.run()
	return s, nil
}

// Serve serves HTTP on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); err != nil {
		return fmt.Errorf("cannot serve engine HTTP on %s: %w", ln.Addr(), err)
	}
	return nil
}

// Close stops serving, aborts in-flight requests, stops the scheduler and
// closes the KV event sink.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		if s.pd != nil {
			s.pd.close()
		}
		err = s.srv.Shutdown()
		if s.cfg.Sink != nil {
			if cerr := s.cfg.Sink.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("cannot close KV event sink: %w", cerr)
			}
		}
	})
	return err
}

// ID returns the engine instance id.
func (s *Server) ID() string { return s.cfg.ID }

func (s *Server) now() time.Duration { return time.Since(s.start) }

func (s *Server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run is the scheduler goroutine: it steps the Core at its event times and
// hands tokens to the waiting handlers.
func (s *Server) run() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var evs []Event
	for {
		s.mu.Lock()
		now := s.now()
		var next time.Duration
		evs, next = s.core.Step(now, evs[:0])
		// Catch up when we woke late, bounded so handlers get the lock.
		for i := 0; i < 64 && next <= now; i++ {
			evs, next = s.core.Step(now, evs)
		}
		s.mu.Unlock()
		s.deliver(evs)
		if next != Never {
			d := next - s.now()
			if d <= 0 {
				continue
			}
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-s.wake:
				if !timer.Stop() {
					<-timer.C
				}
			case <-s.stop:
				return
			}
			continue
		}
		select {
		case <-s.wake:
		case <-s.stop:
			return
		}
	}
}

// deliver hands the Core's events to the waiting handlers.
func (s *Server) deliver(evs []Event) {
	for i := range evs {
		ev := &evs[i]
		sq := ev.Req.Tag.(*seq)
		ev.Req = nil
		if ev.WaitingKV {
			close(sq.admitted)
			continue
		}
		sq.storeTokens(int32(ev.Tokens))
		if ev.Done {
			sq.done.Store(true)
			if !sq.req.HoldKV {
				sq.ended.Store(true)
			}
			if sq.doneCh != nil {
				close(sq.doneCh)
			}
			sq.poke()
		} else if sq.everyToken {
			sq.poke()
		}
	}
}

// transferDone tells the Core that sq's KV arrived. It returns false when
// sq no longer waits for it (aborted).
func (s *Server) transferDone(sq *seq) bool {
	var evs [1]Event
	s.mu.Lock()
	got, ok := s.core.TransferDone(&sq.req, s.now(), evs[:0])
	s.mu.Unlock()
	if ok {
		s.deliver(got)
		s.kick()
	}
	return ok
}

func (s *Server) submit(sq *seq) error {
	s.mu.Lock()
	err := s.core.Submit(&sq.req, s.now())
	s.mu.Unlock()
	if err == nil {
		s.kick()
	}
	return err
}

// abort removes a sequence that has not finished.
func (s *Server) abort(sq *seq) {
	if sq.ended.Load() {
		return
	}
	s.mu.Lock()
	ok := s.core.Abort(&sq.req, s.now())
	s.mu.Unlock()
	if ok {
		sq.ended.Store(true)
		s.kick()
	}
}

func (s *Server) currentFault() *faultState { return s.fault.Load() }

func (s *Server) setFault(f Fault) {
	fs := &faultState{Fault: f}
	s.fault.Store(fs)
	slow := 1.0
	if f.Mode == FaultSlow {
		slow = f.Factor
	}
	s.mu.Lock()
	s.core.SetSlow(slow)
	s.mu.Unlock()
	s.kick()
}

// SetFault installs a fault at runtime.
func (s *Server) SetFault(f Fault) error {
	f, err := f.normalize()
	if err != nil {
		return err
	}
	s.setFault(f)
	return nil
}

// ClearCache drops the prefix cache (the sink sees AllCleared).
func (s *Server) ClearCache() {
	s.mu.Lock()
	s.core.Cache().Clear()
	s.mu.Unlock()
}

// Stats is the engine's counters, served by /admin/stats.
type Stats struct {
	ID                 string `json:"id"`
	RequestsTotal      uint64 `json:"requests_total"`
	BadRequests        uint64 `json:"bad_requests"`
	FaultsInjected     uint64 `json:"faults_injected"`
	Hung               int64  `json:"hung"`
	Active             int    `json:"active"`
	Running            int    `json:"running"`
	Queued             int    `json:"queued"`
	Submitted          uint64 `json:"submitted"`
	Completed          uint64 `json:"completed"`
	Aborted            uint64 `json:"aborted"`
	GeneratedTokens    uint64 `json:"generated_tokens"`
	PromptTokens       uint64 `json:"prompt_tokens"`
	CachedPromptTokens uint64 `json:"cached_prompt_tokens"`
	Steps              uint64 `json:"steps"`
	CacheBlocksUsed    int    `json:"cache_blocks_used"`
	CacheBlocksCached  int    `json:"cache_blocks_cached"`
	CacheBlocksCap     int    `json:"cache_blocks_capacity"`
	Evictions          uint64 `json:"evictions"`
	Fault              string `json:"fault"`

	// Disaggregation: the role (mixed, prefill, decode), the PD mode
	// (sglang, vllm; empty when mixed) and, for a prefill engine, its
	// BootstrapInfo.
	Role      string          `json:"role"`
	PDMode    string          `json:"pd_mode,omitempty"`
	Bootstrap json.RawMessage `json:"bootstrap,omitempty"`
	// KVWaiting: requests whose KV transfer is under way; KVReady: KV
	// arrived, waiting for a batch slot; KVHeld: finished prefills whose
	// blocks wait for their transfer.
	KVWaiting int `json:"kv_waiting"`
	KVReady   int `json:"kv_ready"`
	KVHeld    int `json:"kv_held"`
	// PDRooms: SGLang bootstrap rooms open on a prefill engine;
	// PDHeldRequests: vLLM prefills whose blocks wait for a read.
	PDRooms        int `json:"pd_rooms"`
	PDHeldRequests int `json:"pd_held_requests"`
	// Transfers completed (served by a prefill engine, received by a
	// decode engine), requests failed by a transfer (timeouts included),
	// timeouts alone, and blocks moved.
	Transfers         uint64 `json:"transfers"`
	TransferFailures  uint64 `json:"transfer_failures"`
	TransferTimeouts  uint64 `json:"transfer_timeouts"`
	BlocksTransferred uint64 `json:"blocks_transferred"`
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	cs := s.core.Stats()
	s.mu.Unlock()
	st := Stats{
		ID:                 s.cfg.ID,
		RequestsTotal:      s.requests.Load(),
		BadRequests:        s.badRequests.Load(),
		FaultsInjected:     s.faultsInjected.Load(),
		Hung:               s.hung.Load(),
		Active:             cs.Running + cs.Queued,
		Running:            cs.Running,
		Queued:             cs.Queued,
		Submitted:          cs.Submitted,
		Completed:          cs.Completed,
		Aborted:            cs.Aborted,
		GeneratedTokens:    cs.GeneratedTokens,
		PromptTokens:       cs.PromptTokens,
		CachedPromptTokens: cs.CachedPromptTokens,
		Steps:              cs.Steps,
		CacheBlocksUsed:    cs.BlocksUsed,
		CacheBlocksCached:  cs.BlocksCached,
		CacheBlocksCap:     cs.BlocksCap,
		Evictions:          cs.Evictions,
		Fault:              s.currentFault().Mode,
		Role:               s.cfg.PD.Role.String(),
		PDMode:             s.cfg.PD.Mode.String(),
		KVWaiting:          cs.WaitingKV,
		KVReady:            cs.ReadyKV,
		KVHeld:             cs.Held,
	}
	// Requests waiting for their KV and finished prefills whose KV waits for
	// its decode engine are in flight too: a draining prefill engine must
	// wait for its transfers.
	st.Active += cs.WaitingKV + cs.ReadyKV + cs.Held
	if p := s.pd; p != nil {
		st.Bootstrap = p.info
		st.PDRooms, st.PDHeldRequests = p.counts()
		st.Transfers, st.TransferFailures = p.transfers.Load(), p.failures.Load()
		st.TransferTimeouts, st.BlocksTransferred = p.timeouts.Load(), p.blocks.Load()
	}
	return st
}

// BootstrapInfo returns the JSON a prefill engine advertises in its worker
// record's "bootstrap" field, or nil for other roles.
func (s *Server) BootstrapInfo() []byte {
	if s.pd == nil {
		return nil
	}
	return s.pd.info
}

// debugLogger sends fasthttp's connection errors (mostly clients that went
// away, or injected closes) to slog at debug level.
type debugLogger struct{}

func (debugLogger) Printf(format string, args ...any) {
	if slog.Default().Enabled(context.Background(), slog.LevelDebug) {
		slog.Debug(fmt.Sprintf(format, args...))
	}
}

func appendPromMetric(dst []byte, name, id string, v uint64) []byte {
	dst = append(dst, "infera_engine_"...)
	dst = append(dst, name...)
	dst = append(dst, `{engine="`...)
	dst = append(dst, id...)
	dst = append(dst, `"} `...)
	dst = strconv.AppendUint(dst, v, 10)
	return append(dst, '\n')
}
