//go:build !race

package tokenizer

import "testing"

// TestEncodeAllocs proves steady-state Encode allocates nothing.
func TestEncodeAllocs(t *testing.T) {
	h := loadQwen3(t)
	text := prompt4K()
	dst := h.Encode(nil, text)
	if n := testing.AllocsPerRun(50, func() { dst = h.Encode(dst[:0], text) }); n != 0 {
		t.Fatalf("Encode allocates %.1f times per call", n)
	}
}

// TestRenderChatEncodeAllocs proves that what the router does for every
// kv-aware chat request (proxy tokenize: RenderChat with the real Qwen3 chat
// template, then Encode) allocates nothing once warm, for ~1 KB chats with
// and without tool calls and with a tools array.
func TestRenderChatEncodeAllocs(t *testing.T) {
	h := loadQwen3(t)
	for _, c := range chats1K() {
		text, err := h.RenderChat(nil, c.msgs, c.tools, true)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ids := h.Encode(nil, text)
		n := testing.AllocsPerRun(50, func() {
			text, err = h.RenderChat(text[:0], c.msgs, c.tools, true)
			ids = h.Encode(ids[:0], text)
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n != 0 {
			t.Errorf("%s: RenderChat + Encode allocate %.1f times per call, want 0", c.name, n)
		}
		if len(text) < 900 || len(ids) < 200 {
			t.Errorf("%s: rendered %d bytes, %d tokens: not the ~1 KB chat the test is about", c.name, len(text), len(ids))
		}
	}
}

// TestRenderChatWithKwargsAllocs proves that a chat_template_kwargs seen
// recently (a client's enable_thinking with every request) is not parsed
// again: a warm render with it allocates nothing either.
func TestRenderChatWithKwargsAllocs(t *testing.T) {
	h := loadQwen3(t)
	c := chats1K()[0]
	f := ChatFields{Tools: c.tools, Kwargs: []byte(`{"enable_thinking":false}`)}
	text, err := h.RenderChatFields(nil, c.msgs, f, true)
	if err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(50, func() { text, err = h.RenderChatFields(text[:0], c.msgs, f, true) })
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("RenderChatFields with chat_template_kwargs allocates %.1f times per call, want 0", n)
	}
}
