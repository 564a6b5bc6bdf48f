package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/internal/jsonscan"
)

// POST /detokenize (vLLM's) turns the router's tokens back into the text:
// what /tokenize gives for a prompt comes back as that prompt, with the
// built-in tokenizer and with Qwen3's; bodies that are not {"tokens":
// [ids]} get a 400; without a tokenizer the endpoint is 501.
func TestDetokenizeInvertsTokenize(t *testing.T) {
	up := startUpstream(t, okHandler)
	text := "Héllo, wörld! The quick brown fox jumps over the lazy dog. 你好"
	for _, dir := range []string{"", "qwen3"} {
		f := defaultFlags()
		f.RouterPolicy = "kv-aware"
		if dir != "" {
			f.RouterTokenizerPath = qwen3Dir(t)
		}
		r := startRouter(t, f, nil, up.url)
		prompt, _ := json.Marshal(text)
		code, b := post(t, r.url+"/tokenize", `{"model":"m","prompt":`+string(prompt)+`}`)
		var tok struct {
			Tokens []uint32 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal([]byte(b), &tok) != nil || len(tok.Tokens) == 0 {
			t.Fatalf("%s tokenize: %d %s", dir, code, b)
		}
		ids, _ := json.Marshal(tok.Tokens)
		code, b = post(t, r.url+"/detokenize", `{"model":"m","tokens":`+string(ids)+`}`)
		var out struct {
			Prompt string `json:"prompt"`
		}
		if code != 200 || json.Unmarshal([]byte(b), &out) != nil || out.Prompt != text {
			t.Fatalf("%s detokenize: %d %s, want %q", dir, code, b, text)
		}
		for _, bad := range []string{`{"model":"m"}`, `{"tokens":"1 2"}`, `{"tokens":[-1]}`, `{"tokens":["a"]}`, `{"tokens":[1.5]}`,
			`{"tokens":[1],"tokens":[2]}`, `{"tokens":[1]`, `[1,2]`} {
			if code, b := post(t, r.url+"/detokenize", bad); code != 400 {
				t.Fatalf("%s %s: %d %s", dir, bad, code, b)
			}
		}
	}
	f := defaultFlags()
	f.RouterPolicy = "round-robin"
	r := startRouter(t, f, nil, up.url)
	if code, b := post(t, r.url+"/detokenize", `{"tokens":[1]}`); code != 501 || !strings.Contains(b, "tokenizer") {
		t.Fatalf("no tokenizer: %d %s", code, b)
	}
}

// FuzzDetokenizeBody: the /detokenize parse never panics, and what it
// accepts encoding/json reads as an object whose tokens are those ids.
func FuzzDetokenizeBody(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2,3]}`, `{"model":"m","tokens":[]}`, `{"tokens":[4294967295]}`, `{"tokens":[-1]}`, `{"tokens":[1]`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ids, err := detokenizeIDs(nil, data)
		if err != nil {
			return
		}
		var v struct {
			Tokens []uint32 `json:"tokens"`
		}
		if json.Unmarshal(data, &v) != nil || len(v.Tokens) != len(ids) {
			t.Fatalf("accepted %q as %v", data, ids)
		}
		for i := range ids {
			if ids[i] != v.Tokens[i] {
				t.Fatalf("accepted %q as %v", data, ids)
			}
		}
	})
}

// /tokenize answers what the router encodes; for a prompt it encodes only
// in part (past --router-tokenize-max-bytes) or not at all (more tools
// than the router renders) it says so, "truncated":true with its estimate
// of the whole, where it used to answer a count that looked like the
// prompt's (0 tokens for the tools). A prompt encoded whole has neither
// field, as vLLM's answer.
func TestTokenizeSaysWhenItEncodedOnlyPartOfThePrompt(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizeMaxBytes = "kv-aware", 4096
	r := startRouter(t, f, nil, up.url)
	type answer struct {
		Tokens    []uint32 `json:"tokens"`
		Count     int      `json:"count"`
		Truncated *bool    `json:"truncated"`
		Estimate  *int     `json:"estimated_count"`
	}
	ask := func(body string) answer {
		t.Helper()
		code, b := post(t, r.url+"/tokenize", body)
		var a answer
		if code != 200 || json.Unmarshal([]byte(b), &a) != nil {
			t.Fatalf("%d %.300s", code, b)
		}
		return a
	}
	chat := func(content, extra string) string {
		return `{"model":"m",` + extra + `"messages":[{"role":"user","content":"` + content + `"}]}`
	}
	if a := ask(chat("hello there", "")); a.Truncated != nil || a.Estimate != nil || a.Count == 0 || a.Count != len(a.Tokens) {
		t.Fatalf("a short chat: %+v", a)
	}
	long := ask(chat(strings.Repeat("lorem ipsum dolor sit amet ", 2000), "")) // 54 KB
	if long.Truncated == nil || !*long.Truncated || long.Estimate == nil || *long.Estimate < 5*long.Count || long.Count != len(long.Tokens) {
		t.Fatalf("a chat past the bound: count %d, truncated %v, estimate %v", long.Count, long.Truncated, long.Estimate)
	}
	var tools strings.Builder
	tools.WriteString(`"tools":[`)
	for i := 0; i < maxRouteElems+1; i++ {
		if i > 0 {
			tools.WriteByte(',')
		}
		tools.WriteString(`{"type":"function","function":{"name":"f","parameters":{}}}`)
	}
	tools.WriteString(`],`)
	if a := ask(chat("hello", tools.String())); a.Truncated == nil || !*a.Truncated || a.Estimate != nil || a.Count != 0 {
		t.Fatalf("a chat with more tools than the router renders: %+v", a)
	}
}

// A /detokenize body with a bad token id or too many ids is told what is
// wrong with its ids; it was told "tokens is required", as if it had none.
func TestDetokenizeSaysWhatIsWrongWithTheIDs(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"tokens":[1,-1]}`, "integer in [0, 4294967295]"},
		{`{"tokens":[1.5]}`, "integer in [0, 4294967295]"},
		{`{"tokens":[4294967296]}`, "integer in [0, 4294967295]"},
		{`{"tokens":[` + strings.Repeat("1,", maxDetokenize) + `1]}`, "more than 1048576 token ids"},
		{`{"model":"m"}`, "tokens is required"},
		{`{"tokens":"1 2"}`, "tokens is required"},
	} {
		_, err := detokenizeIDs(nil, []byte(c.body))
		var br *badRequestError
		if !errors.As(err, &br) || !strings.Contains(br.msg, c.want) || br.param != "tokens" {
			t.Errorf("%.40s: %v, want a tokens error saying %q", c.body, err, c.want)
		}
	}
}

