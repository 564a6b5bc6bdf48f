package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// Workload names accepted by Generate.
const (
	WorkloadChat   = "chat"          // multi-turn chat sessions
	WorkloadShared = "shared-prefix" // many users sharing a few long system prompts
	WorkloadAgent  = "agent"         // tool-agent loops: many short turns over a growing context
	WorkloadUnique = "unique"        // no reuse at all
)

// Workloads lists the synthetic workload names.
var Workloads = []string{WorkloadShared, WorkloadChat, WorkloadAgent, WorkloadUnique}

// GenConfig parameterises the synthetic generators. Lengths are in tokens;
// the output is a Mooncake trace whose hash ids stand for BlockTokens tokens.
type GenConfig struct {
	Workload string
	// Requests is the number of requests to generate.
	Requests int
	// Rate is the mean arrival rate in requests (sessions for chat/agent) per
	// second; arrivals are Poisson.
	Rate float64
	Seed uint64
	// BlockTokens is the tokens per hash id (512 for Mooncake traces).
	BlockTokens int

	// SystemPrompts and SystemTokens: shared-prefix workload's prefixes.
	SystemPrompts int
	SystemTokens  int
	// Users is the number of distinct users (shared-prefix; each user sticks
	// to one system prompt).
	Users int
	// QuestionTokens is the per-request unique part (shared-prefix, and each
	// new user message in chat/agent).
	QuestionTokens int
	// Turns per chat session / tool calls per agent loop.
	Turns int
	// ThinkMS is the mean pause between turns of one session.
	ThinkMS float64
	// OutputTokens is the mean output length.
	OutputTokens int
	// PromptTokens is the prompt length of the unique workload.
	PromptTokens int
}

// DefaultGenConfig returns small defaults for workload w.
func DefaultGenConfig(w string) GenConfig {
	c := GenConfig{
		Workload: w, Requests: 200, Rate: 20, Seed: 1, BlockTokens: TraceBlockTokens,
		SystemPrompts: 16, SystemTokens: 2048, Users: 64, QuestionTokens: 96,
		Turns: 6, ThinkMS: 400, OutputTokens: 48, PromptTokens: 1024,
	}
	if w == WorkloadAgent {
		c.Turns, c.ThinkMS, c.QuestionTokens, c.OutputTokens = 10, 50, 160, 32
	}
	return c
}

// Validate checks the parameters.
func (c *GenConfig) Validate() error {
	switch c.Workload {
	case WorkloadChat, WorkloadShared, WorkloadAgent, WorkloadUnique:
	default:
		return fmt.Errorf("unknown workload %q: want one of %s", c.Workload, strings.Join(Workloads, ", "))
	}
	if c.Requests <= 0 || c.Requests > 10_000_000 {
		return fmt.Errorf("requests must be in [1, 10000000], got %d", c.Requests)
	}
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		return fmt.Errorf("rate must be > 0, got %v", c.Rate)
	}
	if c.BlockTokens <= 0 || c.BlockTokens > 1<<16 {
		return fmt.Errorf("block tokens must be in [1, 65536], got %d", c.BlockTokens)
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"system-prompts", c.SystemPrompts}, {"system-tokens", c.SystemTokens}, {"users", c.Users},
		{"question-tokens", c.QuestionTokens}, {"turns", c.Turns}, {"output-tokens", c.OutputTokens}, {"prompt-tokens", c.PromptTokens}} {
		if v.v <= 0 || v.v > maxTraceTokens {
			return fmt.Errorf("%s must be in [1, %d], got %d", v.name, maxTraceTokens, v.v)
		}
	}
	// A generated length is up to 1.5 x its mean (around): the trace
	// reader skips a line whose input_length or output_length is over
	// maxTraceTokens, so gen must not be able to write one.
	longest := func(mean int) int { return mean/2 + mean }
	tooLong := func(flag string, mean, reach int, what string) error {
		return fmt.Errorf("%s %d is too long for the %s workload: a request may reach %d tokens (%s), over the %d a trace line may have",
			flag, mean, c.Workload, reach, what, maxTraceTokens)
	}
	if n := longest(c.OutputTokens); n > maxTraceTokens {
		return tooLong("output-tokens", c.OutputTokens, n, "up to 1.5 x the mean")
	}
	if n := longest(c.PromptTokens); c.Workload == WorkloadUnique && n > maxTraceTokens {
		return tooLong("prompt-tokens", c.PromptTokens, n, "up to 1.5 x the mean")
	}
	if c.Workload == WorkloadShared {
		sys := (c.SystemTokens + c.BlockTokens - 1) / c.BlockTokens * c.BlockTokens
		if n := sys + longest(c.QuestionTokens); n > maxTraceTokens {
			return fmt.Errorf("system-tokens %d and question-tokens %d are too long for the shared-prefix workload: a request may reach %d tokens (the system prompt in whole %d-token blocks and a question of up to 1.5 x the mean), over the %d a trace line may have",
				c.SystemTokens, c.QuestionTokens, n, c.BlockTokens, maxTraceTokens)
		}
	}
	if c.ThinkMS < 0 || math.IsNaN(c.ThinkMS) {
		return fmt.Errorf("think time must be >= 0")
	}
	if c.Workload == WorkloadChat || c.Workload == WorkloadAgent {
		// A session ends at a turn longer than maxTraceTokens/2: if even
		// its first turn (the preamble block and a new message of up to
		// 1.5 x the mean) can be, sessions may produce no request and the
		// generator never reaches c.Requests.
		if first := c.BlockTokens + c.QuestionTokens/2 + c.QuestionTokens; first > maxTraceTokens/2 {
			return fmt.Errorf("question-tokens %d is too long for %s sessions: a first turn may reach %d tokens (one %d-token preamble block and up to 1.5 x the mean), over the %d a turn may have",
				c.QuestionTokens, c.Workload, first, c.BlockTokens, maxTraceTokens/2)
		}
	}
	return nil
}

