package proxy

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// A content given as parts renders as vLLM flattens it for a template that
// takes content as a string (Qwen3's): its non-empty "text" parts joined by
// "\n", other parts (images) and other parts' "text" fields left out. The
// router concatenated every "text" field, so the block hashes of any
// multi-part message differed from the engine's from that message on.
func TestContentPartsRenderJoinedAsVLLMJoinsThem(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Describe"},` +
		`{"type":"image_url","image_url":{"url":"data:x"},"text":"not text"},{"type":"text","text":""},` +
		`{"text":"this \u0069mage","type":"t\u0065xt"},{"type":"text","text":"please"}]}]}`
	code, b := post(t, r.url+"/tokenize", body)
	if code != 200 {
		t.Fatalf("/tokenize: %d %s", code, b)
	}
	var got struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(b), &got); err != nil {
		t.Fatal(err)
	}
	render, err := tok.RenderChat(nil, []tokenizer.Message{{Role: "user", Content: "Describe\nthis image\nplease"}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := tok.Encode(nil, render); !slices.Equal(got.Tokens, want) {
		t.Fatalf("router encoded %q, want %q", tok.Decode(got.Tokens), render)
	}
}

// A render the router's own template bounds stop (here one message longer
// than the template engine's 16 MiB string bound) was answered 400 with
// the router's internal limit ("template string exceeds 16777216 bytes"),
// though the body was within --max-body-bytes and the engine, with its own
// renderer, decides what it accepts. It is routed without block hashes, as
// a conversation too long to render whole is.
func TestARenderStoppedByTheRoutersOwnBoundsIsRoutedWithoutHashes(t *testing.T) {
	dir := qwen3Dir(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int32
	eng := &fasthttp.Server{MaxRequestBodySize: 64 << 20, Handler: func(ctx *fasthttp.RequestCtx) {
		hits.Add(1)
		okHandler(ctx)
	}}
	go eng.Serve(ln)
	t.Cleanup(func() { eng.Shutdown() })
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	f.MaxBodyBytes = 32 << 20
	r := startRouter(t, f, nil, "http://"+ln.Addr().String())
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 17<<20/5) + `"}]}`
	if code, b := post(t, r.url+"/v1/chat/completions", body); code != 200 || b != okJSON {
		t.Fatalf("%d %.300s", code, b)
	}
	if hits.Load() != 1 {
		t.Fatalf("the engine got %d requests", hits.Load())
	}
}

// A chat that turns the generation prompt off, or continues its final
// message (continue_final_message: what the Anthropic conversion asks for
// an assistant prefill), is tokenized as vLLM renders it: without the
// generation prompt, and cut after the final message's content. The router
// always appended the generation prompt (and, for a continued message, the
// template's end of turn), so /tokenize, count_tokens and the block
// hashes of such a prompt differed from the engine's at its end.
func TestAChatThatContinuesItsFinalMessageIsTokenizedAsTheEngineRendersIt(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware" // the built-in Simple tokenizer (ChatML-like)
	r := startRouter(t, f, nil, up.url)
	tokens := func(path, body string) []uint32 {
		t.Helper()
		code, b := post(t, r.url+path, body)
		var got struct {
			Tokens      []uint32 `json:"tokens"`
			InputTokens int      `json:"input_tokens"`
		}
		if code != 200 || json.Unmarshal([]byte(b), &got) != nil {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		if got.Tokens == nil {
			got.Tokens = make([]uint32, got.InputTokens)
		}
		return got.Tokens
	}
	encode := func(text string) []uint32 { return tokenizer.Simple{}.Encode(nil, []byte(text)) }
	const user = `{"role":"user","content":"What is the capital of France?"}`
	for _, c := range []struct{ body, want string }{
		{`{"model":"m","messages":[` + user + `]}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"},
		{`{"model":"m","messages":[` + user + `],"add_generation_prompt":false}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"},
		{`{"model":"m","add_generation_prompt":true,"add_generation_prompt":false,"messages":[` + user + `]}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"}, // the last copy, as the engine reads it
		{`{"model":"m","messages":[` + user + `,{"role":"assistant","content":"The capital is "}],"add_generation_prompt":false,"continue_final_message":true}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is "},
	} {
		if got, want := tokens("/tokenize", c.body), encode(c.want); !slices.Equal(got, want) {
			t.Fatalf("/tokenize %s:\ngot  %q\nwant %q", c.body, tokenizer.Simple{}.AppendDecode(nil, got), c.want)
		}
	}
	// An Anthropic prefill: counted as the engine renders the converted
	// chat, which continues the assistant's message.
	got := tokens("/v1/messages/count_tokens", `{"model":"m","messages":[`+user+`,{"role":"assistant","content":"The capital is "}]}`)
	if want := encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is "); len(got) != len(want) {
		t.Fatalf("count_tokens of a prefill: %d, want %d", len(got), len(want))
	}
}