// With a tokenizer whose post-processor puts a BOS before a sequence (as
// DeepSeek-R1-Distill-Qwen's and Llama 3.1's do), a completion's prompt is
// tokenized after that BOS, as vLLM encodes it (add_special_tokens is on
// for completions), and a chat is not (its template writes bos_token, and
// vLLM adds none). The router ignored the post-processor: /tokenize of a
// prompt answered one token fewer than the engine's, and every block hash
// of a completion differed from the engine's.
func TestACompletionPromptIsTokenizedAfterTheBOSTheEngineAdds(t *testing.T) {
	dir := bosQwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	// "hello world" is [14990, 1879] under Qwen3's vocab.
	if got, want := routerTokens(t, r.url, `{"model":"m","prompt":"hello world"}`), []uint32{151643, 14990, 1879}; !slices.Equal(got, want) {
		t.Fatalf("prompt tokens %v, want %v", got, want)
	}
	if got := routerTokens(t, r.url, `{"model":"m","messages":[{"role":"user","content":"hello world"}]}`); len(got) == 0 || got[0] != 151644 {
		t.Fatalf("chat tokens %v, want <|im_start|> (151644) first and no BOS", got)
	}
}

// A request's add_special_tokens is read as vLLM reads it (the last copy;
// its default is true for a completion, false for a chat): a completion
// with add_special_tokens false is encoded without the BOS, a chat with it
// true after the BOS (vLLM's ChatCompletionRequest.build_tok_params and
// CompletionRequest pass it to the tokenizer's encode). The router ignored
// it: such a completion was hashed one token off the engine's prompt
// (every block hash differed), and such a chat too.
func TestAddSpecialTokensOfTheRequestIsHonoured(t *testing.T) {
	dir := bosQwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	const bos = 151643
	for _, c := range []struct {
		body string
		want []uint32
	}{
		{`{"model":"m","prompt":"hello world","add_special_tokens":false}`, []uint32{14990, 1879}},
		{`{"model":"m","prompt":"hello world","add_special_tokens":true}`, []uint32{bos, 14990, 1879}},
		{`{"model":"m","prompt":"hello world","add_special_tokens":null}`, []uint32{bos, 14990, 1879}},
		{`{"model":"m","add_special_tokens":true,"prompt":"hello world","add_special_tokens":false}`, []uint32{14990, 1879}},
	} {
		if got := routerTokens(t, r.url, c.body); !slices.Equal(got, c.want) {
			t.Errorf("%s: tokens %v, want %v", c.body, got, c.want)
		}
	}
	chat := `"messages":[{"role":"user","content":"hello world"}]`
	plain := routerTokens(t, r.url, `{"model":"m",`+chat+`}`)
	if got := routerTokens(t, r.url, `{"model":"m",`+chat+`,"add_special_tokens":false}`); !slices.Equal(got, plain) {
		t.Errorf("chat with add_special_tokens false: %v, want %v", got, plain)
	}
	if got, want := routerTokens(t, r.url, `{"model":"m",`+chat+`,"add_special_tokens":true}`), append([]uint32{bos}, plain...); !slices.Equal(got, want) {
		t.Errorf("chat with add_special_tokens true: %v, want %v", got, want)
	}
}

