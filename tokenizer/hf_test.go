package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/infera/infera/jinja"
)

const qwen3Dir = "../testdata/tokenizers/qwen3"

var (
	qwen3Once sync.Once
	qwen3     *HF
	qwen3Err  error
)

// loadQwen3 returns the Qwen3 tokenizer fetched by scripts/fetch-tokenizer.sh.
// Without it the test is skipped, unless INFERA_REQUIRE_TOKENIZER=1 (set by
// make test after fetching), in which case it fails.
func loadQwen3(tb testing.TB) *HF {
	tb.Helper()
	if _, err := os.Stat(qwen3Dir + "/tokenizer.json"); err != nil {
		if os.Getenv("INFERA_REQUIRE_TOKENIZER") == "1" {
			tb.Fatalf("Qwen3 tokenizer missing in %s (run scripts/fetch-tokenizer.sh): %v", qwen3Dir, err)
		}
		tb.Skipf("Qwen3 tokenizer missing in %s; run scripts/fetch-tokenizer.sh", qwen3Dir)
	}
	qwen3Once.Do(func() { qwen3, qwen3Err = Load(qwen3Dir) })
	if qwen3Err != nil {
		tb.Fatalf("cannot load Qwen3 tokenizer: %v", qwen3Err)
	}
	return qwen3
}

