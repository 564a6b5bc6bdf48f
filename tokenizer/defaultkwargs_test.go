package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A server's default chat_template_kwargs (vLLM's
// --default-chat-template-kwargs) are merged under every request's as vLLM
// merges them: OnlineRenderer.preprocess_chat puts the request's tools
// over the defaults (renderers.merge_kwargs, skipping None tools), then
// ChatParams.with_defaults puts the request's kwargs and fields over that,
// dropping the request's None and "auto" values, never the defaults'.
func TestDefaultKwargsAreMergedUnderTheRequestsAsVLLMMergesThem(t *testing.T) {
	loadQwen3(t)
	dir := t.TempDir()
	if err := os.Symlink(mustAbs(t, qwen3Dir+"/tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]string{"chat_template": `{{ add_generation_prompt }}|{{ documents | tojson }}|` +
		`{{ tools | tojson }}|{{ 'undef' if x is undefined else x | tojson }}|{{ reasoning_effort | default('-') }}|` +
		`{{ 'undef' if enable_thinking is undefined else enable_thinking }}`})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, c := range []struct {
		name, defaults string
		f              ChatFields
		want           string
	}{
		{"no defaults", ``, ChatFields{}, `True|null|null|undef|-|undef`},
		{"a default", `{"enable_thinking":false}`, ChatFields{}, `True|null|null|undef|-|False`},
		{"the request's kwarg over the default", `{"enable_thinking":false}`, ChatFields{Kwargs: []byte(`{"enable_thinking":true}`)}, `True|null|null|undef|-|True`},
		{"a request's null leaves the default", `{"enable_thinking":false,"x":1}`, ChatFields{Kwargs: []byte(`{"enable_thinking":null,"x":"auto"}`)}, `True|null|null|1|-|False`},
		{"a default's null stays", `{"x":null}`, ChatFields{}, `True|null|null|null|-|undef`},
		{"the request's effort over the default's enable_thinking", `{"enable_thinking":false}`, ChatFields{ReasoningEffort: "high"}, `True|null|null|undef|high|True`},
		{"the default's effort", `{"reasoning_effort":"low"}`, ChatFields{}, `True|null|null|undef|low|undef`},
		{"the request's effort over the default's", `{"reasoning_effort":"low"}`, ChatFields{ReasoningEffort: "high"}, `True|null|null|undef|high|True`},
		{"default tools without the request's", `{"tools":[9]}`, ChatFields{}, `True|null|[9]|undef|-|undef`},
		{"the request's tools over the default's", `{"tools":[9]}`, ChatFields{Tools: []byte(`[1]`)}, `True|null|[1]|undef|-|undef`},
		{"null request tools leave the default's", `{"tools":[9]}`, ChatFields{Tools: []byte(`null`)}, `True|null|[9]|undef|-|undef`},
		{"the request's kwargs tools over both", `{"tools":[9]}`, ChatFields{Tools: []byte(`[1]`), Kwargs: []byte(`{"tools":[2]}`)}, `True|null|[2]|undef|-|undef`},
		{"default documents", `{"documents":[{"t":"d"}]}`, ChatFields{}, `True|[{"t": "d"}]|null|undef|-|undef`},
		{"the request's documents over the default's", `{"documents":[{"t":"d"}]}`, ChatFields{Documents: []byte(`[{"t":"r"}]`)}, `True|[{"t": "r"}]|null|undef|-|undef`},
		{"the request's generation prompt over the default", `{"add_generation_prompt":false}`, ChatFields{}, `True|null|null|undef|-|undef`},
	} {
		if err := h.SetDefaultKwargs([]byte(c.defaults)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := RenderChatFields(h, nil, msgs, c.f, true)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(got) != c.want {
			t.Errorf("%s: rendered %q, want %q", c.name, got, c.want)
		}
	}
	for _, bad := range []string{`[1]`, `"x"`, `{"chat_template":"{{ 1 }}"}`, `{"tokenize":true}`, `{"conversation":[]}`, `{"messages":[]}`, `{`} {
		if err := h.SetDefaultKwargs([]byte(bad)); err == nil {
			t.Errorf("defaults %s were taken", bad)
		}
	}
}

// With Qwen3's own template, a fleet started with thinking off by default
// renders the empty think block the engine renders: without the defaults
// the router's prompt is 4 tokens short of the engine's.
func TestQwen3ThinkingOffByDefaultRendersTheEmptyThinkBlock(t *testing.T) {
	loadQwen3(t)
	h, err := Load(qwen3Dir) // its own: the defaults are set before rendering
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "Hello"}}
	plain, err := RenderChatFields(h, nil, msgs, ChatFields{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetDefaultKwargs([]byte(`{"enable_thinking": false}`)); err != nil {
		t.Fatal(err)
	}
	off, err := RenderChatFields(h, nil, msgs, ChatFields{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(off), "<|im_start|>assistant\n<think>\n\n</think>\n\n") {
		t.Errorf("thinking off by default rendered %q", off)
	}
	if n, m := len(h.Encode(nil, off)), len(h.Encode(nil, plain)); n != m+4 {
		t.Errorf("thinking off: %d tokens, thinking on: %d; want 4 more", n, m)
	}
	on, err := RenderChatFields(h, nil, msgs, ChatFields{Kwargs: []byte(`{"enable_thinking": true}`)}, true)
	if err != nil {
		t.Fatal(err)
	}
	if string(on) != string(plain) {
		t.Errorf("a request's enable_thinking true rendered %q, want %q", on, plain)
	}
}
