package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

const llama31Dir = "../testdata/tokenizers/llama3_1"

// Llama 3's tokenizer sets ignore_merges: a pre-token its vocab holds whole
// is that token, whatever the merges would make of it. Load refused it
// ("ignore_merges is not supported"), so no Llama 3 model could be routed
// with its own tokenizer although the loader implements its split pattern.
// Taking the word whole tokenized 882 of 888 strings built from the 588
// such words of Llama 3's vocab as @lenml/tokenizers does, where the
// merges alone did not: " etmektedir" is [120269], not [105805 6702 404].
func TestIgnoreMergesTakesAWordTheVocabHoldsWhole(t *testing.T) {
	enc, _ := byteLevelAlphabet()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(enc[b])] = b
	}
	vocab["ab"], vocab["abc"] = 256, 257
	for _, c := range []struct {
		ignore bool
		want   []uint32
	}{{false, []uint32{256, 'c', ' ', 256}}, {true, []uint32{257, ' ', 256}}} {
		tj := map[string]any{
			"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": cl100kPattern}, "behavior": "Isolated", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
			}},
			"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a b"}, "ignore_merges": c.ignore},
		}
		dir := t.TempDir()
		data, _ := json.Marshal(tj)
		if err := os.WriteFile(dir+"/tokenizer.json", data, 0o644); err != nil {
			t.Fatal(err)
		}
		h, err := Load(dir)
		if err != nil {
			t.Fatalf("ignore_merges %v: %v", c.ignore, err)
		}
		for range 2 { // the second through the caches
			if got := h.Encode(nil, []byte("abc ab")); !slices.Equal(got, c.want) {
				t.Fatalf("ignore_merges %v: Encode = %v, want %v", c.ignore, got, c.want)
			}
		}
	}
}

// Llama 3.1's tokenizer (ignore_merges, the cl100k split pattern, a BOS
// post-processor) encodes the strings of scripts/tokref/llama3.mjs as
// @lenml/tokenizers does: without special tokens (a rendered chat) and, as
// a completion's prompt, after <|begin_of_text|>.
func TestLlama31EncodeReference(t *testing.T) {
	if _, err := os.Stat(llama31Dir + "/tokenizer.json"); err != nil {
		if os.Getenv("INFERA_REQUIRE_TOKENIZER") == "1" {
			t.Fatalf("Llama 3.1 tokenizer missing in %s (make tokenizer): %v", llama31Dir, err)
		}
		t.Skipf("Llama 3.1 tokenizer missing in %s; run make tokenizer", llama31Dir)
	}
	h, err := Load(llama31Dir)
	if err != nil {
		t.Fatal(err)
	}
	fails := 0
	n := readJSONL(t, "testdata/llama3_encode_ref.jsonl", func(line []byte) {
		var rec struct {
			Text      string   `json:"text"`
			IDs       []uint32 `json:"ids"`
			PromptIDs []uint32 `json:"prompt_ids"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		got, gotPrompt := h.Encode(nil, []byte(rec.Text)), EncodePrompt(h, nil, []byte(rec.Text))
		if !slices.Equal(got, rec.IDs) || !slices.Equal(gotPrompt, rec.PromptIDs) {
			if fails++; fails <= 10 {
				t.Errorf("%q:\n got %v / %v\nwant %v / %v", rec.Text, got, gotPrompt, rec.IDs, rec.PromptIDs)
			}
		}
	})
	if n < 100 {
		t.Fatalf("only %d reference strings", n)
	}
	if fails > 0 {
		t.Fatalf("%d of %d strings differ", fails, n)
	}
}
