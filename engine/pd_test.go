package engine

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/tokenizer"
)

// startCmdEngine runs `infera engine` in-process: the flags go through the
// command's parser and Config, the Server serves HTTP on an ephemeral
// loopback port, and a prefill engine's KV server listens on an ephemeral
// port (--bootstrap-port 0).
func startCmdEngine(t *testing.T, args ...string) *testEngine {
	t.Helper()
	base := []string{"--host=127.0.0.1", "--speedup=20", "--bootstrap-port=0", "--default-max-tokens=8",
		"--max-batch=16", "--kv-capacity-blocks=4096", "--model=sim-model"}
	c := parseCmd(t, append(base, args...)...)
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		cfg.closeResources()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &testEngine{srv: srv, base: "http://" + ln.Addr().String()}
}

// kvPort returns a prefill engine's KV server port from its BootstrapInfo.
func (e *testEngine) kvPort(t *testing.T) int {
	t.Helper()
	var bi BootstrapInfo
	if err := json.Unmarshal(e.srv.BootstrapInfo(), &bi); err != nil || bi.Port == 0 || bi.Host != "127.0.0.1" {
		t.Fatalf("bootstrap info %s: %v", e.srv.BootstrapInfo(), err)
	}
	return bi.Port
}

type leg struct {
	code   int
	body   []byte
	header http.Header
}

// both posts the two bodies to the two engines concurrently, as SGLang's
// router sends its legs.
func both(t *testing.T, path string, p *testEngine, pBody string, d *testEngine, dBody string) (leg, leg) {
	t.Helper()
	var pl, dl leg
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pl.code, pl.body, pl.header = postNoFatal(p.base+path, pBody) }()
	go func() { defer wg.Done(); dl.code, dl.body, dl.header = postNoFatal(d.base+path, dBody) }()
	wg.Wait()
	return pl, dl
}

func postNoFatal(url, body string) (int, []byte, http.Header) {
	resp, err := testClient.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return -1, []byte(err.Error()), nil
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, []byte(b.String()), resp.Header
}

const pdPrompt = "Disaggregation splits prefill from decode so that long prompts never stall the token streams of running requests."

