package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Arrival modes.
const (
	ArrivalTrace   = "trace"   // open loop at the workload's timestamps
	ArrivalPoisson = "poisson" // open loop, Poisson at Rate
	ArrivalClosed  = "closed"  // closed loop, Concurrency requests in flight
)

// LoadConfig describes how a workload is sent.
type LoadConfig struct {
	// Arrival is trace, poisson or closed.
	Arrival string
	// Rate is the Poisson arrival rate (requests/s).
	Rate float64
	// Concurrency is the closed-loop number of requests in flight.
	Concurrency int
	// MaxInFlight bounds open-loop requests in flight; arrivals beyond it
	// are counted as errors ("overload") rather than queued.
	MaxInFlight int
	// Duration stops issuing new requests after this long (0: no limit).
	Duration time.Duration
	// Timeout bounds each request (0: none).
	Timeout time.Duration
	// API is chat (/v1/chat/completions) or completions (/v1/completions).
	API string
	// TokenPrompts sends completions prompts as token-id arrays.
	TokenPrompts bool
	// Stream asks for SSE with usage in the last chunk.
	Stream bool
	// Model is the model name sent.
	Model string
	// Prompt maps hash ids to content.
	Prompt PromptConfig
	// Seed drives Poisson arrivals.
	Seed uint64
	// Progress, if set, shows requests done, elapsed time and hit rate.
	Progress *Progress
}

// DefaultLoadConfig returns trace-driven streaming chat requests.
func DefaultLoadConfig() LoadConfig {
	return LoadConfig{Arrival: ArrivalTrace, Rate: 10, Concurrency: 16, MaxInFlight: 4096,
		Timeout: 5 * time.Minute, API: "chat", Stream: true, Model: "sim-model", Prompt: DefaultPromptConfig()}
}

// Validate checks the configuration.
func (c *LoadConfig) Validate() error {
	switch c.Arrival {
	case ArrivalTrace, ArrivalClosed:
	case ArrivalPoisson:
		if !(c.Rate > 0) {
			return fmt.Errorf("poisson arrivals need --rate > 0")
		}
	default:
		return fmt.Errorf("unknown arrival mode %q: want trace, poisson or closed", c.Arrival)
	}
	if c.Arrival == ArrivalClosed && (c.Concurrency <= 0 || c.Concurrency > 100_000) {
		return fmt.Errorf("concurrency must be in [1, 100000], got %d", c.Concurrency)
	}
	switch c.API {
	case "chat", "completions":
	default:
		return fmt.Errorf("unknown api %q: want chat or completions", c.API)
	}
	if c.TokenPrompts && c.API != "completions" {
		return errTokenPromptsChat
	}
	if c.Duration < 0 || c.Timeout < 0 {
		return fmt.Errorf("duration and timeout must not be negative")
	}
	return nil
}

// InFlight returns the most requests the load keeps in flight: Concurrency
// in a closed loop, MaxInFlight (4096 when unset) in an open one. A Client
// allowed fewer connections queues the rest inside itself, their clock
// running.
func (c *LoadConfig) InFlight() int {
	if c.Arrival == ArrivalClosed {
		return c.Concurrency
	}
	if c.MaxInFlight <= 0 {
		return 4096
	}
	return c.MaxInFlight
}