// add_special_tokens is read as the engine's request model reads a bool
// (pydantic, lax): JSON decoded first, so "\u0066alse", "False", 0 and
// "no" are false, "\u0074rue", 1 and "yes" true. The router compared the
// raw bytes' first character: such a completion was encoded with the BOS
// the engine leaves out (every block hash one token off), such a chat
// without the BOS the engine puts in.
func TestAddSpecialTokensIsReadAsTheEngineDecodesIt(t *testing.T) {
	dir := bosQwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	const bos = 151643
	for _, v := range []string{`"\u0066alse"`, `"false"`, `"False"`, `0`, `0.0`, `"no"`, `"0"`, `"off"`} {
		body := `{"model":"m","prompt":"hello world","add_special_tokens":` + v + `}`
		if got, want := routerTokens(t, r.url, body), []uint32{14990, 1879}; !slices.Equal(got, want) {
			t.Errorf("%s: tokens %v, want %v", body, got, want)
		}
	}
	chat := `"messages":[{"role":"user","content":"hello world"}]`
	plain := routerTokens(t, r.url, `{"model":"m",`+chat+`}`)
	for _, v := range []string{`"\u0074rue"`, `"true"`, `"TRUE"`, `1`, `1e0`, `"yes"`, `"on"`, `"t"`} {
		body := `{"model":"m",` + chat + `,"add_special_tokens":` + v + `}`
		if got, want := routerTokens(t, r.url, body), append([]uint32{bos}, plain...); !slices.Equal(got, want) {
			t.Errorf("%s: tokens %v, want %v", body, got, want)
		}
	}
	// add_generation_prompt and continue_final_message alike.
	noGen := routerTokens(t, r.url, `{"model":"m",`+chat+`,"add_generation_prompt":false}`)
	if slices.Equal(noGen, plain) {
		t.Fatal("add_generation_prompt false renders as the default")
	}
	for _, v := range []string{`"\u0066alse"`, `0`, `"No"`} {
		body := `{"model":"m",` + chat + `,"add_generation_prompt":` + v + `}`
		if got := routerTokens(t, r.url, body); !slices.Equal(got, noGen) {
			t.Errorf("%s: tokens %v, want %v", body, got, noGen)
		}
	}
}

