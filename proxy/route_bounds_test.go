package proxy

import (
	"runtime"
	"strings"
	"testing"
)

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
	if alloc > 24*uint64(len(body)) {
		t.Fatalf("a %d-byte body with %d values in its documents allocated %d MB while routed (%.0fx its size)",
			len(body), n, alloc>>20, float64(alloc)/float64(len(body)))
	}
}
