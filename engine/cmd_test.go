package engine

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/infera/infera/tokenizer"
)

func parseCmd(t *testing.T, args ...string) *Cmd {
	t.Helper()
	var c Cmd
	p, err := kong.New(&c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return &c
}

func TestCmdDefaultsAndFlags(t *testing.T) {
	c := parseCmd(t)
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != "engine-8100" || len(cfg.Models) != 1 || cfg.Models[0] != "sim-model" || cfg.Core.BlockSize != 16 ||
		cfg.Core.CapacityBlocks != 8192 || cfg.Core.MaxBatch != 64 || cfg.DefaultMaxTokens != 256 ||
		cfg.Core.Time != DefaultTimeModel() || cfg.Fault.Mode != FaultNone || cfg.Sink != nil || cfg.Tokenizer != nil {
		t.Fatalf("defaults: %+v", cfg)
	}
	t.Setenv("INFERA_ENGINE_MAX_BATCH", "7")
	c = parseCmd(t, "--port=9000", "--model=a,b", "--model=c", "--speedup=25", "--decode-base=6ms",
		"--fault=error", "--fault-status=502", "--fault-rate=0.25")
	cfg, err = c.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != "engine-9000" || strings.Join(cfg.Models, "|") != "a|b|c" || cfg.Core.MaxBatch != 7 ||
		cfg.Core.Time.Speedup != 25 || cfg.Core.Time.DecodeBase != 6*time.Millisecond ||
		cfg.Fault.Mode != FaultError || cfg.Fault.Status != 502 || cfg.Fault.Rate != 0.25 {
		t.Fatalf("flags: %+v", cfg)
	}
	for _, bad := range [][]string{{"--speedup=0"}, {"--fault=slow", "--fault-factor=-1"}, {"--tokenizer=/nonexistent"}} {
		if _, err := parseCmd(t, bad...).Config(); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	// The KV event flags reach the publisher: an endpoint it cannot bind is
	// an error at start-up, a good one starts it.
	if _, err := parseCmd(t, "--kv-events-endpoint=bogus://x").Config(); err == nil {
		t.Fatal("unbindable KV events endpoint accepted")
	}
	cfg, err = parseCmd(t, "--kv-events-endpoint=tcp://127.0.0.1:0").Config()
	if err != nil || cfg.Sink == nil {
		t.Fatalf("KV events publisher not started: %v", err)
	}
	cfg.Sink.Close()
}

func TestCmdTokenizerIndirection(t *testing.T) {
	old := loadTokenizer
	defer func() { loadTokenizer = old }()
	var gotDir string
	loadTokenizer = func(dir string) (tokenizer.Tokenizer, error) {
		gotDir = dir
		if dir == "bad" {
			return nil, errors.New("boom")
		}
		return tokenizer.Simple{}, nil
	}
	cfg, err := parseCmd(t, "--tokenizer=/models/x").Config()
	if err != nil || gotDir != "/models/x" || cfg.Tokenizer == nil {
		t.Fatalf("tokenizer not loaded: %v %q", err, gotDir)
	}
	if _, err := parseCmd(t, "--tokenizer=bad").Config(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("tokenizer error lost: %v", err)
	}
}

// TestKVEventsFromServer: with --kv-events-endpoint set, every cache change
// made by real requests reaches the sink, in order.
func TestKVEventsFromServer(t *testing.T) {
	old := NewKVEventSink
	defer func() { NewKVEventSink = old }()
	sink := &lockedSink{}
	var gotOpts KVEventsOptions
	NewKVEventSink = func(o KVEventsOptions) (KVEventSink, error) { gotOpts = o; return sink, nil }
	c := parseCmd(t, "--kv-events-endpoint=tcp://127.0.0.1:5557", "--kv-replay-endpoint=tcp://127.0.0.1:5558",
		"--kv-events-layout=map", "--kv-events-topic=kv", "--kv-capacity-blocks=4", "--block-size=4", "--speedup=50")
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	if gotOpts != (KVEventsOptions{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558", Layout: "map", Topic: "kv"}) {
		t.Fatalf("options %+v", gotOpts)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	e := &testEngine{srv: srv, base: "http://" + ln.Addr().String()}
	// Token-id prompts: 9 tokens = 2 full blocks (+1 partial) + 3 generated.
	for _, p := range []string{"[1,2,3,4,5,6,7,8,9]", "[11,12,13,14,15,16,17,18,19]"} {
		if code, b, _ := e.post(t, "/v1/completions", `{"prompt":`+p+`,"max_tokens":3}`); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	if code, _, _ := e.post(t, "/admin/clear-cache", ``); code != 200 {
		t.Fatal("clear-cache failed")
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	h1 := HashBlocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	h2 := HashBlocks(nil, []uint32{11, 12, 13, 14, 15, 16, 17, 18}, 4)
	want := []string{
		"stored parent=- " + hexList(h1),
		"removed " + hexList(h1[1:]), // 3 blocks needed, 2 free: evict the tail only
		"stored parent=- " + hexList(h2),
		"cleared",
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if strings.Join(sink.events, "\n") != strings.Join(want, "\n") || !sink.closed {
		t.Fatalf("events\n%q\nwant\n%q (closed %v)", sink.events, want, sink.closed)
	}
}

// TestServerWithHFTokenizer: --tokenizer loads the Hugging Face tokenizer and
// chat prompts are rendered with its template, so usage matches it exactly.
func TestServerWithHFTokenizer(t *testing.T) {
	const dir = "../testdata/tokenizers/qwen3"
	cfg, err := parseCmd(t, "--tokenizer="+dir, "--speedup=50").Config()
	if err != nil {
		t.Skipf("tokenizer not loadable here: %v", err)
	}
	msgs := []tokenizer.Message{{Role: "user", Content: "What is the capital of France?"}}
	text, err := cfg.Tokenizer.RenderChat(nil, msgs, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	want := len(cfg.Tokenizer.Encode(nil, text))
	if simple := len(tokenizer.Simple{}.Encode(nil, text)); want == simple {
		t.Fatalf("HF and Simple token counts coincide (%d): test cannot tell them apart", want)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	e := &testEngine{srv: srv, base: "http://" + ln.Addr().String()}
	code, b, _ := e.post(t, "/v1/chat/completions", `{"max_tokens":2,"messages":[{"role":"user","content":"What is the capital of France?"}]}`)
	if code != 200 || !strings.Contains(string(b), `"prompt_tokens":`+strconv.Itoa(want)+`,`) {
		t.Fatalf("%d %s, want prompt_tokens %d", code, b, want)
	}
}

// A chat's chat_template_kwargs reach the engine's chat template as vLLM
// passes them: Qwen3 with enable_thinking false renders the empty think
// block after the generation prompt, 4 tokens more. The engine ignored
// them (9 prompt tokens where vLLM counts 13) while the router renders
// them, so router and engine hashed such chats differently.
func TestServerRendersChatTemplateKwargs(t *testing.T) {
	const dir = "../testdata/tokenizers/qwen3"
	cfg, err := parseCmd(t, "--tokenizer="+dir, "--speedup=50").Config()
	if err != nil {
		t.Skipf("tokenizer not loadable here: %v", err)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	e := &testEngine{srv: srv, base: "http://" + ln.Addr().String()}
	for kwargs, want := range map[string]int{``: 9, `,"chat_template_kwargs":{"enable_thinking":false}`: 13, `,"chat_template_kwargs":null`: 9,
		// The request's own add_generation_prompt (true by default) is
		// merged over the kwargs', as vLLM merges it (tokenizer.HF.render).
		`,"chat_template_kwargs":{"add_generation_prompt":false}`: 9} {
		code, b, _ := e.post(t, "/v1/chat/completions", `{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]`+kwargs+`}`)
		if code != 200 || !strings.Contains(string(b), `"prompt_tokens":`+strconv.Itoa(want)+`,`) {
			t.Errorf("%s: %d %s, want prompt_tokens %d", kwargs, code, b, want)
		}
	}
}