// laxBoolRef is pydantic's lax bool on the value encoding/json decodes.
func laxBoolRef(v []byte) byte {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return 0
	}
	switch x := x.(type) {
	case bool:
		if x {
			return 't'
		}
		return 'f'
	case float64:
		switch x {
		case 0:
			return 'f'
		case 1:
			return 't'
		}
	case string:
		if !isASCII(x) {
			return 0 // compared case-insensitively in ASCII only
		}
		switch strings.ToLower(x) {
		case "1", "t", "y", "on", "yes", "true":
			return 't'
		case "0", "f", "n", "no", "off", "false":
			return 'f'
		}
	}
	return 0
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// laxBool agrees with a decode-then-compare reference on any JSON value.
func FuzzLaxBool(f *testing.F) {
	for _, s := range []string{`true`, `false`, `null`, `0`, `1`, `1.0`, `-0`, `2`, `"\u0074rue"`, `"False"`, `"yes"`, `"\u004fN"`, `"tru"`, `"true "`, `[]`, `{}`, `"\u0131"`, `"\u0074\u0072\u0075\u0065"`, `1e999`, `10e-1`, `0.1e1`, `0.99999999999999999999`, `1e-400`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		if !json.Valid(v) {
			return
		}
		v = bytes.TrimSpace(v) // the parser hands over the value without space
		if got, want := jsonscan.LaxBool(v), laxBoolRef(v); got != want {
			t.Fatalf("jsonscan.LaxBool(%s) = %q, want %q", v, got, want)
		}
	})
}

// reasoning_effort is decoded before it is compared, as the engine reads
// it; a template gets "low" for "\u006cow" (it got nothing).
func TestReasoningEffortIsReadDecoded(t *testing.T) {
	for in, want := range map[string]string{
		`"low"`: "low", `"\u006cow"`: "low", `"\u0068igh"`: "high", `"n\u006fne"`: "none",
		`"LOW"`: "", `null`: "", `"low "`: "", `"\u006cow\u006cow\u006cow\u006cow"`: "",
	} {
		if got := reasoningEffort([]byte(in)); got != want {
			t.Errorf("reasoningEffort(%s) = %q, want %q", in, got, want)
		}
	}
}

// routerTokens returns the router's /tokenize answer's tokens for body.
func routerTokens(t *testing.T, url, body string) []uint32 {
	t.Helper()
	code, b := post(t, url+"/tokenize", body)
	var a struct {
		Tokens []uint32 `json:"tokens"`
	}
	if code != 200 || json.Unmarshal([]byte(b), &a) != nil {
		t.Fatalf("%s: %d %.300s", body, code, b)
	}
	return a.Tokens
}

// bosQwen3Dir is Qwen3's tokenizer with a post-processor that puts
// <|endoftext|> (151643) before a sequence, as Llama 3.1's puts its BOS.
func bosQwen3Dir(t *testing.T) string {
	t.Helper()
	src := qwen3Dir(t)
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	tj["post_processor"] = json.RawMessage(`{"type":"TemplateProcessing",
		"single":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
		"pair":[],"special_tokens":{"<|endoftext|>":{"id":"<|endoftext|>","ids":[151643],"tokens":["<|endoftext|>"]}}}`)
	dir := t.TempDir()
	raw, _ = json.Marshal(tj)
	// Without Qwen3's add_bos_token (false), which would replace the
	// post-processor (transformers v5), as Llama 3.1's config names none.
	var c map[string]json.RawMessage
	if raw, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json")); err != nil || json.Unmarshal(raw, &c) != nil {
		t.Fatal("cannot read the tokenizer config")
	}
	delete(c, "add_bos_token")
	cfg, _ := json.Marshal(c)
	if os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644) != nil || os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644) != nil {
		t.Fatal("cannot write the tokenizer")
	}
	return dir
}