type gen struct {
	c      *GenConfig
	rng    *rand.Rand
	nextID int64
	// late is the first timestamp (ms) past maxScheduleMS, 0 if none.
	late float64
}

// stamp returns t (ms) as a timestamp, noting one past maxScheduleMS (or
// NaN): converting it to int64 gave garbage (negative times).
func (g *gen) stamp(t float64) int64 {
	if !(t <= maxScheduleMS) {
		if g.late == 0 {
			g.late = t
		}
		return 0
	}
	return int64(t)
}

func (g *gen) newIDs(dst []int64, n int) []int64 {
	for range n {
		dst = append(dst, g.nextID)
		g.nextID++
	}
	return dst
}

func (g *gen) exp(mean float64) float64 { return g.rng.ExpFloat64() * mean }

// around returns a length near mean (uniform in [mean/2, 3*mean/2]), >= 1.
func (g *gen) around(mean int) int {
	v := mean/2 + g.rng.IntN(mean+1)
	if v < 1 {
		v = 1
	}
	return v
}

// blocksFor returns the number of hash ids covering n tokens.
func (g *gen) blocksFor(n int) int { return (n + g.c.BlockTokens - 1) / g.c.BlockTokens }

// Generate produces a synthetic trace.
func Generate(c GenConfig) ([]TraceRequest, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	g := &gen{c: &c, rng: rand.New(rand.NewPCG(c.Seed, c.Seed^0x5eed))}
	var out []TraceRequest
	switch c.Workload {
	case WorkloadShared:
		out = g.shared()
	case WorkloadUnique:
		out = g.unique()
	default:
		out = g.sessions()
	}
	if g.late != 0 {
		think := ""
		if c.Workload == WorkloadChat || c.Workload == WorkloadAgent {
			think = fmt.Sprintf(" or lower --think-ms (%v)", c.ThinkMS)
		}
		return nil, fmt.Errorf("the generated schedule of %d requests reaches %.4g ms, over the %.0f ms a schedule may span: raise --rate (%v)%s",
			c.Requests, g.late, float64(maxScheduleMS), c.Rate, think)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	if len(out) > c.Requests {
		out = out[:c.Requests]
	}
	return out, nil
}

func (g *gen) shared() []TraceRequest {
	c := g.c
	sys := make([][]int64, c.SystemPrompts)
	for i := range sys {
		// System prompts are whole blocks so user parts start a new block.
		sys[i] = g.newIDs(nil, g.blocksFor(c.SystemTokens))
	}
	sysTokens := g.blocksFor(c.SystemTokens) * c.BlockTokens
	// Users pick a system prompt with a skewed (Zipf-like) popularity.
	userSys := make([]int, c.Users)
	for u := range userSys {
		userSys[u] = int(float64(c.SystemPrompts) * math.Pow(g.rng.Float64(), 1.5))
	}
	out := make([]TraceRequest, 0, c.Requests)
	t := 0.0
	for range c.Requests {
		t += g.exp(1000 / c.Rate)
		u := g.rng.IntN(c.Users)
		q := g.around(c.QuestionTokens)
		ids := append([]int64(nil), sys[userSys[u]]...)
		ids = g.newIDs(ids, g.blocksFor(q))
		out = append(out, TraceRequest{Timestamp: g.stamp(t), InputLength: sysTokens + q, OutputLength: g.around(c.OutputTokens), HashIDs: ids})
	}
	return out
}

func (g *gen) unique() []TraceRequest {
	c := g.c
	out := make([]TraceRequest, 0, c.Requests)
	t := 0.0
	for range c.Requests {
		t += g.exp(1000 / c.Rate)
		n := g.around(c.PromptTokens)
		out = append(out, TraceRequest{Timestamp: g.stamp(t), InputLength: n, OutputLength: g.around(c.OutputTokens), HashIDs: g.newIDs(nil, g.blocksFor(n))})
	}
	return out
}

// sessions generates chat sessions or agent loops: each turn's prompt is the
// previous prompt plus the previous output plus a new message, so its hash
// ids extend the previous turn's ids (the last, partial block keeps its id:
// block text is fixed per id, so the longer prompt still starts with the
// shorter one byte for byte).
func (g *gen) sessions() []TraceRequest {
	c := g.c
	out := make([]TraceRequest, 0, c.Requests)
	t := 0.0
	sysIDs := g.newIDs(nil, 1) // one common short preamble block, like a chat template's system text
	for len(out) < c.Requests {
		t += g.exp(1000 / c.Rate)
		ids := append([]int64(nil), sysIDs...)
		length := c.BlockTokens
		ts := t
		for turn := 0; turn < c.Turns && len(out) < c.Requests; turn++ {
			length += g.around(c.QuestionTokens)
			if length > maxTraceTokens/2 {
				break
			}
			if need := g.blocksFor(length) - len(ids); need > 0 {
				ids = g.newIDs(ids, need)
			}
			o := g.around(c.OutputTokens)
			out = append(out, TraceRequest{Timestamp: g.stamp(ts), InputLength: length, OutputLength: o, HashIDs: append([]int64(nil), ids...)})
			length += o
			ts += g.exp(c.ThinkMS) + float64(o)*20 // the client waits for the answer (about 20 ms/token) then thinks
		}
	}
	return out
}