func chatBody(stream bool, maxTokens int, extra string) string {
	return fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"stream":%v,"max_tokens":%d%s}`,
		pdPrompt, stream, maxTokens, extra)
}

func sglangFields(port int, room uint64) string {
	return fmt.Sprintf(`,"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":%d`, port, room)
}

func pdPromptTokens(t *testing.T) int {
	return chatPromptTokens(t, []tokenizer.Message{{Role: "user", Content: pdPrompt}}, nil)
}

// checkStreamTokens checks an SSE body: n content chunks, a final chunk and [DONE].
func checkStreamTokens(t *testing.T, what string, body []byte, n int) {
	t.Helper()
	events, err := readSSE(t, strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, body)
	}
	tokens := 0
	for _, ev := range events[:len(events)-1] {
		var r responseJSON
		if err := json.Unmarshal([]byte(ev), &r); err != nil {
			t.Fatalf("%s: bad chunk %q", what, ev)
		}
		if len(r.Choices) == 1 && r.Choices[0].Delta != nil && r.Choices[0].Delta.Content != nil && *r.Choices[0].Delta.Content != "" {
			tokens++
		}
	}
	if tokens != n || events[len(events)-1] != "[DONE]" {
		t.Fatalf("%s: %d tokens (want %d), last event %q", what, tokens, n, events[len(events)-1])
	}
}

func decodeResponse(t *testing.T, what string, l leg) responseJSON {
	t.Helper()
	var r responseJSON
	if l.code != 200 {
		t.Fatalf("%s: status %d: %s", what, l.code, l.body)
	}
	if err := json.Unmarshal(l.body, &r); err != nil || r.Usage == nil || len(r.Choices) != 1 {
		t.Fatalf("%s: bad response %s", what, l.body)
	}
	return r
}

// An SGLang pair serves a request the way SGLang's router sends it: the
// same body, with the prefill engine's bootstrap address and a fresh room,
// to both engines at once. The decode engine streams every token without
// prefilling; the prefill engine answers with the first token once its KV
// is transferred, and then holds nothing.
func TestSGLangPairServesNonStreamingAndStreaming(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=sglang", "--id=p0")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=sglang", "--id=d0")
	port := p.kvPort(t)
	n := pdPromptTokens(t)

	body := chatBody(false, 6, sglangFields(port, rand.Uint64()>>1))
	pl, dl := both(t, "/v1/chat/completions", p, body, d, body)
	dr := decodeResponse(t, "decode", dl)
	pr := decodeResponse(t, "prefill", pl)
	if dr.Usage.CompletionTokens != 6 || dr.Usage.PromptTokens != n || dr.Choices[0].Message == nil {
		t.Fatalf("decode response %s", dl.body)
	}
	if pr.Usage.CompletionTokens != 1 || pr.Usage.PromptTokens != n {
		t.Fatalf("prefill response %s, want the first token only", pl.body)
	}

	body = chatBody(true, 5, sglangFields(port, rand.Uint64()>>1))
	pl, dl = both(t, "/v1/chat/completions", p, body, d, body)
	if pl.code != 200 || dl.code != 200 {
		t.Fatalf("stream statuses %d %d: %s / %s", pl.code, dl.code, pl.body, dl.body)
	}
	checkStreamTokens(t, "decode stream", dl.body, 5)
	checkStreamTokens(t, "prefill stream", pl.body, 1)

	ps := p.waitStats(t, "prefill idle", func(s Stats) bool { return s.Active == 0 && s.PDRooms == 0 })
	blocks := uint64(2 * ((n + 15) / 16))
	if ps.Role != "prefill" || ps.PDMode != "sglang" || ps.Transfers != 2 || ps.BlocksTransferred != blocks ||
		ps.KVHeld != 0 || ps.GeneratedTokens != 2 || ps.TransferFailures != 0 {
		t.Fatalf("prefill stats %+v", ps)
	}
	ds := d.waitStats(t, "decode idle", func(s Stats) bool { return s.Active == 0 })
	if ds.Role != "decode" || ds.Transfers != 2 || ds.GeneratedTokens != 11 || ds.Completed != 2 || ds.Bootstrap != nil {
		t.Fatalf("decode stats %+v", ds)
	}
	_, m := p.get(t, "/metrics")
	for _, want := range []string{`infera_engine_pd_transfers_total{engine="p0"} 2`, fmt.Sprintf(`infera_engine_pd_blocks_transferred_total{engine="p0"} %d`, blocks),
		`infera_engine_kv_held_requests{engine="p0"} 0`} {
		if !strings.Contains(string(m), want) {
			t.Fatalf("prefill metrics lack %s:\n%s", want, m)
		}
	}
}

// A decode engine whose room never gets a prefill request gives up after
// --pd-waiting-timeout with a clear error, and frees what it reserved.
func TestSGLangDecodeTimesOutWithoutTransfer(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=sglang")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=sglang", "--pd-waiting-timeout=300ms")
	start := time.Now()
	code, body, _ := d.post(t, "/v1/chat/completions", chatBody(false, 4, sglangFields(p.kvPort(t), 77)))
	took := time.Since(start)
	var e struct {
		Error struct{ Message, Type string }
	}
	_ = json.Unmarshal(body, &e)
	if code != 500 || !strings.Contains(e.Error.Message, "KV transfer failed: bootstrap_room 77: timed out after 300ms") ||
		!strings.Contains(e.Error.Message, "KVPoll.WaitingForInput") || e.Error.Type != "server_error" {
		t.Fatalf("status %d body %s", code, body)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Fatalf("timed out after %v, want about 300ms", took)
	}
	ds := d.waitStats(t, "decode idle", func(s Stats) bool { return s.Active == 0 })
	if ds.TransferTimeouts != 1 || ds.TransferFailures != 1 || ds.Aborted != 1 || ds.KVWaiting != 0 {
		t.Fatalf("decode stats %+v", ds)
	}
	// The prefill engine forgets the room once the decode engine hung up.
	p.waitStats(t, "room forgotten", func(s Stats) bool { return s.PDRooms == 0 })
}

// A decode engine that cannot reach the prefill engine's bootstrap server
// fails at once; a prefill request whose decode engine never connects
// fails after --pd-bootstrap-timeout.
func TestSGLangUnreachableOrMissingPeer(t *testing.T) {
	d := startCmdEngine(t, "--role=decode", "--pd-mode=sglang")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	code, body, _ := d.post(t, "/v1/chat/completions", chatBody(false, 4, sglangFields(dead, 5)))
	if code != 500 || !strings.Contains(string(body), "cannot reach the prefill engine") {
		t.Fatalf("unreachable prefill: %d %s", code, body)
	}

	p := startCmdEngine(t, "--role=prefill", "--pd-mode=sglang", "--pd-bootstrap-timeout=200ms")
	code, body, _ = p.post(t, "/v1/chat/completions", chatBody(false, 4, sglangFields(p.kvPort(t), 6)))
	if code != 500 || !strings.Contains(string(body), "no decode engine connected within 200ms (KVPoll.Bootstrapping)") {
		t.Fatalf("lonely prefill: %d %s", code, body)
	}
	ps := p.waitStats(t, "prefill idle", func(s Stats) bool { return s.PDRooms == 0 })
	if ps.Submitted != 0 || ps.KVHeld != 0 || ps.TransferTimeouts != 1 {
		t.Fatalf("a prefill without a decode engine computed or held something: %+v", ps)
	}
}

// Prefill and decode legs with different prompts do not "transfer" the
// wrong KV: both fail.
func TestSGLangPromptMismatchFailsBothLegs(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=sglang")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=sglang")
	fields := sglangFields(p.kvPort(t), 99)
	other := strings.Replace(chatBody(false, 4, fields), "Disaggregation", "Aggregation", 1)
	pl, dl := both(t, "/v1/chat/completions", p, chatBody(false, 4, fields), d, other)
	if pl.code != 500 || dl.code != 500 || !strings.Contains(string(dl.body), "different prompts") {
		t.Fatalf("mismatched legs: prefill %d %s, decode %d %s", pl.code, pl.body, dl.code, dl.body)
	}
	p.waitStats(t, "prefill idle", func(s Stats) bool { return s.Active == 0 && s.PDRooms == 0 })
	d.waitStats(t, "decode idle", func(s Stats) bool { return s.Active == 0 })
}

func TestSGLangRequestFieldErrors(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=sglang", "--pd-bootstrap-timeout=600ms")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=sglang")
	f := func(e *testEngine, extra, want string) {
		t.Helper()
		code, body, _ := e.post(t, "/v1/completions", `{"prompt":"hello there","max_tokens":2`+extra+`}`)
		if code != 400 || !strings.Contains(string(body), want) {
			t.Fatalf("%s: %d %s, want 400 with %q", extra, code, body, want)
		}
		if strings.Contains(string(body), "hello") {
			t.Fatalf("error echoes the request: %s", body)
		}
	}
	f(p, ``, "bootstrap_room is required")
	f(p, `,"bootstrap_room":-1`, "bootstrap_room must be an integer")
	f(p, `,"bootstrap_room":1.5`, "bootstrap_room must be an integer")
	f(p, `,"bootstrap_room":[1,2]`, "bootstrap_room must be an integer")
	f(p, `,"bootstrap_room":1,"bootstrap_port":70000`, "bootstrap_port must be an integer")
	f(d, `,"bootstrap_room":1,"bootstrap_port":9`, "bootstrap_host is required")
	f(d, `,"bootstrap_host":"127.0.0.1","bootstrap_port":9`, "bootstrap_room is required")
	f(d, `,"bootstrap_host":5,"bootstrap_room":1`, "bootstrap_host must be a host name")
	f(d, `,"bootstrap_host":"evil\nline","bootstrap_room":1`, "bootstrap_host must be a host name")

	// A second prefill request for a room in use is refused.
	first := make(chan int, 1)
	go func() {
		code, _, _ := postNoFatal(p.base+"/v1/completions", `{"prompt":"a","max_tokens":2,"bootstrap_room":[3]}`)
		first <- code
	}()
	p.waitStats(t, "room open", func(s Stats) bool { return s.PDRooms == 1 })
	f(p, `,"bootstrap_room":3`, "bootstrap_room 3 is already in use")
	if code := <-first; code != 500 {
		t.Fatalf("first prefill request: %d, want 500 after its bootstrap timeout", code)
	}
}

// vLLM's serial flow, as its disaggregated proxy runs it: the prefill leg
// (max_tokens 1, stream false, kv_transfer_params do_remote_decode) returns
// kv_transfer_params; the decode leg sends them back with the original
// request and reads the blocks, which frees them on the prefill engine.
func TestVLLMPairServesNonStreamingAndStreaming(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=vllm", "--id=p0")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=vllm")
	port := p.kvPort(t)
	n := pdPromptTokens(t)
	nblocks := (n + 15) / 16
	prefillFields := `,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

	for i, stream := range []bool{false, true} {
		code, body, _ := p.post(t, "/v1/chat/completions", chatBody(false, 1, prefillFields))
		var pr struct {
			ID    string `json:"id"`
			Usage usageJSON
			KV    struct {
				DoRemotePrefill bool    `json:"do_remote_prefill"`
				DoRemoteDecode  bool    `json:"do_remote_decode"`
				BlockIDs        [][]int `json:"remote_block_ids"`
				EngineID        string  `json:"remote_engine_id"`
				RequestID       string  `json:"remote_request_id"`
				Host            string  `json:"remote_host"`
				Port            int     `json:"remote_port"`
				TPSize          int     `json:"tp_size"`
			} `json:"kv_transfer_params"`
		}
		if code != 200 || json.Unmarshal(body, &pr) != nil {
			t.Fatalf("prefill leg: %d %s", code, body)
		}
		kv := pr.KV
		if !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.BlockIDs) != 1 || len(kv.BlockIDs[0]) != nblocks ||
			kv.EngineID != "p0" || kv.RequestID != pr.ID || kv.Host != "127.0.0.1" || kv.Port != port || kv.TPSize != 1 ||
			pr.Usage.CompletionTokens != 1 {
			t.Fatalf("prefill leg kv_transfer_params: %s", body)
		}
		if s := p.stats(t); s.PDHeldRequests != 1 || s.KVHeld != 1 {
			t.Fatalf("prefill holds %d requests / %d in the core, want 1", s.PDHeldRequests, s.KVHeld)
		}
		var raw struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		_ = json.Unmarshal(body, &raw)
		decodeBody := chatBody(stream, 7, `,"kv_transfer_params":`+string(raw.KV))
		code, body, _ = d.post(t, "/v1/chat/completions", decodeBody)
		if code != 200 {
			t.Fatalf("decode leg: %d %s", code, body)
		}
		if stream {
			checkStreamTokens(t, "decode stream", body, 7)
		} else if r := decodeResponse(t, "decode", leg{code: code, body: body}); r.Usage.CompletionTokens != 7 {
			t.Fatalf("decode leg: %s", body)
		}
		ps := p.waitStats(t, "blocks freed", func(s Stats) bool { return s.PDHeldRequests == 0 && s.KVHeld == 0 })
		if ps.Transfers != uint64(i+1) {
			t.Fatalf("prefill transfers %d, want %d", ps.Transfers, i+1)
		}
		// The blocks were read once: a second read fails.
		code, body, _ = d.post(t, "/v1/chat/completions", decodeBody)
		if code != 500 || !strings.Contains(string(body), "no KV is held") {
			t.Fatalf("second read: %d %s", code, body)
		}
	}
	ds := d.waitStats(t, "decode idle", func(s Stats) bool { return s.Active == 0 })
	if ds.Transfers != 2 || ds.TransferFailures != 2 || ds.Completed != 2 || ds.GeneratedTokens != 14 {
		t.Fatalf("decode stats %+v", ds)
	}
	// The second time, the decode engine had the prompt's full blocks in
	// its own prefix cache and read only the rest.
	if hit, want := (n-1)/16, uint64(2*nblocks-(n-1)/16); hit == 0 || ds.BlocksTransferred != want || p.stats(t).BlocksTransferred != want {
		t.Fatalf("blocks read %d (prefill says %d), want %d", ds.BlocksTransferred, p.stats(t).BlocksTransferred, want)
	}
}

