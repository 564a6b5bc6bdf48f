package engine

import (
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/tokenizer"
)

// A content given as parts is flattened as vLLM flattens it, and as the
// router renders it for its block hashes (proxy.appendTextParts): the
// non-empty texts of the "type": "text" parts joined by "\n". The engine
// concatenated every part's text (and those of parts without a type), so a
// chat of parts was tokenized differently by router and engine: 69 of 120
// generated Qwen3 chats with parts had block hashes the router could not
// match (overlap 0/14 blocks for a prompt the engine had just cached).
func TestContentPartsRenderJoinedAsTheRouterJoinsThem(t *testing.T) {
	f := func(content, want string) {
		t.Helper()
		body := `{"messages":[{"role":"user","content":` + content + `}],"add_generation_prompt":false}`
		_, _, text, err := parseChat([]byte(body), tokenizer.Simple{}, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", content, err)
		}
		if got := string(text); got != "<|im_start|>user\n"+want+"<|im_end|>\n" {
			t.Fatalf("%s: rendered %q, want content %q", content, got, want)
		}
	}
	f(`"plain"`, "plain")
	f(`null`, "")
	f(`[{"type":"text","text":"Describe"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"this image"}]`, "Describe\nthis image")
	f(`[{"type":"text","text":""},{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}]`, "a\nb")
	f(`[{"type":"image_url","text":"not text"},{"type":"text","text":"only"}]`, "only")
	f(`[{"type":"\u0074ext","text":"escaped type"}]`, "escaped type")
	// vLLM's other text part types (chat_utils' TEXT_PART_TYPES), which
	// the engine, as the router, skipped: Responses-style input_text and
	// output_text, a refusal's "refusal", a thinking part's "thinking".
	f(`[{"type":"input_text","text":"a"},{"type":"refusal","refusal":"r"},{"type":"thinking","thinking":"t"},`+
		`{"type":"output_text"},{"type":"refusal","text":"not its key"},{"type":"output_text","text":"o"}]`, "a\nr\nt\no")
	// Keys are read exactly, as vLLM's part.get("text") and the router read
	// them; encoding/json took "Text" and "TYPE" too (a chat the router
	// counted 8 tokens, the engine 14). A part whose only type key is
	// "TYPE" has no type: vLLM reads it by its keys and refuses it
	// (TestContentArraysAreReadAsVLLMAndTheRouterReadThem).
	f(`[{"type":"text","Text":"zzz"},{"type":"refusal","Refusal":"xxx"},{"type":"text","text":"w"}]`, "w")
}

// bosSimple is the Simple tokenizer with a BOS (id 7) before a plain
// prompt, as a tokenizer whose post-processor adds one.
type bosSimple struct{ tokenizer.Simple }

func (bosSimple) PromptSpecialTokens() (prefix, suffix []uint32) { return []uint32{7}, nil }

