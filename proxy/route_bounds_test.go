package proxy

import (
	"runtime"
	"strings"
	"testing"
)

// routedAlloc sends body to r's chat endpoint and returns what the process
// allocated while it was answered (200 expected).
func routedAlloc(t *testing.T, r *testRouter, body string) uint64 {
	t.Helper()
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	code, b := post(t, r.url+"/v1/chat/completions", body)
	runtime.ReadMemStats(&m1)
	if code != 200 {
		t.Fatalf("%d %.300s", code, b)
	}
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("body %d bytes, allocated %d MB (%.0fx)", len(body), alloc>>20, float64(alloc)/float64(len(body)))
	return alloc
}

// An assistant message with many tool calls was rendered whole for
// routing however far it ran past --router-tokenize-max-bytes (the message
// that crosses the limit is always included): every call decoded and two
// template objects built for each, about 2.4 KB of heap a 42-byte call (a
// 29 MB body allocated 1.5 GB and 4.5 s of CPU). Past maxRouteElems calls
// the chat is routed without block hashes; the router's work on a prompt
// stays within a small multiple of its body.
func TestManyToolCallsInOneMessageAreNotRenderedForRouting(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	f.MaxBodyBytes = 32 << 20
	r := startRouter(t, f, nil, up.url)
	const calls = 90_000
	body := `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x","tool_calls":[` +
		strings.TrimSuffix(strings.Repeat(`{"function":{"name":"a","arguments":"b"}},`, calls), ",") + `]}]}`
	post(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"warm"}]}`)
	alloc := routedAlloc(t, r, body)
	if alloc > 24*uint64(len(body)) {
		t.Fatalf("a %d-byte body with %d tool calls allocated %d MB while routed (%.0fx its size)",
			len(body), calls, alloc>>20, float64(alloc)/float64(len(body)))
	}
}

// A tools array within --router-tokenize-max-bytes but of many elements
// (256 KB of [0,0,...]: the template looped over 131,000 of them) cost
// ~150 MB and ~230 ms of CPU per request, ~570 times the body. Past
// maxRouteElems tools the chat is routed without block hashes.
func TestToolsWithinTheByteLimitCostAboutTheirSize(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizeMaxBytes, f.RouterTokenizerPath = "kv-aware", 262144, dir
	r := startRouter(t, f, nil, up.url)
	post(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"warm"}]}`)
	const n = 131000
	body := `{"model":"m","tools":[` + strings.TrimSuffix(strings.Repeat(`0,`, n), ",") +
		`],"messages":[{"role":"user","content":"hi"}]}`
	alloc := routedAlloc(t, r, body)
	if alloc > 24*uint64(len(body)) {
		t.Fatalf("a %d-byte body with %d-byte tools allocated %d MB while routed (%.0fx its size)",
			len(body), 2*n+1, alloc>>20, float64(alloc)/float64(len(body)))
	}
}

// Documents within --router-tokenize-max-bytes but of many values (256 KB
// of [{"text":[0,0,...]}]: one document, so within the maxRouteElems
// documents) cost 54 MB and ~90 ms of routing per request, 218 times the
// body: each value becomes a template object. Past maxRouteElems values
// the chat is routed without block hashes, as chat_template_kwargs is.
func TestDocumentsWithinTheByteLimitCostAboutTheirSize(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizeMaxBytes, f.RouterTokenizerPath = "kv-aware", 262144, dir
	r := startRouter(t, f, nil, up.url)
	post(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"warm"}]}`)
	const n = 131000
	body := `{"model":"m","documents":[{"text":[` + strings.TrimSuffix(strings.Repeat(`0,`, n), ",") +
		`]}],"messages":[{"role":"user","content":"hi"}]}`
	alloc := routedAlloc(t, r, body)
	if alloc > 24*uint64(len(body)) {
		t.Fatalf("a %d-byte body with %d values in its documents allocated %d MB while routed (%.0fx its size)",
			len(body), n, alloc>>20, float64(alloc)/float64(len(body)))
	}
}

// One tool whose schema holds 120,000 tiny values (240 KB, within
// --router-tokenize-max-bytes and the 1024-tool bound; varied, so never
// cached) cost 61 MB and ~120 ms of routing per request: each value became
// a template value. The renderer parses at most tokenizer.MaxToolValues
// values of tools; past them the chat is routed without block hashes.
func TestToolsOfManyValuesCostNoMoreThanTheirBound(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizeMaxBytes, f.RouterTokenizerPath = "kv-aware", 262144, dir
	r := startRouter(t, f, nil, up.url)
	post(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"warm"}]}`)
	const n = 120000
	body := `{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","enum":[` +
		strings.TrimSuffix(strings.Repeat(`0,`, n), ",") + `]}}}],"messages":[{"role":"user","content":"hi"}]}`
	alloc := routedAlloc(t, r, body)
	if alloc > 16<<20 {
		t.Fatalf("a %d-byte body with %d values in one tool allocated %d MB while routed", len(body), n, alloc>>20)
	}
}

// Tools nested deeper than the renderer parses (128 containers; the body
// may nest 256 and vLLM's parser takes more) are the router's bound, not the
// client's error: the chat is routed without block hashes. It was refused
// with 400 "cannot parse tools: ... nested too deeply".
func TestToolsNestedPastTheRenderersDepthAreRoutedNotRefused(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	params := strings.Repeat(`{"a":[`, 70) + "0" + strings.Repeat(`]}`, 70) // 140 containers deep
	body := `{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":` + params +
		`}}],"messages":[{"role":"user","content":"hi"}]}`
	cuts := mTokenizeCut.Get()
	if code, b := post(t, r.url+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("%d %.300s", code, b)
	}
	if mTokenizeCut.Get() != cuts+1 {
		t.Fatal("the chat was not counted as routed without block hashes")
	}
}

// Anthropic's count_tokens answered by the router says a prompt past the
// renderer's bounds is the router's limit, not a template the prompt
// cannot render.
func TestCountTokensPastTheRenderersBoundsSaysSo(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	body := `{"model":"m","tools":[{"name":"f","input_schema":{"type":"object","enum":[` +
		strings.TrimSuffix(strings.Repeat(`0,`, 20000), ",") + `]}}],"messages":[{"role":"user","content":"hi"}]}`
	code, b := post(t, r.url+"/v1/messages/count_tokens", body)
	if code != 400 || !strings.Contains(b, `"type":"error"`) || !strings.Contains(b, "beyond what the router renders") {
		t.Fatalf("%d %.300s", code, b)
	}
}
