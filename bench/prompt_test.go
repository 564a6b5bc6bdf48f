package bench

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/tokenizer"
)

func TestPromptDeterminism(t *testing.T) {
	c := DefaultPromptConfig()
	bb := c.BlockBytes()
	if bb != 2048 {
		t.Fatalf("block bytes %d, want 2048", bb)
	}
	// Same ids, same bytes (across calls and configs with equal fields).
	a := c.AppendPrompt(nil, []int64{1, 2, 3}, 1400, 7)
	c2 := DefaultPromptConfig()
	b := c2.AppendPrompt(nil, []int64{1, 2, 3}, 1400, 99)
	if !bytes.Equal(a, b) {
		t.Fatalf("same ids gave different prompts")
	}
	if len(a) != 1400*4 {
		t.Fatalf("prompt length %d, want %d", len(a), 1400*4)
	}
	// Shared leading ids give a byte-identical shared prefix, then diverge.
	x := c.AppendPrompt(nil, []int64{5, 6, 7}, 1536, 1)
	y := c.AppendPrompt(nil, []int64{5, 6, 8}, 1536, 2)
	if !bytes.Equal(x[:2*bb], y[:2*bb]) {
		t.Fatalf("shared prefix differs")
	}
	if bytes.Equal(x[2*bb:], y[2*bb:]) {
		t.Fatalf("different ids gave the same block")
	}
	// Every block of many ids is distinct.
	seen := map[string]int64{}
	for id := int64(0); id < 2000; id++ {
		blk := string(c.AppendBlock(nil, id))
		if len(blk) != bb {
			t.Fatalf("block %d has %d bytes", id, len(blk))
		}
		if prev, ok := seen[blk]; ok {
			t.Fatalf("ids %d and %d give the same block", prev, id)
		}
		seen[blk] = id
	}
	// A longer prompt with the same ids extends the shorter one.
	short := c.AppendPrompt(nil, []int64{9, 10}, 700, 1)
	long := c.AppendPrompt(nil, []int64{9, 10}, 1000, 1)
	if !bytes.HasPrefix(long, short) {
		t.Fatalf("longer prompt is not an extension")
	}
	// Padding past the ids depends on the salt, so unique requests differ.
	p1 := c.AppendPrompt(nil, []int64{1}, 1024, 1)
	p2 := c.AppendPrompt(nil, []int64{1}, 1024, 2)
	if !bytes.Equal(p1[:bb], p2[:bb]) || bytes.Equal(p1[bb:], p2[bb:]) {
		t.Fatalf("padding: shared block must match and salted tails must differ")
	}
	// Text is safe inside a JSON string.
	for _, ch := range long {
		if ch < ' ' || ch == '"' || ch == '\\' || ch > '~' {
			t.Fatalf("unsafe byte %q in prompt", ch)
		}
	}
}

func TestPromptTokens(t *testing.T) {
	c := DefaultPromptConfig()
	toks, text := c.AppendPromptTokens(nil, nil, []int64{1, 2}, 1024, 3)
	if len(toks) != 1024 {
		t.Fatalf("512-token blocks give %d tokens for 1024, want 1024", len(toks))
	}
	want := tokenizer.Simple{}.Encode(nil, text)
	for i := range want {
		if want[i] != toks[i] {
			t.Fatalf("token %d differs", i)
		}
	}
	// Configurable block size.
	c = PromptConfig{TokensPerBlock: 64, BytesPerToken: 3}
	if got := len(c.AppendBlock(nil, 4)); got != 192 {
		t.Fatalf("block bytes %d, want 192", got)
	}
}

func TestAppendBody(t *testing.T) {
	lc := DefaultLoadConfig()
	r := TraceRequest{InputLength: 40, OutputLength: 7, HashIDs: []int64{1}}
	body, _ := lc.AppendBody(nil, nil, &r, 0)
	s := string(body)
	for _, want := range []string{`"messages":[{"role":"user","content":"[b1] `, `"max_tokens":7`, `"stream":true`, `"include_usage":true`} {
		if !strings.Contains(s, want) {
			t.Fatalf("body %s lacks %s", s, want)
		}
	}
	lc.API, lc.TokenPrompts = "completions", true
	body, _ = lc.AppendBody(nil, nil, &r, 0)
	toks := tokenizer.Simple{}.Encode(nil, []byte("[b1]"))
	if !strings.Contains(string(body), `"prompt":[`+strconv.FormatUint(uint64(toks[0]), 10)+",") {
		t.Fatalf("token body %s", body)
	}
}