// A vLLM decode engine refuses a request without valid kv_transfer_params
// (real vLLM would prefill it locally; the simulator makes a router's
// mistake visible), and fails one whose blocks are gone.
func TestVLLMDecodeRefusesMissingInvalidOrStaleParams(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=vllm", "--pd-abort-request-timeout=200ms")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=vllm")
	port := p.kvPort(t)
	valid := fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[0,1,2]],"remote_engine_id":%q,"remote_request_id":"chatcmpl-1","remote_host":"127.0.0.1","remote_port":%d,"tp_size":1}`,
		p.srv.ID(), port)
	f := func(params string, code int, want string) {
		t.Helper()
		extra := ""
		if params != "" {
			extra = `,"kv_transfer_params":` + params
		}
		got, body, _ := d.post(t, "/v1/chat/completions", chatBody(false, 3, extra))
		if got != code || !strings.Contains(string(body), want) {
			t.Fatalf("params %s: %d %s, want %d with %q", params, got, body, code, want)
		}
	}
	f("", 400, "kv_transfer_params is required")
	f("null", 400, "kv_transfer_params is required")
	f(`[1]`, 400, "kv_transfer_params must be an object")
	f(strings.Replace(valid, `"do_remote_prefill":true`, `"do_remote_prefill":false`, 1), 400, "do_remote_prefill must be true")
	f(strings.Replace(valid, `"remote_host":"127.0.0.1",`, ``, 1), 400, "remote_host is required")
	f(strings.Replace(valid, `"remote_engine_id":`, `"remote_engine_ID":`, 1), 400, "remote_engine_id is required")
	f(strings.Replace(valid, fmt.Sprint(port), `"8"`, 1), 400, "remote_port must be an integer")
	f(strings.Replace(valid, `[[0,1,2]]`, `[[0],[1]]`, 1), 400, "one KV cache group")
	f(strings.Replace(valid, `[[0,1,2]]`, `[0,-1]`, 1), 400, "block ids in")
	f(strings.Replace(valid, `"do_remote_prefill":true`, `"do_remote_prefill":"yes"`, 1), 400, "do_remote_prefill must be a boolean")
	f(strings.Replace(valid, p.srv.ID(), "other-engine", 1), 500, "remote_engine_id does not name this engine")
	f(strings.Replace(valid, `"127.0.0.1"`, `"a b"`, 1), 400, "remote_host must be a host name")
	f(valid, 500, "no KV is held for the remote_request_id")

	// Blocks not read within --pd-abort-request-timeout are freed.
	code, body, _ := p.post(t, "/v1/chat/completions", chatBody(false, 1, `,"kv_transfer_params":{"do_remote_decode":true}`))
	var raw struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if code != 200 || json.Unmarshal(body, &raw) != nil || len(raw.KV) == 0 {
		t.Fatalf("prefill leg: %d %s", code, body)
	}
	p.waitStats(t, "unread blocks freed", func(s Stats) bool { return s.PDHeldRequests == 0 && s.KVHeld == 0 })
	f(string(raw.KV), 500, "freed after 200ms unread")
	d.waitStats(t, "decode idle", func(s Stats) bool { return s.Active == 0 && s.KVWaiting == 0 })
}

func TestVLLMPrefillRequestFields(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=vllm")
	code, body, _ := p.post(t, "/v1/chat/completions", chatBody(true, 1, `,"kv_transfer_params":{"do_remote_decode":true}`))
	if code != 400 || !strings.Contains(string(body), "needs stream false") {
		t.Fatalf("streaming prefill leg: %d %s", code, body)
	}
	code, body, _ = p.post(t, "/v1/chat/completions", chatBody(false, 1, `,"kv_transfer_params":{"do_remote_prefill":true}`))
	if code != 400 || !strings.Contains(string(body), "do_remote_prefill is for decode engines") {
		t.Fatalf("decode params on a prefill engine: %d %s", code, body)
	}
	// Without kv_transfer_params a vLLM prefill engine serves the request
	// whole and keeps nothing, as vLLM does.
	code, body, _ = p.post(t, "/v1/chat/completions", chatBody(false, 3, ""))
	if r := decodeResponse(t, "plain request", leg{code: code, body: body}); r.Usage.CompletionTokens != 3 || strings.Contains(string(body), "kv_transfer_params") {
		t.Fatalf("plain request on a prefill engine: %s", body)
	}
	if s := p.stats(t); s.KVHeld != 0 || s.PDHeldRequests != 0 {
		t.Fatalf("plain request left held KV: %+v", s)
	}
}

// KV events come from the prefill engine: it stores the prompt's blocks
// when it prefills them, so KV-aware routing sees them for the prefill leg.
func TestPrefillEnginePublishesPromptBlocks(t *testing.T) {
	for _, mode := range []string{"sglang", "vllm"} {
		t.Run(mode, func(t *testing.T) {
			var sink storeSink
			old := NewKVEventSink
			NewKVEventSink = func(KVEventsOptions) (KVEventSink, error) { return &sink, nil }
			p := startCmdEngine(t, "--role=prefill", "--pd-mode="+mode, "--kv-events-endpoint=tcp://127.0.0.1:1")
			NewKVEventSink = old
			d := startCmdEngine(t, "--role=decode", "--pd-mode="+mode)
			if mode == "sglang" {
				body := chatBody(false, 2, sglangFields(p.kvPort(t), 1234))
				if pl, dl := both(t, "/v1/chat/completions", p, body, d, body); pl.code != 200 || dl.code != 200 {
					t.Fatalf("pair: %d %s / %d %s", pl.code, pl.body, dl.code, dl.body)
				}
			} else {
				code, body, _ := p.post(t, "/v1/chat/completions", chatBody(false, 1, `,"kv_transfer_params":{"do_remote_decode":true}`))
				if code != 200 {
					t.Fatalf("prefill leg: %d %s", code, body)
				}
			}
			var tk tokenizer.Simple
			text, _ := tk.RenderChat(nil, []tokenizer.Message{{Role: "user", Content: pdPrompt}}, nil, true)
			want := HashBlocks(nil, tk.Encode(nil, text), 16)
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if len(sink.stored) != len(want) {
				t.Fatalf("prefill engine stored %d blocks, want the prompt's %d full blocks", len(sink.stored), len(want))
			}
			for i, h := range want {
				if sink.stored[i] != h {
					t.Fatalf("stored block %d is %x, want %x", i, sink.stored[i], h)
				}
			}
		})
	}
}

// A mixed engine ignores disaggregation fields, as SGLang and vLLM do
// without a KV connector.
func TestMixedEngineIgnoresPDFields(t *testing.T) {
	e := startCmdEngine(t)
	code, body, _ := e.post(t, "/v1/chat/completions", chatBody(false, 3,
		`,"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":2,"kv_transfer_params":{"do_remote_prefill":true}`))
	if r := decodeResponse(t, "mixed", leg{code: code, body: body}); r.Usage.CompletionTokens != 3 {
		t.Fatalf("mixed engine: %s", body)
	}
	if s := e.stats(t); s.Role != "mixed" || s.PDMode != "" || s.Bootstrap != nil {
		t.Fatalf("mixed stats %+v", s)
	}
}

func TestCmdPDFlags(t *testing.T) {
	bad := [][]string{
		{"--role=prefill"},
		{"--pd-mode=sglang"},
		{"--role=decode", "--pd-mode=tgi"},
		{"--role=prefill", "--pd-mode=vllm", "--bootstrap-port=70000"},
		{"--role=decode", "--pd-mode=vllm", "--pd-waiting-timeout=0s"},
	}
	for _, args := range bad {
		if cfg, err := parseCmd(t, args...).Config(); err == nil {
			cfg.closeResources()
			t.Fatalf("%q accepted", args)
		}
	}
	c := parseCmd(t, "--role=prefill", "--pd-mode=vllm", "--host=127.0.0.1", "--bootstrap-port=0", "--bootstrap-host=10.1.2.3",
		"--pd-abort-request-timeout=9s", "--transfer-per-block=7us")
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.closeResources()
	if cfg.PD.Role != RolePrefill || cfg.PD.Mode != PDVLLM || cfg.PD.Listener == nil || cfg.PD.AdvertiseHost != "10.1.2.3" ||
		cfg.PD.AbortRequestTimeout != 9*time.Second || cfg.Core.Time.TransferPerBlock != 7*time.Microsecond {
		t.Fatalf("PD config %+v time %+v", cfg.PD, cfg.Core.Time)
	}
	// The default port is the real engine's: 8998 for SGLang, 5600 for vLLM.
	if kvServerPort(-1, PDSGLang) != 8998 || kvServerPort(-1, PDVLLM) != 5600 || kvServerPort(0, PDVLLM) != 0 || kvServerPort(7, PDSGLang) != 7 {
		t.Fatal("--bootstrap-port defaults")
	}
	if parseCmd(t).BootstrapPort != -1 {
		t.Fatal("--bootstrap-port does not default to the mode's port")
	}
}

// storeSink records the hashes of stored blocks.
type storeSink struct {
	mu     sync.Mutex
	stored []uint64
}

func (s *storeSink) BlockStored(hashes []uint64, _ uint64, _ bool, _ []uint32, _ int) {
	s.mu.Lock()
	s.stored = append(s.stored, hashes...)
	s.mu.Unlock()
}
func (s *storeSink) BlockRemoved([]uint64) {}
func (s *storeSink) AllCleared()           {}
func (s *storeSink) Close() error          { return nil }

// The decode engine's first token waits for the prefill and for the
// transfer, whose time grows with the prompt's blocks; after it, tokens come
// at the decode engine's own step rate. (Lower bounds on simulated time.)
func TestPDFirstTokenWaitsForPrefillAndTransfer(t *testing.T) {
	args := []string{"--speedup=1", "--transfer-per-block=2ms", "--kv-capacity-blocks=8192"}
	prompt := strings.Repeat("seven ", 2000)
	tm := DefaultTimeModel()
	tm.TransferPerBlock = 2 * time.Millisecond
	var tk tokenizer.Simple
	n := len(tk.Encode(nil, []byte(prompt)))
	prefill := tm.PrefillTime(n, 1)
	transfer := tm.TransferTime((n + 15) / 16)
	for _, mode := range []string{"sglang", "vllm"} {
		t.Run(mode, func(t *testing.T) {
			p := startCmdEngine(t, append(args, "--role=prefill", "--pd-mode="+mode)...)
			d := startCmdEngine(t, append(args, "--role=decode", "--pd-mode="+mode)...)
			body := func(stream bool, extra string) string {
				return fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"stream":%v%s}`, prompt, stream, extra)
			}
			start := time.Now()
			var dBody string
			if mode == "sglang" {
				dBody = body(true, sglangFields(p.kvPort(t), 42))
				go func() { _, _, _ = postNoFatal(p.base+"/v1/completions", body(false, sglangFields(p.kvPort(t), 42))) }()
			} else {
				code, b, _ := p.post(t, "/v1/completions", body(false, `,"kv_transfer_params":{"do_remote_decode":true}`))
				var raw struct {
					KV json.RawMessage `json:"kv_transfer_params"`
				}
				if code != 200 || json.Unmarshal(b, &raw) != nil {
					t.Fatalf("prefill leg: %d %s", code, b)
				}
				if took := time.Since(start); took < prefill {
					t.Fatalf("prefill leg answered after %v, before its %v prefill", took, prefill)
				}
				dBody = body(true, `,"kv_transfer_params":`+string(raw.KV))
			}
			ttft, _ := streamTTFT(t, d, dBody)
			total := time.Since(start)
			t.Logf("prompt %d tokens: prefill %v + transfer %v; decode engine's first token after %v", n, prefill, transfer, total)
			if mode == "sglang" && ttft < prefill+transfer || mode == "vllm" && ttft < transfer {
				t.Fatalf("decode engine's first token after %v: it did not wait for the prefill (%v) and the transfer (%v)", ttft, prefill, transfer)
			}
			ds := d.waitStats(t, "decode idle", func(s Stats) bool { return s.Active == 0 })
			if ds.Completed != 1 || ds.BlocksTransferred != uint64((n+15)/16) || ds.Transfers != 1 {
				t.Fatalf("decode stats %+v", ds)
			}
			ps := p.waitStats(t, "prefill idle", func(s Stats) bool { return s.Active == 0 })
			if ps.BlocksTransferred != uint64((n+15)/16) {
				t.Fatalf("prefill sent %d blocks, want %d", ps.BlocksTransferred, (n+15)/16)
			}
		})
	}
}

// A null bootstrap_port means the decode engine's own configured port, as
// SGLang's scheduler substitutes --disaggregation-bootstrap-port.
func TestSGLangNullBootstrapPortUsesOwnPort(t *testing.T) {
	p := startCmdEngine(t, "--role=prefill", "--pd-mode=sglang")
	d := startCmdEngine(t, "--role=decode", "--pd-mode=sglang", fmt.Sprintf("--bootstrap-port=%d", p.kvPort(t)))
	body := chatBody(false, 3, `,"bootstrap_host":["127.0.0.1"],"bootstrap_port":[null],"bootstrap_room":[8]`)
	pl, dl := both(t, "/v1/chat/completions", p, body, d, body)
	if r := decodeResponse(t, "decode", dl); pl.code != 200 || r.Usage.CompletionTokens != 3 {
		t.Fatalf("null port: prefill %d %s, decode %s", pl.code, pl.body, dl.body)
	}
}