func readJSONL(tb testing.TB, path string, each func(line []byte)) int {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	n := 0
	for sc.Scan() {
		each(sc.Bytes())
		n++
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return n
}

func TestQwen3EncodeReference(t *testing.T) {
	h := loadQwen3(t)
	fails := 0
	n := readJSONL(t, "testdata/qwen3_encode_ref.jsonl", func(line []byte) {
		var rec struct {
			Text string   `json:"text"`
			IDs  []uint32 `json:"ids"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		got := h.Encode(nil, []byte(rec.Text))
		if !slices.Equal(got, rec.IDs) {
			fails++
			if fails <= 10 {
				t.Errorf("Encode(%q):\n got %v\nwant %v", rec.Text, got, rec.IDs)
			}
		}
	})
	if n < 500 {
		t.Fatalf("only %d reference strings", n)
	}
	if fails > 0 {
		t.Fatalf("%d of %d strings differ", fails, n)
	}
}

type chatRecord struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	EnableThinking      *bool           `json:"enable_thinking"`
	Representable       bool            `json:"representable"`
	Text                string          `json:"text"`
	IDs                 []uint32        `json:"ids"`
	// PyText is the conversation rendered by Python's jinja2 as
	// transformers renders the messages given; VLLMText the prompt vLLM
	// renders (its request preprocessing first: reasoning, tool call
	// arguments decoded). Both from scripts/tokref/vllm_text.py. Text is
	// @huggingface/jinja's (JavaScript), IDs its encoding.
	PyText   string `json:"py_text"`
	VLLMText string `json:"vllm_text"`
}

func TestQwen3ChatReference(t *testing.T) {
	h := loadQwen3(t)
	viaMessages, decoded, emptyReasoning, pyStrip := 0, 0, 0, 0
	n := readJSONL(t, "testdata/qwen3_chat_ref.jsonl", func(line []byte) {
		var rec chatRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		var extra *jinja.Object
		if rec.EnableThinking != nil {
			extra = jinja.NewObject(1)
			extra.Set("enable_thinking", jinja.Bool(*rec.EnableThinking))
		}
		tools := rec.Tools
		if string(tools) == "null" {
			tools = nil
		}
		got, err := h.RenderChatJSON(nil, rec.Messages, tools, rec.AddGenerationPrompt, extra)
		if err != nil {
			t.Fatalf("RenderChatJSON: %v", err)
		}
		// Python's render, as vLLM renders: it strips as Python does
		// (Qwen3's content.split('</think>')[-1].lstrip('\n') keeps a
		// space @huggingface/jinja's strip drops: 11 of the 80 differ).
		if string(got) != rec.PyText {
			t.Fatalf("RenderChatJSON differs from Python's render:\n got %q\nwant %q", got, rec.PyText)
		}
		if rec.PyText != rec.Text {
			pyStrip++
		}
		if ids := h.Encode(nil, []byte(rec.Text)); !slices.Equal(ids, rec.IDs) {
			t.Fatalf("Encode(%q):\n got %v\nwant %v", rec.Text, ids, rec.IDs)
		}
		// The typed Message path (the router's and the engine's) must
		// render what vLLM renders wherever the conversation fits the
		// Message struct, enable_thinking given as the request's
		// chat_template_kwargs: tool call arguments decoded, so that
		// Qwen3's template writes them with tojson.
		if rec.Representable {
			var msgs []Message
			var given []struct {
				Reasoning *string `json:"reasoning_content"`
			}
			if err := json.Unmarshal(rec.Messages, &msgs); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(rec.Messages, &given); err != nil {
				t.Fatal(err)
			}
			for i := range msgs {
				// An empty reasoning is given (a string, unlike null).
				msgs[i].HasReasoning = given[i].Reasoning != nil
				if msgs[i].HasReasoning && *given[i].Reasoning == "" {
					emptyReasoning++
				}
			}
			f := ChatFields{Tools: tools}
			if rec.EnableThinking != nil {
				f.Kwargs = []byte(`{"enable_thinking":` + strconv.FormatBool(*rec.EnableThinking) + `}`)
			}
			got2, err := RenderChatFields(h, nil, msgs, f, rec.AddGenerationPrompt)
			if err != nil {
				t.Fatalf("RenderChat: %v", err)
			}
			if string(got2) != rec.VLLMText {
				t.Fatalf("RenderChat differs from vLLM's prompt:\n got %q\nwant %q", got2, rec.VLLMText)
			}
			if rec.VLLMText != rec.PyText {
				decoded++
			}
			viaMessages++
		}
	})
	if n < 50 {
		t.Fatalf("only %d reference conversations", n)
	}
	if viaMessages < 20 || decoded < 10 || emptyReasoning == 0 || pyStrip == 0 {
		t.Fatalf("only %d conversations exercised RenderChat, %d of them with arguments vLLM decodes, %d empty reasonings; %d strip as Python does",
			viaMessages, decoded, emptyReasoning, pyStrip)
	}
	t.Logf("%d conversations, %d also through RenderChat", n, viaMessages)
}

func TestEncodeConcurrent(t *testing.T) {
	h := loadQwen3(t)
	var texts [][]byte
	var want [][]uint32
	readJSONL(t, "testdata/qwen3_encode_ref.jsonl", func(line []byte) {
		var rec struct {
			Text string   `json:"text"`
			IDs  []uint32 `json:"ids"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		texts, want = append(texts, []byte(rec.Text)), append(want, rec.IDs)
	})
	h.model.cache.reset()
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var dst []uint32
			for i := range texts {
				k := (i*7 + g*131) % len(texts)
				if dst = h.Encode(dst[:0], texts[k]); !slices.Equal(dst, want[k]) {
					errs <- string(texts[k])
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent Encode(%q) differs", s)
	}
}

func TestLoadErrors(t *testing.T) {
	f := func(name, tokJSON string) {
		t.Helper()
		dir := t.TempDir()
		if err := os.WriteFile(dir+"/tokenizer.json", []byte(tokJSON), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(dir); err == nil {
			t.Errorf("%s: Load succeeded, want error", name)
		}
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Error("Load of an empty directory succeeded")
	}
	f("not json", "{")
	f("wordpiece", `{"model": {"type": "WordPiece", "vocab": {}}}`)
	f("gpt2 regex", `{"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`)
	f("unknown split", `{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`)
	f("nfkc", `{"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`)
	f("byte fallback", `{"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []}}`)
}

// TestLoadSmall loads a tiny hand-written tokenizer: merges in "a b" string
// form, a cl100k split pattern and a list-form chat template.
func TestLoadSmall(t *testing.T) {
	enc, _ := byteLevelAlphabet()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(enc[b])] = b
	}
	vocab["ab"], vocab["abc"], vocab["12"] = 256, 257, 258
	tj := map[string]any{
		"added_tokens": []any{map[string]any{"id": 300, "content": "<s>", "special": true}},
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": cl100kPattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a b", "ab c", "1 2"}},
	}
	dir := t.TempDir()
	data, _ := json.Marshal(tj)
	os.WriteFile(dir+"/tokenizer.json", data, 0o644)
	os.WriteFile(dir+"/tokenizer_config.json", []byte(`{"eos_token": {"content": "<s>"}, "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"}]}`), 0o644)
	h, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.Encode(nil, []byte("abc<s>1234ab")), []uint32{257, 300, 258, '3', '4', 256}; !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	out, err := h.RenderChat(nil, []Message{{Role: "user", Content: "hi"}}, nil, false)
	if err != nil || string(out) != "user:hi<s>" {
		t.Fatalf("RenderChat = %q, %v", out, err)
	}
	if id, ok := h.TokenID("<s>"); !ok || id != 300 || h.EOSToken() != "<s>" {
		t.Fatalf("TokenID/EOSToken = %d %v %q", id, ok, h.EOSToken())
	}
}

