package engine

import (
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
	f(`[{"text":"untyped"},{"type":"image_url","text":"not text"},{"type":"text","text":"only"}]`, "only")
	f(`[{"type":"\u0074ext","text":"escaped type"}]`, "escaped type")
}
