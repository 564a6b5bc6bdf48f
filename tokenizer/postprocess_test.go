package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// writeSmall writes a tiny byte-level tokenizer (bytes, "ab", "<s>" as
// id 300, "</s>" as 301) with the given post_processor to a new directory.
func writeSmall(t *testing.T, post any) string {
	t.Helper()
	enc, _ := byteLevelAlphabet()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(enc[b])] = b
	}
	vocab["ab"] = 256
	tj := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 300, "content": "<s>", "special": true},
			map[string]any{"id": 301, "content": "</s>", "special": true},
		},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": qwen2Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"post_processor": post,
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a b"}},
	}
	dir := t.TempDir()
	data, err := json.Marshal(tj)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/tokenizer.json", data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func template(single ...any) map[string]any {
	return map[string]any{"type": "TemplateProcessing", "single": single, "pair": []any{},
		"special_tokens": map[string]any{
			"<s>":  map[string]any{"id": "<s>", "ids": []int{300}, "tokens": []string{"<s>"}},
			"</s>": map[string]any{"id": "</s>", "ids": []int{301}, "tokens": []string{"</s>"}},
		}}
}

var (
	bosPiece = map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}
	eosPiece = map[string]any{"SpecialToken": map[string]any{"id": "</s>", "type_id": 0}}
	seqA     = map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}
)

// A tokenizer whose post-processor puts a BOS before a sequence (Llama
// 3.1's, DeepSeek-R1-Distill-Qwen's TemplateProcessing) encodes a plain
// prompt after that BOS, as the engine does (vLLM's add_special_tokens is
// on for completions; @lenml/tokenizers gives Llama 3.1's "hello" as
// [128000, 15339]); Encode, which a rendered chat goes through, does not
// add it. Load ignored post_processor, so a completion's tokens lacked the
// engine's first token and every block hash differed from the engine's.
func TestAPromptIsEncodedAfterThePostProcessorsBOS(t *testing.T) {
	for _, post := range []any{
		template(bosPiece, seqA),
		map[string]any{"type": "Sequence", "processors": []any{map[string]any{"type": "ByteLevel"}, template(bosPiece, seqA)}},
	} {
		h, err := Load(writeSmall(t, post))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := EncodePrompt(h, nil, []byte("ab a")), []uint32{300, 256, ' ', 'a'}; !slices.Equal(got, want) {
			t.Fatalf("EncodePrompt = %v, want %v", got, want)
		}
		if got, want := h.Encode(nil, []byte("ab a")), []uint32{256, ' ', 'a'}; !slices.Equal(got, want) {
			t.Fatalf("Encode = %v, want %v", got, want)
		}
	}
	for _, post := range []any{nil, map[string]any{"type": "ByteLevel", "trim_offsets": false}, template(seqA)} {
		h, err := Load(writeSmall(t, post))
		if err != nil {
			t.Fatal(err)
		}
		if got := EncodePrompt(h, nil, []byte("ab")); !slices.Equal(got, []uint32{256}) {
			t.Fatalf("%v: EncodePrompt = %v, want [256]", post, got)
		}
	}
	if got := EncodePrompt(Simple{}, nil, []byte("abcd")); len(got) != 1 {
		t.Fatalf("Simple EncodePrompt = %v", got)
	}
}

// A post-processor that adds tokens Load does not put where the engine
// does (after the sequence, Bert's and Roberta's) is refused, naming it.
func TestLoadRefusesAPostProcessorItDoesNotApply(t *testing.T) {
	for _, c := range []struct {
		post any
		want string
	}{
		{template(bosPiece, seqA, eosPiece), "template for one sequence"},
		{template(seqA, eosPiece), "template for one sequence"},
		{map[string]any{"type": "RobertaProcessing", "sep": []any{"</s>", 301}, "cls": []any{"<s>", 300}}, `"RobertaProcessing"`},
		{map[string]any{"type": "Sequence", "processors": []any{template(bosPiece, seqA), template(bosPiece, seqA)}}, "two TemplateProcessing"},
	} {
		_, err := Load(writeSmall(t, c.post))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "post_processor") {
			t.Errorf("%v: Load error %v, want one naming %s", c.post, err, c.want)
		}
	}
}

// An unsupported component is named in an error of one line and bounded
// size: Load quoted its JSON as the file holds it, so DeepSeek V3's
// pre_tokenizer made a 1.3 KB fatal log line of 40 indented lines, and a
// normalizer's precompiled_charsmap (hundreds of kilobytes) one that size.
func TestAnUnsupportedComponentIsNamedBriefly(t *testing.T) {
	charsmap := strings.Repeat("ALQCAACEAAAAAACAAQAAgMz8AgC4BQAAhyIAgMzk", 5000)
	for _, c := range []struct{ tokJSON, want string }{
		{`{"normalizer": {"type": "Sequence", "normalizers": [{"type": "Precompiled", "precompiled_charsmap": "` + charsmap + `"}]}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, `normalizer {"type":"Sequence","normalizers":[{"type":"Precompiled"`},
		{"{\"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [\n        {\"type\": \"Digits\"}\n    ]\n}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", `pre_tokenizer {"type":"Sequence","pretokenizers":[{"type":"Digits"}]} is not supported`},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(dir+"/tokenizer.json", []byte(c.tokJSON), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || len(err.Error()) > 600 {
			t.Errorf("Load error (%d bytes) %.400q, want one line under 600 bytes naming %s", len(fmt.Sprint(err)), err, c.want)
		}
	}
}

// `infera tokenize` of plain text answers what the router's /tokenize and
// the engine give a prompt: after the post-processor's BOS. It printed the
// ids without it, so the tool meant for checking the router against the
// engine disagreed with both on Llama 3.1.
func TestTheTokenizeCommandEncodesAPromptAfterTheBOS(t *testing.T) {
	var out strings.Builder
	c := Cmd{Tokenizer: writeSmall(t, template(bosPiece, seqA)), Stdin: strings.NewReader("ab a"), Stdout: &out}
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	if want := "300 256 32 97\ncount: 4\n"; out.String() != want {
		t.Fatalf("infera tokenize = %q, want %q", out.String(), want)
	}
}
