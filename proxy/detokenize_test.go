package proxy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
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
