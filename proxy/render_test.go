package proxy

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
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

// A chat's chat_template_kwargs reach the template as vLLM (v0.19 and
// later, through v0.28) passes them: its keys are template variables set
// over the request's tools (Qwen3's enable_thinking: false adds the empty
// think block to the generation prompt; tools are replaced), under the
// request's own add_generation_prompt, continue_final_message, documents
// and reasoning_effort (ChatCompletionRequest.build_chat_params merges
// them over the kwargs with renderers.merge_kwargs), and a null or "auto"
// value is dropped (ChatParams.with_defaults); also in a stream (whose
// body the router rewrites before tokenizing). The router ignored them:
// the engine saw 13 tokens where the router hashed and counted 9; then let
// every kwarg win, so {"add_generation_prompt": false} was hashed 3
// tokens short of the engine's prompt and {"tools": null} without the
// request's tools. Kwargs the router cannot render as the engine would
// (another template) leave the chat without hashes.
func TestChatTemplateKwargsReachTheTemplateAsVLLMPassesThem(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	const (
		user     = `<|im_start|>user` + "\n" + `hi<|im_end|>` + "\n"
		gen      = `<|im_start|>assistant` + "\n"
		noThink  = `<think>` + "\n\n" + `</think>` + "\n\n"
		tool     = `{"type":"function","function":{"name":"f","description":"d","parameters":{}}}`
		toolText = `{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}`
	)
	withTools := `<|im_start|>system` + "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + toolText + "\n</tools>\n\n" +
		"For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" + user + gen
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	f2 := func(name, body, want string) {
		t.Helper()
		code, b := post(t, r.url+"/tokenize", body)
		if code != 200 {
			t.Fatalf("%s: /tokenize: %d %s", name, code, b)
		}
		var got struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal([]byte(b), &got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, tok.Encode(nil, []byte(want))) {
			t.Errorf("%s: router encoded %q, want %q", name, tok.Decode(got.Tokens), want)
		}
	}
	f2("no kwargs", `{"model":"m",`+msgs+`}`, user+gen)
	f2("thinking off", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"enable_thinking":false}}`, user+gen+noThink)
	f2("thinking off, streamed", `{"model":"m","stream":true,`+msgs+`,"chat_template_kwargs":{"enable_thinking":false}}`, user+gen+noThink)
	f2("thinking on", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"enable_thinking":true}}`, user+gen)
	f2("the last copy", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"enable_thinking":false},"chat_template_kwargs":null}`, user+gen)
	f2("the request's add_generation_prompt", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"add_generation_prompt":false}}`, user+gen)
	f2("the request's add_generation_prompt, false", `{"model":"m",`+msgs+`,"add_generation_prompt":false,"chat_template_kwargs":{"add_generation_prompt":true}}`, user)
	f2("the request's continue_final_message", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"continue_final_message":true}}`, user+gen)
	f2("tools replaced", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"tools":[`+tool+`]}}`, withTools)
	f2("null tools dropped", `{"model":"m",`+msgs+`,"tools":[`+tool+`],"chat_template_kwargs":{"tools":null}}`, withTools)
	f2("null enable_thinking dropped", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"enable_thinking":null}}`, user+gen)
	f2("another template", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"chat_template":"{{ 1 }}"}}`, "")
	f2("not an object", `{"model":"m",`+msgs+`,"chat_template_kwargs":[1]}`, "")
	deep := strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40)
	f2("nested deeply", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"x":`+deep+`}}`, "")
	many := "[" + strings.Repeat("0,", 2000) + "0]"
	f2("too many values", `{"model":"m",`+msgs+`,"chat_template_kwargs":{"x":`+many+`}}`, "")
}

// A chat's reasoning_effort reaches the template as vLLM (v0.28,
// ChatCompletionRequest.build_chat_params; PR #43401) passes it: as the
// reasoning_effort variable, over chat_template_kwargs', and as
// enable_thinking (false for "none", true otherwise) unless
// chat_template_kwargs names enable_thinking. Qwen3's template reads
// enable_thinking: a chat with reasoning_effort "none" gets the empty think
// block in the engine's prompt, and the router hashed it without.
func TestReasoningEffortReachesTheTemplateAsVLLMPassesIt(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	const (
		user    = `<|im_start|>user` + "\n" + `hi<|im_end|>` + "\n"
		gen     = `<|im_start|>assistant` + "\n"
		noThink = `<think>` + "\n\n" + `</think>` + "\n\n"
		msgs    = `"messages":[{"role":"user","content":"hi"}]`
	)
	for _, c := range []struct{ name, body, want string }{
		{"none", `{"model":"m",` + msgs + `,"reasoning_effort":"none"}`, user + gen + noThink},
		{"high", `{"model":"m",` + msgs + `,"reasoning_effort":"high"}`, user + gen},
		{"null", `{"model":"m",` + msgs + `,"reasoning_effort":null}`, user + gen},
		{"the last copy", `{"model":"m",` + msgs + `,"reasoning_effort":"high","reasoning_effort":"none"}`, user + gen + noThink},
		{"kwargs' enable_thinking kept", `{"model":"m",` + msgs + `,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}}`, user + gen},
		{"over kwargs' reasoning_effort", `{"model":"m",` + msgs + `,"reasoning_effort":"none","chat_template_kwargs":{"reasoning_effort":"high"}}`, user + gen + noThink},
	} {
		code, b := post(t, r.url+"/tokenize", c.body)
		var got struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal([]byte(b), &got) != nil {
			t.Fatalf("%s: /tokenize: %d %s", c.name, code, b)
		}
		if !slices.Equal(got.Tokens, tok.Encode(nil, []byte(c.want))) {
			t.Errorf("%s: router encoded %q, want %q", c.name, tok.Decode(got.Tokens), c.want)
		}
	}
}

// vLLM validates each tool into its ChatCompletionToolsParam and hands the
// template tool.model_dump(): type first ("function" when absent), then
// function with its name, description and parameters first (null when
// absent), other keys after. Qwen3 writes each tool with tojson, so a tool
// without a description, or with its keys in another order, rendered other
// text in the router than in the engine, and every block hash of the chat
// (the tools lead the prompt) missed the engine's cache.
func TestToolsRenderAsVLLMDumpsThem(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tokens := func(tools string) []uint32 {
		t.Helper()
		code, b := post(t, r.url+"/tokenize", `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":`+tools+`}`)
		if code != 200 {
			t.Fatalf("/tokenize: %d %s", code, b)
		}
		var got struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal([]byte(b), &got); err != nil {
			t.Fatal(err)
		}
		return got.Tokens
	}
	dumped := tokens(`[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"},"x":1},"y":2}]`)
	for _, tools := range []string{
		`[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"x":1},"y":2}]`,
		`[{"y":2,"function":{"x":1,"parameters":{"type":"object"},"name":"f"},"type":"function"}]`,
		`[{"function":{"name":"f","parameters":{"type":"object"},"x":1},"y":2}]`,
	} {
		if got := tokens(tools); !slices.Equal(got, dumped) {
			tok, _ := tokenizer.Load(dir)
			t.Errorf("tools %s: router encoded %q, want %q", tools, tok.Decode(got), tok.Decode(dumped))
		}
	}
}

