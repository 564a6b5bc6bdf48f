package proxy

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/infera/infera/tokenizer"
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