// The engine reads add_special_tokens as vLLM does (true by default for a
// completion, false for a chat) and passes a chat's reasoning_effort to the
// template, as the router now does for its block hashes; it ignored both,
// so the engine's prompt (and KV events) differed from vLLM's and the
// router's.
func TestAddSpecialTokensAndReasoningEffortAreReadAsVLLMReadsThem(t *testing.T) {
	tok := bosSimple{}
	comp := func(body string) []uint32 {
		t.Helper()
		_, ids, err := parseCompletion([]byte(body), tok, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if ids := comp(`{"prompt":"abcd"}`); len(ids) != 2 || ids[0] != 7 {
		t.Errorf("completion: %v, want the BOS first", ids)
	}
	if ids := comp(`{"prompt":"abcd","add_special_tokens":false}`); len(ids) != 1 {
		t.Errorf("completion with add_special_tokens false: %v, want no BOS", ids)
	}
	chat := func(body string) []uint32 {
		t.Helper()
		_, ids, _, err := parseChat([]byte(body), tok, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	if ids := chat(`{` + msgs + `}`); len(ids) == 0 || ids[0] == 7 {
		t.Errorf("chat: %v, want no BOS", ids)
	}
	if ids := chat(`{` + msgs + `,"add_special_tokens":true}`); len(ids) == 0 || ids[0] != 7 {
		t.Errorf("chat with add_special_tokens true: %v, want the BOS first", ids)
	}
	qwen, err := tokenizer.Load("../testdata/tokenizers/qwen3")
	if err != nil {
		t.Skip(err)
	}
	_, _, text, err := parseChat([]byte(`{`+msgs+`,"reasoning_effort":"none"}`), qwen, nil, nil)
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"; err != nil || string(text) != want {
		t.Errorf("reasoning_effort none: %q %v, want %q", text, err, want)
	}
}

// A chat request's and its messages' keys are read exactly, as vLLM's
// pydantic request model and chat_utils (message.get("content")) and the
// router read them: encoding/json also took "Content",
// "Chat_Template_Kwargs" or "Add_Generation_Prompt", so through the
// binaries a Qwen3 chat with {"role":"user","Content":"zzz zzz zzz"} was
// counted 8 prompt tokens by the router and 14 by the engine, one with
// "Add_Generation_Prompt": false 9 and 6.
func TestRequestKeysAreReadExactlyAsVLLMReadsThem(t *testing.T) {
	render := func(body string) string {
		t.Helper()
		_, _, text, err := parseChat([]byte(body), tokenizer.Simple{}, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return string(text)
	}
	const want = "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
	if got := render(`{"messages":[{"role":"user","Content":"zzz"}]}`); got != want {
		t.Errorf("a message's Content: rendered %q, want %q", got, want)
	}
	if got := render(`{"messages":[{"role":"user","content":""}],"Add_Generation_Prompt":false}`); got != want {
		t.Errorf("Add_Generation_Prompt: rendered %q, want %q", got, want)
	}
	if got := render(`{"messages":[{"role":"user","content":""}],"add_generation_prompt":true,"add_generation_prompt":false}`); got != "<|im_start|>user\n<|im_end|>\n" {
		t.Errorf("the last copy: rendered %q", got)
	}
}

// The engine's bools are read as vLLM's pydantic models read them (lax
// mode): "add_special_tokens":"false" or 0 leaves the BOS out, "stream":
// "true" streams, "include_usage":"yes" asks for usage. They were decoded
// as Go bools, so each of these was a 400 ("cannot unmarshal string into
// Go value of type bool") that vLLM answers.
func TestBoolFieldsAreReadAsVLLMReadsThem(t *testing.T) {
	tok := bosSimple{}
	for _, v := range []string{`false`, `"false"`, `0`, `"No"`, `"\u0066alse"`, `"off"`} {
		body := `{"prompt":"abcd","add_special_tokens":` + v + `,"stream":"true","stream_options":{"include_usage":"yes"}}`
		g, ids, err := parseCompletion([]byte(body), tok, nil)
		if err != nil || len(ids) != 1 || !g.stream || !g.includeUsage {
			t.Errorf("%s: %+v %v %v, want a stream with usage and no BOS", body, g, ids, err)
		}
	}
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, v := range []string{`true`, `"true"`, `1`, `"Yes"`, `"on"`} {
		body := `{` + msgs + `,"add_special_tokens":` + v + `,"stream":` + v + `,"stream_options":{"include_usage":` + v + `}}`
		g, ids, _, err := parseChat([]byte(body), tok, nil, nil)
		if err != nil || len(ids) == 0 || ids[0] != 7 || !g.stream || !g.includeUsage {
			t.Errorf("%s: %+v %v %v, want a stream with usage and the BOS", body, g, ids, err)
		}
	}
	plain, _ := render(t, `{`+msgs+`}`)
	noGen, _ := render(t, `{`+msgs+`,"add_generation_prompt":false}`)
	for _, v := range []string{`"false"`, `0`, `"n"`} {
		if got, err := render(t, `{`+msgs+`,"add_generation_prompt":`+v+`}`); err != nil || got != noGen || got == plain {
			t.Errorf("add_generation_prompt %s: %q %v, want %q", v, got, err, noGen)
		}
	}
	for _, v := range []string{`null`} {
		if got, err := render(t, `{`+msgs+`,"add_generation_prompt":`+v+`,"stream":null,"continue_final_message":null}`); err != nil || got != plain {
			t.Errorf("null: %q %v, want %q", got, err, plain)
		}
	}
	for _, body := range []string{
		`{` + msgs + `,"stream":"maybe"}`, `{` + msgs + `,"stream":2}`, `{` + msgs + `,"add_special_tokens":[]}`,
		`{` + msgs + `,"continue_final_message":"sure"}`, `{` + msgs + `,"stream":true,"stream_options":{"include_usage":"x"}}`,
	} {
		if _, _, _, err := parseChat([]byte(body), tok, nil, nil); err == nil {
			t.Errorf("%s: accepted, want refused as vLLM refuses it", body)
		}
	}
}

func render(t *testing.T, body string) (string, error) {
	t.Helper()
	_, _, text, err := parseChat([]byte(body), tokenizer.Simple{}, nil, nil)
	return string(text), err
}

// A content array is read as vLLM reads it and as the router reads it
// (proxy.appendTextParts): a plain string is a text part; a part without
// a type, or with a non-null uuid, is read by its keys (the first media
// key makes it a media part, its text unread), and one with no media key
// is refused. The engine refused plain strings (a 400 where vLLM and the
// router take the chat) and read a uuid'd media part's text.
func TestContentArraysAreReadAsVLLMAndTheRouterReadThem(t *testing.T) {
	render := func(content string) (string, []tokenizer.ContentPart, error) {
		body := `{"messages":[{"role":"user","content":` + content + `}],"add_generation_prompt":false}`
		_, _, text, err := parseChat([]byte(body), tokenizer.Simple{}, nil, nil)
		if err != nil {
			return "", nil, err
		}
		var m tokenizer.Message
		if err := flattenContent(&m, []byte(content)); err != nil {
			return "", nil, err
		}
		return string(text), m.Parts, nil
	}
	for _, c := range []struct {
		content, want string
		parts         []string
	}{
		{`["a",{"type":"text","text":"b"}]`, "a\nb", []string{"text", "text"}},
		{`[{"image_url":{"url":"x"}},{"type":"text","text":"t"}]`, "t", []string{"image", "text"}},
		{`[{"type":"text","uuid":"u","video_url":{"url":"v"},"text":"HIDDEN"},{"type":"text","text":"t"}]`, "t", []string{"video", "text"}},
		{`[{"type":"text","uuid":null,"text":"kept"}]`, "kept", []string{"text"}},
		{`[{"input_audio":null,"audio_url":{"url":"a"}},"s"]`, "s", []string{"audio", "text"}},
		{`[{"prompt_embeds":"e"},"s"]`, "s", []string{"text"}},
	} {
		got, parts, err := render(c.content)
		if err != nil {
			t.Errorf("%s: %v", c.content, err)
			continue
		}
		want := "<|im_start|>user\n" + c.want + "<|im_end|>\n"
		if got != want {
			t.Errorf("%s: rendered %q, want %q", c.content, got, want)
		}
		var types []string
		for _, p := range parts {
			types = append(types, p.Type)
		}
		if strings.Join(types, ",") != strings.Join(c.parts, ",") {
			t.Errorf("%s: parts %v, want %v", c.content, types, c.parts)
		}
	}
	for _, bad := range []string{`[{"text":"untyped"}]`, `[{"TYPE":"text","text":"yyy"}]`, `[{"type":null,"text":"t"}]`, `[{"type":"text","uuid":"u","text":"t"}]`} {
		if _, _, err := render(bad); err == nil {
			t.Errorf("%s: taken; vLLM refuses a part read by its keys that holds no media", bad)
		}
	}
}

// A tool_reference part gives its name, as vLLM's chat_utils reads it
// (MM_PARSER_MAP["tool_reference"] at vllm 001eadcf) and as the router
// reads it (proxy.TestAToolReferencePartIsReadAsItsName): a text for a
// template that takes content as a string, a tool_reference part for one
// that loops. A part without a type is one when it has a tool_reference
// key and no media key. The engine read none, and refused the untyped one.
func TestAToolReferencePartIsReadAsItsName(t *testing.T) {
	f := func(content, want string) {
		t.Helper()
		body := `{"messages":[{"role":"user","content":` + content + `}],"add_generation_prompt":false}`
		_, _, text, err := parseChat([]byte(body), tokenizer.Simple{}, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", content, err)
		}
		if got := string(text); got != "<|im_start|>user\n"+want+"<|im_end|>\n" {
			t.Fatalf("%s: rendered %q, want content %q", content, got, want)
		}
	}
	f(`[{"type":"tool_reference","name":"get_weather"},{"type":"text","text":"q"}]`, "get_weather\nq")
	f(`[{"type":"tool_reference","name":null},{"type":"tool_reference","name":""},{"type":"tool_reference"},"q"]`, "q")
	f(`[{"tool_reference":{},"name":"n"},{"type":"text","uuid":"u","tool_reference":1,"name":"m","text":"HIDDEN"}]`, "n\nm")

	var m tokenizer.Message
	if err := flattenContent(&m, []byte(`[{"type":"tool_reference","name":"a"},{"type":"tool_reference","name":null}]`)); err != nil {
		t.Fatal(err)
	}
	if want := []tokenizer.ContentPart{{Type: "tool_reference", Text: "a"}, {Type: "tool_reference", NullText: true}}; !slices.Equal(m.Parts, want) {
		t.Errorf("parts %+v, want %+v", m.Parts, want)
	}
}