// A chat naming tools twice is rendered with the last copy, as the engine
// (Python's json, the last duplicate key wins) reads it: the router kept
// the last array, so "tools":[...],"tools":null rendered tools the engine
// never saw.
func TestTheLastToolsOfAChatAreRendered(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tokens := func(tools string) string {
		t.Helper()
		code, b := post(t, r.url+"/tokenize", `{"model":"m","messages":[{"role":"user","content":"hi"}]`+tools+`}`)
		if code != 200 {
			t.Fatalf("/tokenize: %d %s", code, b)
		}
		return b
	}
	const tool = `[{"type":"function","function":{"name":"f","description":"d","parameters":{}}}]`
	none := tokens("")
	for _, tools := range []string{`,"tools":` + tool + `,"tools":null`, `,"tools":` + tool + `,"tools":[]`} {
		if got := tokens(tools); got != none {
			t.Errorf("%s: router encoded %s, want %s", tools, got, none)
		}
	}
	if got := tokens(`,"tools":null,"tools":` + tool); got == none {
		t.Error("the last tools were not rendered")
	}
}

// A chat longer than --router-tokenize-max-bytes renders its leading
// messages ending on a user message, the first one too: a conversation with
// no system prompt whose first answer passed the bound ([user, assistant,
// user]) rendered [user, assistant], so Qwen3's template wrote the answer as
// the final turn (with a think block) and the router's tokens left the
// engine's after 9 tokens: /tokenize answered 18 tokens, not truncated, for
// a prompt whose first 18 the engine did not have.
func TestALongChatsPartEndsOnItsFirstUserMessage(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	f.RouterTokenizeMaxBytes = 4096
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokenizer.Message{
		{Role: "user", Content: "Summarize the report."},
		{Role: "assistant", Content: strings.Repeat("The report says many things. ", 300)},
		{Role: "user", Content: "Shorter, please."},
	}
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	code, b := post(t, r.url+"/tokenize", string(body))
	if code != 200 {
		t.Fatalf("/tokenize: %d %s", code, b)
	}
	var got struct {
		Tokens    []uint32 `json:"tokens"`
		Truncated bool     `json:"truncated"`
	}
	if err := json.Unmarshal([]byte(b), &got); err != nil {
		t.Fatal(err)
	}
	render, err := tok.RenderChat(nil, msgs, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	full := tok.Encode(nil, render)
	part, err := tok.RenderChat(nil, msgs[:1], nil, false)
	if err != nil {
		t.Fatal(err)
	}
	want := tok.Encode(nil, part)
	if !slices.Equal(got.Tokens, want) || !slices.Equal(want, full[:len(want)]) || !got.Truncated {
		t.Fatalf("router encoded %.120q (%d tokens, truncated %v), want the first user message's %q (%d), leading the whole's %.120q",
			tok.Decode(got.Tokens), len(got.Tokens), got.Truncated, part, len(want), render)
	}
}

// Tool call arguments are tokenized as vLLM renders them: decoded from the
// client's JSON (string or, as some clients send it, an object) and written
// by the template's tojson, so a compact string, a spaced one and an object
// give the same tokens, the engine's; arguments that are not JSON (or a
// number) render as an empty object, as vLLM's json.loads fallback does.
// The router rendered the client's string as it was and every block after
// an agent's first tool call differed from the engine's.
func TestToolCallArgumentsAreTokenizedAsVLLMDecodesThem(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tokens := func(args string) []uint32 {
		t.Helper()
		body := `{"model":"m","messages":[{"role":"user","content":"Weather in Paris?"},` +
			`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":` + args + `}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"18 C"}]}`
		code, b := post(t, r.url+"/tokenize", body)
		var got struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal([]byte(b), &got) != nil {
			t.Fatalf("/tokenize: %d %s", code, b)
		}
		return got.Tokens
	}
	render := func(rendered string) []uint32 {
		t.Helper()
		text := "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n" +
			`{"name": "get_weather", "arguments": ` + rendered + "}\n</tool_call><|im_end|>\n" +
			"<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
		return tok.Encode(nil, []byte(text))
	}
	for _, c := range []struct{ args, rendered string }{
		{`"{\"city\":\"Paris\",\"days\":2}"`, `{"city": "Paris", "days": 2}`},
		{`"{\"city\": \"Paris\", \"days\": 2}"`, `{"city": "Paris", "days": 2}`},
		{`{"city":"Paris","days":2}`, `{"city": "Paris", "days": 2}`},
		{`"not json"`, `{}`},
		{`5`, `{}`},
	} {
		if got, want := tokens(c.args), render(c.rendered); !slices.Equal(got, want) {
			t.Errorf("arguments %s: the router encoded\n%q\nwant\n%q", c.args, tok.Decode(got), tok.Decode(want))
		}
	}
}

// An assistant's reasoning is tokenized as current vLLM renders it: its
// request model renames the deprecated reasoning_content to reasoning when
// reasoning is not given (null is not given), and its chat_utils hands the
// template an assistant's reasoning (as reasoning and reasoning_content),
// no other role's. The router read reasoning_content alone, so a client
// echoing vLLM's newer `reasoning` field back (an agent's tool-call turn)
// was tokenized without it, and a user message's reasoning_content was
// rendered.
func TestReasoningIsTokenizedAsVLLMReadsIt(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, assistant string // extra fields of the user's and the assistant's message
		content         string
		want            *string // the reasoning the template gets
	}{
		{``, `"reasoning":"R1",`, "ok", ptr("R1")},
		{``, `"reasoning":"R1","reasoning_content":"R2",`, "ok", ptr("R1")},
		{``, `"reasoning_content":"R2","reasoning":"R1",`, "ok", ptr("R1")},
		{``, `"reasoning":null,"reasoning_content":"R2",`, "ok", ptr("R2")},
		{``, `"reasoning_content":"R2",`, "ok", ptr("R2")},
		{``, `"reasoning_content":"",`, "<think>in content</think>ok", ptr("")},
		{``, `"reasoning_content":null,`, "<think>in content</think>ok", nil},
		{`"reasoning":"U","reasoning_content":"U",`, ``, "ok", nil},
	} {
		body := `{"model":"m","messages":[{"role":"user",` + c.user + `"content":"Weather?"},` +
			`{"role":"assistant",` + c.assistant + `"content":"` + c.content + `","tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"18 C"}]}`
		code, b := post(t, r.url+"/tokenize", body)
		var got struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal([]byte(b), &got) != nil {
			t.Fatalf("/tokenize: %d %s", code, b)
		}
		msgs := []tokenizer.Message{{Role: "user", Content: "Weather?"}, {Role: "assistant", Content: c.content,
			ToolCalls: []tokenizer.ToolCall{{ID: "c1", Type: "function"}}}, {Role: "tool", ToolCallID: "c1", Content: "18 C"}}
		msgs[1].ToolCalls[0].Function.Name, msgs[1].ToolCalls[0].Function.Arguments = "w", "{}"
		if c.want != nil {
			msgs[1].ReasoningContent, msgs[1].HasReasoning = *c.want, true
		}
		text, err := tok.RenderChat(nil, msgs, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		if want := tok.Encode(nil, text); !slices.Equal(got.Tokens, want) {
			t.Errorf("user {%s} assistant {%s}: the router encoded\n%q\nwant\n%q", c.user, c.assistant, tok.Decode(got.Tokens), text)
		}
	}
}

func ptr(s string) *string { return &s }

// A template that loops over a message's content (Qwen2.5-VL's, Llama 3.2
// Vision's) gets each content as a list of parts, as vLLM's
// --chat-template-content-format auto detects and hands it over
// (vllm/renderers/hf.py, chat_utils._parse_chat_message_content): a string
// is one text part, each text part of an array stays a part (an empty one
// too), media parts become {"type": "image"}, an absent or null content no
// parts, and a tool message's text parts are joined by "\n" into a string.
// The router passed every content as a string, the text parts joined: a
// chat of text and image parts rendered "a\nb" where the engine rendered
// "a<|vision_start|><|image_pad|><|vision_end|>b", and templates without
// a string fallback (Llama 3.2 Vision's) refused every chat, routed
// without hashes. The expected prompt is Python jinja2's render of vLLM's
// conversation.
func TestContentLoopingTemplatesGetContentPartsAsVLLMPassesThem(t *testing.T) {
	src := qwen3Dir(t)
	tpl, err := os.ReadFile("../jinja/testdata/templates/hfjs-Qwen-Qwen2.5-VL-7B-Instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	abs, _ := filepath.Abs(filepath.Join(src, "tokenizer.json"))
	cfg, _ := json.Marshal(map[string]string{"chat_template": string(tpl), "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
	if os.Symlink(abs, filepath.Join(dir, "tokenizer.json")) != nil || os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644) != nil {
		t.Fatal("cannot write the tokenizer")
	}
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[
		{"role":"system","content":"You are helpful."},
		{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/i.png"}},{"type":"text","text":""},{"type":"text","text":"b"}]},
		{"role":"assistant","content":"ok"},
		{"role":"tool","content":[{"type":"text","text":"r1"},{"type":"text","text":""},{"type":"text","text":"r2"}]},
		{"role":"user","content":[{"type":"text","text":"again"}]},
		{"role":"assistant","content":null}]}`
	want := "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\na<|vision_start|><|image_pad|><|vision_end|>b<|im_end|>\n" +
		"<|im_start|>assistant\nok<|im_end|>\n<|im_start|>tool\nr1\n\nr2<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n" +
		"<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
	for i := 0; i < 2; i++ { // the second time with the message slots reused
		if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
			t.Fatalf("router encoded %q, want %q", tok.Decode(got), want)
		}
	}
	// continue_final_message cuts after the final message's last text part,
	// as transformers' apply_chat_template finds it in a list of parts (the
	// parts' texts joined by "\n" are not in the prompt: it was not cut).
	body = `{"model":"m","add_generation_prompt":false,"continue_final_message":true,"messages":[
		{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`
	want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nab"
	if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
		t.Fatalf("continued: router encoded %q, want %q", tok.Decode(got), want)
	}
}

// A content given as many parts costs the router no more than its text:
// the parts are kept (32 bytes each, in a pooled message slot) only for a
// template that gets contents as parts, and such a template, which builds
// an object per part, renders at most maxRouteElems of them, as tool calls;
// past that the chat is routed without tokens. Before, every part was kept
// whatever the template, and all of them rendered: one request of 1.4
// million image parts (29 MB) took the router from 47 to 329 MB RSS.
func TestAContentOfManyPartsCostsNoMoreThanItsText(t *testing.T) {
	manyParts := func(n int) string {
		parts := make([]string, n) // n parts: text and image in turn
		for i := range parts {
			parts[i] = `{"type":"text","text":"a"}`
			if i%2 == 1 {
				parts[i] = `{"type":"image_url"}`
			}
		}
		return `{"model":"m","messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`
	}
	tokenize := func(r *testRouter, body string) *reqState {
		t.Helper()
		rs := &reqState{}
		if err := rs.parsed.parse([]byte(body), kindChat); err != nil {
			t.Fatal(err)
		}
		if err := r.srv.tokenize(rs, []byte(body), kindChat); err != nil {
			t.Fatal(err)
		}
		return rs
	}
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	simple := startRouter(t, f, nil, up.url)
	rs := tokenize(simple, manyParts(20000))
	if rs.tokSkip || len(rs.tokens) == 0 {
		t.Fatalf("the built-in tokenizer did not tokenize the chat (skipped %v)", rs.tokSkip)
	}
	if n := cap(rs.msgs[0].Parts); n != 0 {
		t.Fatalf("a template that takes contents as strings: %d parts kept", n)
	}

	src := qwen3Dir(t)
	tpl, err := os.ReadFile("../jinja/testdata/templates/hfjs-Qwen-Qwen2.5-VL-7B-Instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	abs, _ := filepath.Abs(filepath.Join(src, "tokenizer.json"))
	cfg, _ := json.Marshal(map[string]string{"chat_template": string(tpl), "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
	if os.Symlink(abs, filepath.Join(dir, "tokenizer.json")) != nil || os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644) != nil {
		t.Fatal("cannot write the tokenizer")
	}
	f = defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	parts := startRouter(t, f, nil, up.url)
	if rs := tokenize(parts, manyParts(maxRouteElems)); rs.tokSkip || len(rs.msgs[0].Parts) != maxRouteElems {
		t.Fatalf("%d parts: skipped %v, %d parts kept", maxRouteElems, rs.tokSkip, len(rs.msgs[0].Parts))
	}
	if rs := tokenize(parts, manyParts(maxRouteElems+1)); !rs.tokSkip {
		t.Fatalf("%d parts rendered for routing, want at most %d", len(rs.msgs[0].Parts), maxRouteElems)
	}
}

// vLLM parses every one of its text part types as text (chat_utils'
// TEXT_PART_TYPES, _parse_chat_message_content_part): "text", "input_text"
// and "output_text" (their "text"), "refusal" (its "refusal") and
// "thinking" (its "thinking"), each a {"type": "text"} part, and joins the
// non-empty texts by "\n" for a template that takes content as a string.
// A "text" or "refusal" part without its text is dropped; an "input_text",
// "output_text" or "thinking" one only from the joined string (a template
// that loops over the parts gets its text as None). The router skipped
// every type but "text": a Responses-style chat of input_text parts was
// hashed with an empty user turn, 2 of its 8 tokens missing, and Qwen3's
// prompt lost the assistant's refusal. The expected parts prompt is Python
// jinja2's render of vLLM's conversation.
func TestTextPartTypesRenderAsVLLMParsesThem(t *testing.T) {
	dir := qwen3Dir(t)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	const parts = `[{"type":"input_text","text":"a"},{"type":"thinking","thinking":"t"},{"type":"refusal","refusal":"r"},` +
		`{"type":"output_text"},{"type":"refusal","text":"dropped"},{"type":"input_text","text":""},{"type":"output_text","text":"o"}]`
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	body := `{"model":"m","messages":[{"role":"user","content":` + parts + `},{"role":"assistant","content":[{"type":"refusal","refusal":"No."}]},` +
		`{"role":"user","content":[{"type":"input_text","text":"why"}]}]}`
	want := "<|im_start|>user\na\nt\nr\no<|im_end|>\n<|im_start|>assistant\nNo.<|im_end|>\n<|im_start|>user\nwhy<|im_end|>\n<|im_start|>assistant\n"
	if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
		t.Fatalf("string content: router encoded %q, want %q", tok.Decode(got), want)
	}

	// A template that loops over the parts (Qwen2.5-VL's).
	tpl, err := os.ReadFile("../jinja/testdata/templates/hfjs-Qwen-Qwen2.5-VL-7B-Instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	vl := t.TempDir()
	abs, _ := filepath.Abs(filepath.Join(dir, "tokenizer.json"))
	cfg, _ := json.Marshal(map[string]string{"chat_template": string(tpl), "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
	if os.Symlink(abs, filepath.Join(vl, "tokenizer.json")) != nil || os.WriteFile(filepath.Join(vl, "tokenizer_config.json"), cfg, 0o644) != nil {
		t.Fatal("cannot write the tokenizer")
	}
	if tok, err = tokenizer.Load(vl); err != nil {
		t.Fatal(err)
	}
	f.RouterTokenizerPath = vl
	r = startRouter(t, f, nil, up.url)
	body = `{"model":"m","messages":[{"role":"user","content":` + strings.Replace(parts, `"t"},`, `"t"},{"type":"input_image","image_url":"http://x/i.png"},`, 1) + `}]}`
	want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\na" +
		"t<|vision_start|><|image_pad|><|vision_end|>rNoneo<|im_end|>\n<|im_start|>assistant\n"
	if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
		t.Fatalf("parts: router encoded %q, want %q", tok.Decode(got), want)
	}
}

// A content array may hold plain strings beside part objects: vLLM's
// chat_utils takes each as a text part (_parse_chat_message_content_part:
// "Handle plain text parts"), joined with the others by "\n" for a
// template that takes content as a string, {"type": "text", "text": ...}
// for one that loops over the parts. Routing reads them so: the prompt
// text and Qwen3's render, and a looping template's parts (Qwen2.5-VL's).
func TestPlainStringPartsAreTextAsTheEngineReadsThem(t *testing.T) {
	const content = `["a",{"type":"text","text":"b"},"","c\u00e9",{"type":"image_url","image_url":{"url":"data:x"}},"d"]`
	body := `{"model":"m","messages":[{"role":"user","content":` + content + `}]}`
	var b reqBody
	if err := b.parse([]byte(body), kindChat); err != nil {
		t.Fatal(err)
	}
	if want := mediaMark("IMAGE", `"data:x"`) + "\na\nb\ncé\nd"; string(b.text) != want {
		t.Errorf("prompt text %q, want %q", b.text, want)
	}

	dir := qwen3Dir(t)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	want := "<|im_start|>user\na\nb\ncé\nd<|im_end|>\n<|im_start|>assistant\n"
	if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
		t.Errorf("Qwen3: router encoded %q, want %q", tok.Decode(got), want)
	}

	vl := qwenVLDir(t)
	if tok, err = tokenizer.Load(vl); err != nil {
		t.Fatal(err)
	}
	f.RouterTokenizerPath = vl
	r = startRouter(t, f, nil, up.url)
	want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nabcé<|vision_start|><|image_pad|><|vision_end|>d<|im_end|>\n<|im_start|>assistant\n"
	if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
		t.Errorf("parts: router encoded %q, want %q", tok.Decode(got), want)
	}
}

// qwenVLDir is Qwen3's tokenizer with Qwen2.5-VL's chat template, which
// loops over a message's content parts.
func qwenVLDir(t *testing.T) string {
	t.Helper()
	tpl, err := os.ReadFile("../jinja/testdata/templates/hfjs-Qwen-Qwen2.5-VL-7B-Instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	vl := t.TempDir()
	abs, _ := filepath.Abs(filepath.Join(qwen3Dir(t), "tokenizer.json"))
	cfg, _ := json.Marshal(map[string]string{"chat_template": string(tpl), "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
	if os.Symlink(abs, filepath.Join(vl, "tokenizer.json")) != nil || os.WriteFile(filepath.Join(vl, "tokenizer_config.json"), cfg, 0o644) != nil {
		t.Fatal("cannot write the tokenizer")
	}
	return vl
}

// A media part may name its media without a type, and a part with a uuid
// is read by its keys whatever its type: vLLM's chat_utils
// (_parse_chat_message_content_mm_part) takes the first of image_url,
// image_pil, image_embeds, audio_embeds, prompt_embeds, audio_url,
// input_audio (not null) and video_url the part holds. A template that
// loops over the parts gets it as {"type": "image"} ("audio", "video"),
// as for a typed part.
func TestUntypedMediaPartsRenderAsTheEngineReadsThem(t *testing.T) {
	vl := qwenVLDir(t)
	tok, err := tokenizer.Load(vl)
	if err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", vl
	r := startRouter(t, f, nil, up.url)
	const img, vid = "<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>"
	for _, tc := range []struct{ parts, want, text string }{
		{`{"image_url":{"url":"data:x"}},{"type":"text","text":"a"}`, img + "a", mediaMark("IMAGE", `"data:x"`)},
		{`{"type":null,"image_url":"http://x/i.png"},{"type":"text","text":"a"}`, img + "a", mediaMark("IMAGE", `"http://x/i.png"`)},
		{`{"type":"text","uuid":"u1","video_url":{"url":"v"},"text":"HIDDEN"},{"type":"text","text":"a"}`, vid + "a", mediaMark("VIDEO", `"u1"`)},
		{`{"type":"image_url","uuid":"u1","image_url":{"url":"i"}},{"type":"text","text":"a"}`, img + "a", mediaMark("IMAGE", `"u1"`)},
		{`{"video_url":"v","image_url":"i"},{"type":"text","text":"a"}`, img + "a", mediaMark("IMAGE", `"i"`)},
		{`{"uuid":null,"image_url":{"url":"i"}},{"type":"text","text":"a"}`, img + "a", mediaMark("IMAGE", `"i"`)},
	} {
		body := `{"model":"m","messages":[{"role":"user","content":[` + tc.parts + `]}]}`
		var b reqBody
		if err := b.parse([]byte(body), kindChat); err != nil || string(b.text) != tc.text+"\na" {
			t.Errorf("%s: prompt text %q (%v), want %q", tc.parts, b.text, err, tc.text+"\na")
		}
		want := "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + tc.want + "<|im_end|>\n<|im_start|>assistant\n"
		if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
			t.Errorf("%s: router encoded %q, want %q", tc.parts, tok.Decode(got), want)
		}
	}
}

// A tool_reference content part (a reference to a deferred tool, which
// Claude Code sends in tool results) is read as vLLM's chat_utils reads it
// (MM_PARSER_MAP["tool_reference"] at vllm 001eadcf: part.get("name")): for
// a template that takes content as a string its name is a text, joined
// with the others by "\n" (a null or empty name adds nothing); for one that
// loops over the parts it stays {"type": "tool_reference", "name": ...},
// and a tool message holding one keeps its parts (vLLM joins a tool
// message's parts into a string only when all are text). A part without a
// type is one when it has a tool_reference key and no media key. The
// router read no text from such a part and gave a looping template nothing
// for it.
func TestAToolReferencePartIsReadAsItsName(t *testing.T) {
	f := func(parts, want string) {
		t.Helper()
		var b reqBody
		if err := b.parse([]byte(`{"model":"m","messages":[{"role":"user","content":[`+parts+`]}]}`), kindChat); err != nil {
			t.Fatalf("%s: %v", parts, err)
		}
		if string(b.text) != want {
			t.Errorf("%s: prompt text %q, want %q", parts, b.text, want)
		}
	}
	f(`{"type":"tool_reference","name":"get_weather"},{"type":"text","text":"q"}`, "get_weather\nq")
	f(`{"type":"tool_reference","name":"a","name":"b"}`, "b")
	f(`{"type":"tool_reference","name":null},{"type":"tool_reference","name":""},{"type":"tool_reference"},"q"`, "q")
	f(`{"tool_reference":{},"name":"n"},{"type":"text","uuid":"u","tool_reference":1,"name":"m","text":"HIDDEN"}`, "n\nm")
	f(`{"type":"tool_reference","name":"n","text":"HIDDEN"}`, "n")

	// A template that loops over the parts.
	dir := t.TempDir()
	abs, _ := filepath.Abs(filepath.Join(qwen3Dir(t), "tokenizer.json"))
	const tpl = `{%- for m in messages %}{{ m.role }}:{%- if m.content is string %}{{ m.content }}{%- else %}` +
		`{%- for p in m.content %}[{{ p.type }} {{ p.name }} {{ p.text }}]{%- endfor %}{%- endif %}|{%- endfor %}`
	cfg, _ := json.Marshal(map[string]string{"chat_template": tpl, "eos_token": "<|im_end|>"})
	if os.Symlink(abs, filepath.Join(dir, "tokenizer.json")) != nil || os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644) != nil {
		t.Fatal("cannot write the tokenizer")
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t, okHandler)
	fl := defaultFlags()
	fl.RouterPolicy, fl.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, fl, nil, up.url)
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"q"},{"type":"tool_reference","name":"get_weather"},{"type":"tool_reference","name":null}]},` +
		`{"role":"tool","tool_call_id":"c","content":[{"type":"tool_reference","name":"t1"}]},{"role":"tool","tool_call_id":"d","content":[{"type":"text","text":"r"}]}]}`
	// jinja2 prints an undefined attribute as "" and None as "None".
	want := "user:[text  q][tool_reference get_weather ][tool_reference None ]|tool:[tool_reference t1 ]|tool:r|"
	if got := routerTokens(t, r.url, body); !slices.Equal(got, tok.Encode(nil, []byte(want))) {
		t.Errorf("router encoded %q, want %q", tok.Decode(got), want)
	}
}

// A tool call or a tool whose object names "function" twice is rendered
// with the last one, whole, as the engine's JSON decoder (Python's
// json.loads: the last duplicate key wins) hands it to the template. The
// router merged the tool call's: a last "function" without arguments, or
// with arguments that are not JSON text, kept the first one's arguments,
// so the routing hash was not of the prompt the engine rendered.
func TestADuplicateFunctionKeyIsReadAsTheEngineReadsIt(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	tokenize := func(body string) string {
		t.Helper()
		code, b := post(t, r.url+"/tokenize", body)
		if code != 200 {
			t.Fatalf("/tokenize: %d %s", code, b)
		}
		return b
	}
	call := func(function string) string {
		return tokenize(`{"model":"m","messages":[{"role":"user","content":"Weather in Paris?"},` +
			`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",` + function + `}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"18 C"}]}`)
	}
	for _, c := range []struct{ dup, last string }{
		{`"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"function":{"name":"get_weather"}`,
			`"function":{"name":"get_weather"}`},
		{`"function":{"name":"old","arguments":"{\"a\":1}"},"function":{"name":"get_weather","arguments":5}`,
			`"function":{"name":"get_weather","arguments":5}`},
		{`"function":{"name":"get_weather","arguments":"{\"a\":1}","arguments":"{\"city\":\"Paris\"}"}`,
			`"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}`},
		{`"function":{"name":"get_weather","arguments":"{\"a\":1}"},"function":null,"function":{"name":"get_weather","arguments":"{}"}`,
			`"function":{"name":"get_weather","arguments":"{}"}`},
	} {
		if got, want := call(c.dup), call(c.last); got != want {
			t.Errorf("tool call %s: the router encoded %s, want %s", c.dup, got, want)
		}
	}
	tools := func(tools string) string {
		return tokenize(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":` + tools + `}`)
	}
	dup := `[{"type":"function","function":{"name":"a","description":"x","parameters":{}},"function":{"name":"f","description":"d"}}]`
	last := `[{"type":"function","function":{"name":"f","description":"d"}}]`
	if got, want := tools(dup), tools(last); got != want {
		t.Errorf("tools %s: the router encoded %s, want %s", dup, got, want)
	}
}