// Path returns the request path for the API.
func (c *LoadConfig) Path() string {
	if c.API == "completions" {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// AppendBody appends the JSON request body for workload request r (index i).
// scratch is reused for token encoding and returned.
func (c *LoadConfig) AppendBody(dst, scratch []byte, r *TraceRequest, i int) ([]byte, []byte) {
	salt := uint64(i) + 1
	dst = append(dst, `{"model":`...)
	dst = strconv.AppendQuote(dst, c.Model)
	if c.API == "completions" {
		dst = append(dst, `,"prompt":`...)
		if c.TokenPrompts {
			var toks []uint32
			toks, scratch = c.Prompt.AppendPromptTokens(nil, scratch, r.HashIDs, r.InputLength, salt)
			dst = append(dst, '[')
			for j, t := range toks {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = strconv.AppendUint(dst, uint64(t), 10)
			}
			dst = append(dst, ']')
		} else {
			dst = append(dst, '"')
			dst = c.Prompt.AppendPrompt(dst, r.HashIDs, r.InputLength, salt) // needs no escaping
			dst = append(dst, '"')
		}
	} else {
		dst = append(dst, `,"messages":[{"role":"user","content":"`...)
		dst = c.Prompt.AppendPrompt(dst, r.HashIDs, r.InputLength, salt)
		dst = append(dst, `"}]`...)
	}
	dst = append(dst, `,"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.OutputLength), 10)
	dst = append(dst, `,"min_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.OutputLength), 10)
	dst = append(dst, `,"ignore_eos":true`...)
	if c.Stream {
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	dst = append(dst, '}')
	return dst, scratch
}

// Run is one load run's raw results.
type Run struct {
	Results []Result
	ITLs    []time.Duration
	// Wall is the run's wall-clock length (first send to last completion).
	Wall time.Duration
	// Dropped counts open-loop arrivals refused by MaxInFlight.
	Dropped int
	// Behind counts the trace's requests stamped within Duration that were
	// never sent: the issuing loop fell behind the timestamps (the client
	// machine could not keep up with the trace's rate) and Duration ended
	// first. MaxLag is the largest delay of a send after its stamp (open
	// loop).
	Behind int
	MaxLag time.Duration
}

// behindWarning says how many of the trace's requests were never sent
// because the client fell behind (empty: none).
func (r *Run) behindWarning() string {
	if r.Behind == 0 {
		return ""
	}
	return fmt.Sprintf("the client fell behind the trace: %d requests stamped within --duration were never sent (sends lagged their stamps by up to %v); lower --speedup, or run the client on a less loaded machine",
		r.Behind, r.MaxLag.Round(time.Millisecond))
}

// errTokenPromptsChat refuses --token-prompts without --api completions: a
// chat message is text, and the flag was taken and did nothing.
var errTokenPromptsChat = errors.New("--token-prompts needs --api completions (a chat message is text)")

// errDurationOver ends a run's issuing at LoadConfig.Duration.
var errDurationOver = errors.New("--duration is over")

// errOverload is the error of an open-loop arrival refused by MaxInFlight:
// never sent, it is not a transport error (Summarize counts it apart).
const errOverload = "overload: too many requests in flight"

var bodyPool = sync.Pool{New: func() any { return &bodyBuf{} }}

type bodyBuf struct{ body, scratch []byte }

// RunLoad sends reqs through cl according to cfg and returns every request's
// result. It stops issuing at ctx cancellation or cfg.Duration and waits for
// in-flight requests (each bounded by cfg.Timeout).
func RunLoad(ctx context.Context, cl *Client, reqs []TraceRequest, cfg LoadConfig) (*Run, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cl.Timeout = cfg.Timeout
	results := make([]Result, len(reqs))
	sent := make([]bool, len(reqs))
	path := cfg.Path()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.Duration, errDurationOver)
		defer cancel()
	}
	t0 := time.Now()
	var done, cached, prompt atomic.Int64
	one := func(i int) {
		bb := bodyPool.Get().(*bodyBuf)
		bb.body, bb.scratch = cfg.AppendBody(bb.body[:0], bb.scratch, &reqs[i], i)
		res := &results[i]
		res.Index = i
		res.Start = time.Since(t0)
		cl.Do(path, bb.body, cfg.Stream, res)
		bodyPool.Put(bb)
		if cfg.Progress != nil {
			n := done.Add(1)
			if res.OK() {
				cached.Add(int64(res.CachedTokens))
				prompt.Add(int64(res.PromptTokens))
			}
			cfg.Progress.Update(int(n), len(reqs), "elapsed", time.Since(t0), cached.Load(), prompt.Load())
		}
	}
	var wg sync.WaitGroup
	dropped, behind := 0, 0
	var maxLag time.Duration
	switch cfg.Arrival {
	case ArrivalClosed:
		var next atomic.Int64
		for range min(cfg.Concurrency, len(reqs)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					i := int(next.Add(1) - 1)
					if i >= len(reqs) {
						return
					}
					sent[i] = true
					one(i)
				}
			}()
		}
	default:
		sem := make(chan struct{}, cfg.InFlight())
		rng := rand.New(rand.NewPCG(cfg.Seed, 77))
		var at time.Duration
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
	loop:
		for i := range reqs {
			if cfg.Arrival == ArrivalPoisson {
				at += time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second))
			} else {
				at = time.Duration(reqs[i].Timestamp) * time.Millisecond
			}
			if d := at - time.Since(t0); d > 0 {
				timer.Reset(d)
				select {
				case <-ctx.Done():
					break loop
				case <-timer.C:
				}
			} else if ctx.Err() != nil {
				if cfg.Arrival != ArrivalPoisson && context.Cause(ctx) == errDurationOver {
					for j := i; j < len(reqs); j++ {
						if time.Duration(reqs[j].Timestamp)*time.Millisecond < cfg.Duration {
							behind++
						}
					}
				}
				break loop
			} else {
				maxLag = max(maxLag, -d)
			}
			select {
			case sem <- struct{}{}:
			default:
				dropped++
				results[i] = Result{Index: i, Start: time.Since(t0), Err: errOverload}
				sent[i] = true
				continue
			}
			sent[i] = true
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				one(i)
				<-sem
			}(i)
		}
	}
	wg.Wait()
	cfg.Progress.Done()
	run := &Run{Wall: time.Since(t0), Dropped: dropped, Behind: behind, MaxLag: maxLag, ITLs: cl.TakeITLs()}
	run.Results = results[:0]
	for i := range results {
		if sent[i] {
			run.Results = append(run.Results, results[i])
		}
	}
	return run, nil
}
