package gateway

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chat_template_kwargs.enable_thinking reaches the chat template as the
// JSON value it is, and Qwen3's template closes the thinking block only
// when `enable_thinking is false` (jinja's test: the boolean false alone):
// the string "false", 0 or "no" leave the model thinking. The router
// renders the real template; the simulated engine (--reasoning) reasons
// exactly when the prompt it rendered leaves thinking open. It read the
// value as a strict Go bool: "false" or 0 failed to decode and counted as
// not asking to reason, while the template the router rendered (and vLLM's)
// had no empty think block, so the model would reason.
func TestE2EEnableThinkingIsReadAsTheChatTemplateReadsIt(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("INFERA_REQUIRE_TOKENIZER") == "1" {
			t.Fatalf("tokenizer missing (make tokenizer): %v", err)
		}
		t.Skip("tokenizer not fetched; run make tokenizer")
	}
	_, eng := startEngine(t, "--speedup", "50", "--tokenizer", dir, "--reasoning")
	_, r := startServe(t, "--workers", eng, "--router-tokenizer-path", dir)
	const msgs = `"messages":[{"role":"user","content":"Think about it."}]`
	tokens := func(kw string) int {
		t.Helper()
		resp, b := doPost(t, r+"/tokenize", `{"model":"sim-model",`+msgs+kw+`}`)
		var tk struct {
			Count int `json:"count"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &tk) != nil || tk.Count == 0 {
			t.Fatalf("tokenize %s: %d %s", kw, resp.StatusCode, b)
		}
		return tk.Count
	}
	open, closed := tokens(``), tokens(`,"chat_template_kwargs":{"enable_thinking":false}`)
	if closed <= open {
		t.Fatalf("enable_thinking false renders %d tokens, none %d: no empty think block", closed, open)
	}
	for _, v := range []string{`false`, `"false"`, `"False"`, `0`, `0.0`, `"0"`, `"no"`, `""`, `[]`, `true`, `"true"`, `1`} {
		kw := `,"chat_template_kwargs":{"enable_thinking":` + v + `}`
		n := tokens(kw)
		if n != open && n != closed {
			t.Fatalf("enable_thinking %s: %d prompt tokens, neither open (%d) nor closed (%d)", v, n, open, closed)
		}
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":4,`+msgs+kw+`}`)
		var a struct {
			Choices []struct {
				Message struct {
					ReasoningContent string `json:"reasoning_content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil || len(a.Choices) != 1 {
			t.Fatalf("enable_thinking %s: %d %s", v, resp.StatusCode, b)
		}
		if a.Usage.PromptTokens != n {
			t.Errorf("enable_thinking %s: the router rendered %d prompt tokens, the engine %d", v, n, a.Usage.PromptTokens)
		}
		if reasoned := a.Choices[0].Message.ReasoningContent != ""; reasoned != (n == open) {
			t.Errorf("enable_thinking %s: the router's prompt leaves thinking open: %v; the engine reasoned: %v", v, n == open, reasoned)
		}
	}
}

// A Qwen3 fleet started with thinking off by default (vLLM's
// --default-chat-template-kwargs '{"enable_thinking": false}') renders the
// empty think block in every chat that does not ask to think. The router
// given the same defaults (--router-default-chat-template-kwargs) renders
// and counts each chat's prompt as the engine does, whatever the request
// says; without them it counts a chat that says nothing 4 tokens short.
func TestE2EDefaultChatTemplateKwargsRenderAsTheEnginesDo(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("INFERA_REQUIRE_TOKENIZER") == "1" {
			t.Fatalf("tokenizer missing (make tokenizer): %v", err)
		}
		t.Skip("tokenizer not fetched; run make tokenizer")
	}
	const off = `{"enable_thinking": false}`
	_, eng := startEngine(t, "--speedup", "50", "--tokenizer", dir, "--reasoning", "--default-chat-template-kwargs", off)
	_, r := startServe(t, "--workers", eng, "--router-tokenizer-path", dir, "--router-default-chat-template-kwargs", off)
	_, bare := startServe(t, "--workers", eng, "--router-tokenizer-path", dir)
	const msgs = `"messages":[{"role":"user","content":"Think about it."}]`
	tokens := func(router, fields string) int {
		t.Helper()
		resp, b := doPost(t, router+"/tokenize", `{"model":"sim-model",`+msgs+fields+`}`)
		var tk struct {
			Count int `json:"count"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &tk) != nil || tk.Count == 0 {
			t.Fatalf("tokenize %s: %d %s", fields, resp.StatusCode, b)
		}
		return tk.Count
	}
	for _, c := range []struct {
		fields   string
		thinking bool
	}{
		{``, false},
		{`,"chat_template_kwargs":{"enable_thinking":true}`, true},
		{`,"chat_template_kwargs":{"enable_thinking":null}`, false},
		{`,"reasoning_effort":"high"`, true},
		{`,"reasoning_effort":"none"`, false},
	} {
		n := tokens(r, c.fields)
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":4,`+msgs+c.fields+`}`)
		var a struct {
			Choices []struct {
				Message struct {
					ReasoningContent string `json:"reasoning_content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil || len(a.Choices) != 1 {
			t.Fatalf("%q: %d %s", c.fields, resp.StatusCode, b)
		}
		if a.Usage.PromptTokens != n {
			t.Errorf("%q: the router rendered %d prompt tokens, the engine %d", c.fields, n, a.Usage.PromptTokens)
		}
		if reasoned := a.Choices[0].Message.ReasoningContent != ""; reasoned != c.thinking {
			t.Errorf("%q: the engine reasoned: %v, want %v", c.fields, reasoned, c.thinking)
		}
	}
	if n, m := tokens(r, ``), tokens(bare, ``); n != m+4 {
		t.Errorf("with the engines' defaults the router counts %d prompt tokens, without %d; want 4 more (the empty think block)", n, m)
	}
}

// --router-default-chat-template-kwargs is refused at start when it is not
// a JSON object, names what is not a template variable, or has no chat
// template to reach (no --router-tokenizer-path).
func TestRouterDefaultChatTemplateKwargsAreCheckedAtStart(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skip("tokenizer not fetched; run make tokenizer")
	}
	for _, args := range [][]string{
		{"--router-default-chat-template-kwargs", `{"enable_thinking": false}`},
		{"--router-tokenizer-path", dir, "--router-default-chat-template-kwargs", `[1]`},
		{"--router-tokenizer-path", dir, "--router-default-chat-template-kwargs", `{"chat_template": "x"}`},
		{"--router-tokenizer-path", dir, "--router-policy", "kv-aware", "--router-default-chat-template-kwargs", `{"tokenize": true}`},
	} {
		args = append(args, "--workers", "http://127.0.0.1:1", "--worker-model", "sim-model")
		g, err := New(parseServe(t, args...))
		if err == nil {
			g.Close()
			t.Errorf("infera serve %q started", args)
		} else if !strings.Contains(err.Error(), "--router-default-chat-template-kwargs") {
			t.Errorf("infera serve %q: the refusal does not name the flag: %v", args, err)
		}
	}
}