// A request's documents and chat_template_kwargs reach the template as vLLM
// passes them to transformers: documents as the request gives them, each
// kwarg a variable set over tools and bos_token, under the request's
// add_generation_prompt and documents (TestRequestFieldsAreMergedOverKwargsAsVLLMMergesThem),
// except apply_chat_template's own parameters, which it consumes. Booleans print as
// Python's str writes them (True), as vLLM's template prints them.
func TestChatFieldsReachTheTemplateAsVLLMPassesThem(t *testing.T) {
	loadQwen3(t)
	dir := t.TempDir()
	if err := os.Symlink(mustAbs(t, qwen3Dir+"/tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(qwen3Dir + "/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = `{% if documents %}{% for d in documents %}[{{ d.title }}:{{ d.text }}]{% endfor %}{% endif %}` +
		`{{ messages | length }}|{{ tools | length if tools else 'none' }}|{{ add_generation_prompt }}|{{ bos_token }}|` +
		`{{ x | tojson if x is defined else '-' }}|{{ tokenize is defined }}{{ chat_template is defined }}{{ continue_final_message is defined }}`
	if raw, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	check := func(name string, f ChatFields, addGen bool, want string) {
		t.Helper()
		got, err := RenderChatFields(h, nil, msgs, f, addGen)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(got) != want {
			t.Errorf("%s: rendered %q, want %q", name, got, want)
		}
	}
	docs := []byte(`[{"title":"a","text":"one"},{"title":"b","text":"two"}]`)
	check("documents", ChatFields{Documents: docs}, true, `[a:one][b:two]1|none|True||-|FalseFalseFalse`)
	check("kwargs", ChatFields{Documents: docs, Tools: []byte(`[1]`),
		Kwargs: []byte(`{"x":{"k":[1,"s"]},"add_generation_prompt":false,"bos_token":"<s>","tools":[1,2],"documents":[],` +
			`"tokenize":true,"chat_template":"ignored","continue_final_message":true}`)}, true,
		`[a:one][b:two]1|2|True|<s>|{"k": [1, "s"]}|FalseFalseFalse`)
	check("kwargs' generation prompt", ChatFields{Kwargs: []byte(`{"add_generation_prompt":true}`)}, false, `1|none|False||-|FalseFalseFalse`)
	if _, err := RenderChatFields(h, nil, msgs, ChatFields{Kwargs: []byte(`[1]`)}, true); err == nil {
		t.Error("chat_template_kwargs that are not an object were rendered")
	}
}

// chat_template_kwargs are merged with the request's own fields as vLLM
// (v0.19 and later, through v0.28) merges them: build_chat_params sets the
// request's add_generation_prompt, continue_final_message, documents and
// reasoning_effort over the kwargs (renderers.merge_kwargs, which skips
// the request's None values), then OnlineRenderer.preprocess_chat's
// ChatParams.with_defaults sets the result over the request's tools,
// dropping the kwargs' None and "auto" values. The router let every kwarg
// win: a client's {"add_generation_prompt": false} cut the generation
// prompt the engine renders, a {"tools": null} dropped the request's
// tools the engine renders, and {"enable_thinking": null} reached the
// template as None where the engine's gets nothing.
func TestRequestFieldsAreMergedOverKwargsAsVLLMMergesThem(t *testing.T) {
	loadQwen3(t)
	dir := t.TempDir()
	if err := os.Symlink(mustAbs(t, qwen3Dir+"/tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]string{"chat_template": `{{ add_generation_prompt }}|{{ documents | tojson }}|` +
		`{{ tools | tojson }}|{{ 'undef' if x is undefined else x }}|{{ reasoning_effort | default('-') }}|` +
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
		name   string
		f      ChatFields
		addGen bool
		want   string
	}{
		{"the request's generation prompt", ChatFields{Kwargs: []byte(`{"add_generation_prompt":false}`)}, true, `True|null|null|undef|-|undef`},
		{"the request's documents", ChatFields{Documents: []byte(`[{"t":"r"}]`), Kwargs: []byte(`{"documents":[{"t":"k"}]}`)}, true, `True|[{"t": "r"}]|null|undef|-|undef`},
		{"the kwargs' documents", ChatFields{Kwargs: []byte(`{"documents":[{"t":"k"}]}`)}, true, `True|[{"t": "k"}]|null|undef|-|undef`},
		{"the kwargs' tools", ChatFields{Tools: []byte(`[1]`), Kwargs: []byte(`{"tools":[2]}`)}, true, `True|null|[2]|undef|-|undef`},
		{"null tools dropped", ChatFields{Tools: []byte(`[1]`), Kwargs: []byte(`{"tools":null}`)}, true, `True|null|[1]|undef|-|undef`},
		{"null and auto dropped", ChatFields{Kwargs: []byte(`{"x":null,"enable_thinking":"auto"}`)}, true, `True|null|null|undef|-|undef`},
		{"other values kept", ChatFields{Kwargs: []byte(`{"x":"Auto"}`)}, true, `True|null|null|Auto|-|undef`},
		{"the request's effort", ChatFields{ReasoningEffort: "low", Kwargs: []byte(`{"reasoning_effort":"high"}`)}, true, `True|null|null|undef|low|True`},
		{"the kwargs' effort", ChatFields{Kwargs: []byte(`{"reasoning_effort":"high"}`)}, true, `True|null|null|undef|high|undef`},
		{"a null enable_thinking named", ChatFields{ReasoningEffort: "none", Kwargs: []byte(`{"enable_thinking":null}`)}, true, `True|null|null|undef|none|undef`},
	} {
		got, err := RenderChatFields(h, nil, msgs, c.f, c.addGen)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(got) != c.want {
			t.Errorf("%s: rendered %q, want %q", c.name, got, c.want)
		}
	}
}

// A request's reasoning effort reaches the template as vLLM v0.28's
// ChatCompletionRequest.build_chat_params passes it: reasoning_effort over
// chat_template_kwargs' (gpt-oss and Qwen3.8 branch on its value), and
// enable_thinking, whether it is other than "none", unless
// chat_template_kwargs names enable_thinking (vLLM PR #43401).
func TestReasoningEffortIsATemplateVariableAsVLLMPassesIt(t *testing.T) {
	loadQwen3(t)
	dir := t.TempDir()
	if err := os.Symlink(mustAbs(t, qwen3Dir+"/tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]string{"chat_template": `{{ reasoning_effort }}|{{ enable_thinking }}`})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ effort, kw, want string }{
		{"low", "", "low|True"},
		{"none", "", "none|False"},
		{"max", `{"reasoning_effort":"low","enable_thinking":false}`, "max|False"},
		{"none", `{"enable_thinking":null}`, "none|"}, // named, so not set; then dropped as None
		{"", `{"reasoning_effort":"low"}`, "low|"},
		{"", "", "|"},
	} {
		got, err := RenderChatFields(h, nil, []Message{{Role: "user", Content: "hi"}},
			ChatFields{Kwargs: []byte(c.kw), ReasoningEffort: c.effort}, true)
		if err != nil || string(got) != c.want {
			t.Errorf("effort %q kwargs %s: %q %v, want %q", c.effort, c.kw, got, err, c.want)
		}
	}
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// add_bos_token and add_eos_token are read as transformers v5 reads them
// (the version the current vLLM release installs: its pin excludes only
// 5.0-5.5.0), for every tokenizer class and without one:
// TokenizersBackend.__init__ calls update_post_processor when
// tokenizer_config.json names either, replacing tokenizer.json's
// post_processor by bos_token when add_bos_token (default false), the
// sequence, and eos_token when add_eos_token (default false), a null token
// left out; otherwise tokenizer.json's post_processor stands. The router
// read them for the Llama classes only, as transformers v4 did (BOS by
// default, a null bos_token refused): a PreTrainedTokenizerFast config
// with add_bos_token false (a Llama 3 fine-tune's, to avoid a double BOS)
// got a BOS the engine does not put before a completion's prompt, one
// with add_eos_token true lacked the EOS and kept the BOS the engine drops.
func TestAddBOSAndAddEOSAreReadAsTransformersV5ReadsThem(t *testing.T) {
	if raceEnabled {
		// Thirteen loads of Qwen3's 11 MB tokenizer.json, one goroutine:
		// 28 s under the race detector (the race pass's tail), a few
		// seconds in make test's plain pass, which checks it.
		t.Skip("single-goroutine loads; checked without the race detector")
	}
	loadQwen3(t)
	raw, err := os.ReadFile(qwen3Dir + "/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	bosPost := json.RawMessage(`{"type":"TemplateProcessing",
		"single":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
		"pair":[],"special_tokens":{"<|endoftext|>":{"id":"<|endoftext|>","ids":[151643],"tokens":["<|endoftext|>"]}}}`)
	const bos, eos = 151643, 151645 // <|endoftext|>, <|im_end|>
	hello := []uint32{14990, 1879}  // "hello world"
	load := func(post json.RawMessage, cfg string) (*HF, error) {
		t.Helper()
		dir := t.TempDir()
		tj["post_processor"] = post
		raw, _ := json.Marshal(tj)
		if os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644) != nil ||
			os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644) != nil {
			t.Fatal("cannot write the tokenizer")
		}
		return Load(dir)
	}
	const toks = `"bos_token":"<|endoftext|>","eos_token":"<|im_end|>"`
	for _, c := range []struct {
		name, cfg string
		post      json.RawMessage
		want      []uint32
	}{
		{"no keys: the post_processor's", `{"tokenizer_class":"PreTrainedTokenizerFast",` + toks + `}`, bosPost, append([]uint32{bos}, hello...)},
		{"no class, no keys: the post_processor's", `{` + toks + `}`, bosPost, append([]uint32{bos}, hello...)},
		{"Llama, no keys: the post_processor's", `{"tokenizer_class":"LlamaTokenizerFast",` + toks + `}`, json.RawMessage(`null`), hello},
		{"PreTrainedTokenizerFast, add_bos_token false", `{"tokenizer_class":"PreTrainedTokenizerFast","add_bos_token":false,` + toks + `}`, bosPost, hello},
		{"PreTrainedTokenizerFast, add_eos_token true", `{"tokenizer_class":"PreTrainedTokenizerFast","add_eos_token":true,` + toks + `}`, bosPost, []uint32{14990, 1879, eos}},
		{"Qwen2Tokenizer, add_bos_token true", `{"tokenizer_class":"Qwen2Tokenizer","add_bos_token":true,` + toks + `}`, json.RawMessage(`null`), append([]uint32{bos}, hello...)},
		{"no class, add_bos_token true", `{"add_bos_token":true,` + toks + `}`, json.RawMessage(`null`), append([]uint32{bos}, hello...)},
		{"a null bos_token left out", `{"tokenizer_class":"LlamaTokenizerFast","add_bos_token":true,"bos_token":null}`, bosPost, hello},
		{"Llama, add_bos_token false", `{"tokenizer_class":"LlamaTokenizerFast","add_bos_token":false,` + toks + `}`, bosPost, hello},
		{"Llama, add_eos_token true", `{"tokenizer_class":"LlamaTokenizer","add_bos_token":true,"add_eos_token":true,` + toks + `}`, bosPost, []uint32{bos, 14990, 1879, eos}},
		{"Llama, neither", `{"tokenizer_class":"LlamaTokenizerFast","add_bos_token":false,"add_eos_token":false,` + toks + `}`, bosPost, hello},
		{"Qwen3's config: neither", `{"tokenizer_class":"Qwen2Tokenizer","add_bos_token":false,"bos_token":null,"eos_token":"<|im_end|>"}`, json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}`), hello},
	} {
		h, err := load(c.post, c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := EncodePrompt(h, nil, []byte("hello world")); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// A special token outside the vocabulary (transformers adds it as a
	// new token) is refused.
	if _, err := load(bosPost, `{"add_bos_token":true,"bos_token":"<not a token>"}`); err == nil {
		t.Error("a config adding a bos_token outside the vocabulary loaded")
	}
}
