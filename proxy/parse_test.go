package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/infera/infera/protocol"
	"github.com/infera/infera/tokenizer"
	"github.com/zeebo/xxh3"
)

func TestParseBody(t *testing.T) {
	f := func(kind int, in string, model string, stream bool, maxTok int, text string) {
		t.Helper()
		var b reqBody
		if err := b.parse([]byte(in), kind); err != nil {
			t.Fatalf("parse(%q): %v", in, err)
		}
		if string(b.model) != model || b.stream != stream || b.maxTokens != maxTok || string(b.text) != text {
			t.Fatalf("parse(%q) = model %q stream %v max %d text %q", in, b.model, b.stream, b.maxTokens, b.text)
		}
	}
	f(kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "m", false, -1, "hi")
	f(kindChat, ` {"messages":[{"role":"system","content":"a\nb"},{"role":"user","content":[{"type":"text","text":"c"},{"type":"image_url","image_url":{"url":"x"}}]}],"stream":true,"model":"q\/w\u00e9","max_completion_tokens":7} `, "q/wé", true, 7, "a\nb\n"+mediaMark("IMAGE", `"x"`)+"\nc")
	f(kindChat, `{"model":"m","messages":[{"role":"user","content":null}],"stream":null,"max_tokens":null}`, "m", false, -1, "")
	f(kindChat, `{"model":"m","messages":[{"role":"user","content":"\ud83d\ude00"}]}`, "m", false, -1, "😀")
	f(kindCompletion, `{"model":"m","prompt":"once upon","max_tokens":0}`, "m", false, 0, "once upon")
	// max_completion_tokens wins unless it is 0 ("max_completion_tokens or
	// max_tokens" in vLLM).
	f(kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"max_completion_tokens":3}`, "m", false, 3, "hi")
	f(kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"max_completion_tokens":0}`, "m", false, 9, "hi")
	f(kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, "m", false, -1, "hi")
	// Read as vLLM's lax int reads it: 100.0, 1e2 and "100" are 100.
	for _, v := range []string{`100.0`, `1e2`, `"100"`, `" +100 "`, `"1_00"`} {
		f(kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":`+v+`}`, "m", false, 100, "hi")
		f(kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":`+v+`}`, "m", false, 100, "hi")
	}
	f(kindCompletion, `{"model":"m","prompt":["a","b"]}`, "m", false, -1, "a\nb")
	f(kindCompletion, `{"model":"m","prompt":[1,2,3]}`, "m", false, -1, "")

	var b reqBody
	if err := b.parse([]byte(`{"model":"m","prompt":[5,6,7,8]}`), kindCompletion); err != nil || len(b.tokenIDs) != 4 || b.estimateTokens() != 4 {
		t.Fatalf("token prompt: %v %v", err, b.tokenIDs)
	}
	// stream_options read as vLLM reads them: include_usage defaults to
	// true, the last copy of each key counts
	for opts, want := range map[string]bool{
		`{"include_usage":true}`: true, `{}`: true, `{"continuous_usage_stats":true}`: true, `{"include_usage":"yes"}`: true,
		`{"include_usage":null}`: false, `{"include_usage":false}`: false, `null`: false,
		`{"include_usage":true,"include_usage":false}`: false, `{"include_usage":false},"stream_options":{}`: true,
		`{},"stream_options":null`: false,
	} {
		if err := b.parse([]byte(`{"model":"m","stream":true,"stream_options":`+opts+`,"prompt":"x"}`), kindCompletion); err != nil || b.includeUsage != want {
			t.Errorf("stream_options %s: include_usage %v, want %v (%v)", opts, b.includeUsage, want, err)
		}
	}

	bad := func(kind int, in string, want error) {
		t.Helper()
		var b reqBody
		if err := b.parse([]byte(in), kind); err != want {
			t.Fatalf("parse(%q) = %v, want %v", in, err, want)
		}
	}
	bad(kindChat, ``, errMalformedJSON)
	bad(kindChat, `{"model":"m",}`, errMalformedJSON)
	bad(kindChat, `{"model":"m" "x":1}`, errMalformedJSON)
	bad(kindChat, `{"model":"\x"}`, errMalformedJSON)
	bad(kindChat, "{\"model\":\"a\x01\"}", errMalformedJSON)
	bad(kindChat, `{"model":"m","n":01}`, errMalformedJSON)
	bad(kindChat, `{"model":"m","n":1.}`, errMalformedJSON)
	bad(kindChat, `{"model":"m","n":tru}`, errMalformedJSON)
	bad(kindChat, `{"model":"m"}{}`, errMalformedJSON)
	bad(kindChat, strings.Repeat("[", 300)+strings.Repeat("]", 300), errMalformedJSON)
	bad(kindChat, `"str"`, errNotObject)
	bad(kindChat, `{"messages":[{"role":"user","content":"x"}]}`, errNoModel)
	bad(kindChat, `{"model":null,"messages":[]}`, errModelType)
	bad(kindChat, `{"model":"m","messages":[1]}`, errMessages)
	bad(kindChat, `{"model":"m","messages":{}}`, errNoMessages)
	bad(kindChat, `{"model":"m","max_tokens":1.5,"messages":[{}]}`, errMaxTokens)
	bad(kindChat, `{"model":"m","max_tokens":"1.5","messages":[{}]}`, errMaxTokens)
	bad(kindChat, `{"model":"m","max_tokens":-1,"messages":[{}]}`, errMaxTokens)
	bad(kindChat, `{"model":"m","max_tokens":"x","messages":[{}]}`, errMaxTokens)
	bad(kindChat, `{"model":"m","max_tokens":true,"messages":[{}]}`, errMaxTokens)
	bad(kindChat, `{"model":"m","stream":2,"messages":[{}]}`, errStreamType)
	bad(kindCompletion, `{"model":"m","prompt":[1,"a"]}`, errPromptType)
	bad(kindCompletion, `{"model":"m","prompt":[-1]}`, errPromptType)
	bad(kindCompletion, `{"model":"m","prompt":true}`, errPromptType)
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", "q\"b\\s", "ctl\x00\x1f\n\t\r", "é😀", "bad\xff utf8"} {
		out := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, out, err)
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); back != want {
			t.Fatalf("%q round-tripped to %q", s, back)
		}
	}
}

// parseInt reads what strconv.ParseInt reads, bounded to [0, 1<<31].
func TestParseIntIsStrconvBounded(t *testing.T) {
	ins := []string{"", "-", "+", "0", "-0", "+0", "00", "7", "+7", "-7", "42", "2147483647", "2147483648", "2147483649",
		"-2147483648", "4294967296", "99999999999999999999", "9223372036854775807", "9223372036854775808",
		"1.0", "1e3", "0x10", "1_000", " 5", "5 ", "٣", "12a", "a12", "--1", "+-1", `"4"`, "null", "true"}
	for n := 1; n < 1<<40; n = n*3 + 1 {
		ins = append(ins, strconv.Itoa(n), strconv.Itoa(n-1), "-"+strconv.Itoa(n))
	}
	for _, in := range ins {
		want, err := strconv.ParseInt(in, 10, 64)
		wantOK := err == nil && want >= 0 && want <= 1<<31
		if !wantOK {
			want = 0
		}
		if got, ok := parseInt([]byte(in)); ok != wantOK || got != int(want) {
			t.Errorf("parseInt(%q) = %d, %v; strconv: %d, %v", in, got, ok, want, wantOK)
		}
	}
}

// FuzzParseBody checks the hand-written scanner against encoding/json: it
// never panics, accepts exactly the valid JSON documents (up to its depth
// limit), and extracts the same model string.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		chatBody, streamBody,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m\u00e9","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","messages":[{"content":"\ud83d\ude00"}],"max_tokens":5,"stream":false}`,
		`{"a":[1,-2.5e+3,true,false,null,{"b":"c"}]}`,
		`{"model":"m",}`, `[`, `"`, `{"model":"\u12"}`,
		`{"model":"m","prompt":["a","b"],"n":3,"best_of":5}`,
		embedBody, `{"model":"m","input":[[1,2],[3]],"dimensions":8}`, `{"model":"m","input":[1,2,3],"encoding_format":null}`,
		`{"model":"m","input":""}`, `{"model":"m","input":[[]]}`, `{"model":"m","input":["a",1]}`,
		rerankBody, scoreBody, `{"model":"m","text_1":["a","b"],"text_2":["c","d"]}`, `{"model":"m","query":"q","documents":[{"text":"d"}],"top_n":null}`,
		`{"model":"m","prompt_embeds":["AA","BB"],"prompt":null}`, `{"model":"m","prompt_embeds":"AA","prompt":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b reqBody
		for _, kind := range []int{kindChat, kindCompletion, kindEmbeddings, kindRerank, kindScore} {
			err := b.parse(data, kind)
			// We also reject invalid UTF-8, which encoding/json tolerates.
			valid := json.Valid(data) && utf8.Valid(data)
			if err == errMalformedJSON {
				if valid && !strings.Contains(string(data), strings.Repeat("[", 200)) && !deep(data) {
					t.Fatalf("valid JSON rejected as malformed: %q", data)
				}
				continue
			}
			if !valid {
				t.Fatalf("invalid JSON accepted (err=%v): %q", err, data)
			}
			if err == nil {
				var v struct {
					Model string `json:"model"`
				}
				if json.Unmarshal(data, &v) == nil && v.Model != string(b.model) {
					// encoding/json keeps the last duplicate key; so do we.
					t.Fatalf("model %q, encoding/json says %q", b.model, v.Model)
				}
				if want, ok := engineChatText(data); kind == kindChat && ok && string(b.text) != want {
					t.Fatalf("chat text %q, the engine reads %q: %q", b.text, want, data)
				}
				if g := b.generations(); g < 1 || g > 1<<20 {
					t.Fatalf("generations %d out of [1, 2^20]: %q", g, data)
				}
				if kind == kindEmbeddings && !validEmbeddingInput(data) {
					t.Fatalf("an embeddings body with an input OpenAI refuses was accepted: %q", data)
				}
			}
		}
	})
}

// engineChatText is the reference for a chat's prompt text, written with
// encoding/json (exact keys, the last of duplicates): the messages'
// contents each after a "\n" unless the text is still empty, a content array flattened as vLLM's chat_utils
// flattens it (its plain strings and the texts of its text part types,
// the non-empty ones joined by "\n"; an array with no text adds nothing).
func engineChatText(data []byte) (string, bool) {
	var body map[string]json.RawMessage
	if json.Unmarshal(data, &body) != nil {
		return "", false
	}
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(body["messages"], &msgs) != nil {
		return "", false
	}
	var out []byte
	add := func(s string) { // after a '\n' unless nothing came before
		if len(out) > 0 {
			out = append(out, '\n')
		}
		out = append(out, s...)
	}
	for _, m := range msgs {
		c := bytes.TrimSpace(m["content"])
		var s string
		if len(c) > 0 && c[0] == '"' && json.Unmarshal(c, &s) == nil {
			add(s)
			continue
		}
		var parts []json.RawMessage
		if len(c) == 0 || c[0] != '[' || json.Unmarshal(c, &parts) != nil {
			continue
		}
		var texts, marks []string
		for _, p := range parts {
			p = bytes.TrimSpace(p)
			if m := engineMediaMark(p); m != "" {
				if strings.HasPrefix(m, "<##PROMPT_EMBEDS") {
					texts = append(texts, m) // in its place
				} else {
					marks = append(marks, m) // before the text
				}
				continue
			}
			if p[0] == '"' {
				if json.Unmarshal(p, &s) == nil && s != "" {
					texts = append(texts, s)
				}
				continue
			}
			var part map[string]json.RawMessage
			if json.Unmarshal(p, &part) != nil {
				continue
			}
			var typ string
			t := bytes.TrimSpace(part["type"])
			if u := bytes.TrimSpace(part["uuid"]); len(t) == 0 || string(t) == "null" || len(u) > 0 && string(u) != "null" {
				// Read by its keys: a media part (no text), else a
				// tool_reference one.
				typ = "tool_reference"
				for _, k := range []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "video_url"} {
					if _, ok := part[k]; ok {
						typ = ""
					}
				}
				if v := bytes.TrimSpace(part["input_audio"]); len(v) > 0 && string(v) != "null" {
					typ = ""
				}
				if _, ok := part["tool_reference"]; !ok {
					typ = ""
				}
			} else if t[0] != '"' || json.Unmarshal(t, &typ) != nil {
				continue
			}
			key := map[string]string{"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking", "tool_reference": "name"}[typ]
			if v := bytes.TrimSpace(part[key]); key != "" && len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil && s != "" {
				texts = append(texts, s)
			}
		}
		if len(marks)+len(texts) > 0 {
			add(strings.Join(append(marks, texts...), "\n"))
		}
	}
	return string(out), true
}

// engineMediaMark is the reference for a media content part's marker in
// the routing text: "" for a part that is not media, else
// "<##IMAGE:%016x##>" (AUDIO, VIDEO, PROMPT_EMBEDS) with the xxh3 hash of
// what names the media: the part's uuid when not null, else a
// prompt_embeds part's data, else the value of its media key (the first
// of vLLM's keys for a part read by its keys), or that value's url when it
// is an object holding one. Written with encoding/json.
func engineMediaMark(p []byte) string {
	var part map[string]json.RawMessage
	if len(p) == 0 || p[0] != '{' || json.Unmarshal(p, &part) != nil {
		return ""
	}
	keys := []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url"}
	kinds := map[string]string{"image_url": "IMAGE", "input_image": "IMAGE", "image_pil": "IMAGE", "image_embeds": "IMAGE",
		"audio_embeds": "AUDIO", "audio_url": "AUDIO", "input_audio": "AUDIO", "video_url": "VIDEO", "prompt_embeds": "PROMPT_EMBEDS"}
	uuid := bytes.TrimSpace(part["uuid"])
	byUUID := len(uuid) > 0 && string(uuid) != "null"
	t := bytes.TrimSpace(part["type"])
	var key string
	if len(t) == 0 || string(t) == "null" || byUUID {
		for _, k := range keys {
			if v, ok := part[k]; ok && (k != "input_audio" || string(bytes.TrimSpace(v)) != "null") {
				key = k
				break
			}
		}
	} else {
		var typ string
		if json.Unmarshal(t, &typ) == nil && kinds[typ] != "" {
			key = typ
		}
	}
	if key == "" {
		return ""
	}
	kind := kinds[key]
	if key == "input_image" {
		key = "image_url"
	}
	id := bytes.TrimSpace(part[key])
	switch {
	case byUUID:
		id = uuid
	case kind == "PROMPT_EMBEDS":
		id = bytes.TrimSpace(part["data"])
	case len(id) > 0 && id[0] == '{':
		var o map[string]json.RawMessage
		if json.Unmarshal(id, &o) == nil && o["url"] != nil {
			id = bytes.TrimSpace(o["url"])
		}
	}
	return fmt.Sprintf("<##%s:%016x##>", kind, xxh3.Hash(id))
}

func deep(d []byte) bool {
	depth, max := 0, 0
	for _, c := range d {
		switch c {
		case '[', '{':
			depth++
			if depth > max {
				max = depth
			}
		case ']', '}':
			depth--
		}
	}
	return max >= maxDepth
}

// FuzzStreamUsageInsertMatchesAReparse checks the shortcut for a stream
// with no stream_options: the body it writes is protocol.EnsureStreamUsage's,
// and the parse it moves equals a parse of that body.
func FuzzStreamUsageInsertMatchesAReparse(f *testing.F) {
	for _, s := range []string{
		streamBody,
		` {"model":"m\u00e9","stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true,"model":"m","max_tokens":3}`,
		`{"model":"m","stream":true,"prompt":"abc"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, kind := range []int{kindChat, kindCompletion} {
			var got, want reqBody
			if got.parse(data, kind) != nil || !got.stream || got.streamOpts {
				continue
			}
			out := got.insertStreamUsage(nil, data)
			ref, asked, err := protocol.EnsureStreamUsage(nil, data)
			if err != nil || asked || !bytes.Equal(out, ref) {
				t.Fatalf("body %q:\ninsert: %q\nEnsureStreamUsage: %q (asked %v, %v)", data, out, ref, asked, err)
			}
			if err := want.parse(out, kind); err != nil {
				t.Fatalf("the rewritten body %q does not parse: %v", out, err)
			}
			g, w := got, want
			if !bytes.Equal(g.model, w.model) || !bytes.Equal(g.text, w.text) || !slices.Equal(g.tokenIDs, w.tokenIDs) {
				t.Fatalf("body %q: model/text/ids differ: %q %q %v vs %q %q %v", data, g.model, g.text, g.tokenIDs, w.model, w.text, w.tokenIDs)
			}
			if len(g.model) > 0 && len(g.modelBuf) == 0 && &g.model[0] != &out[g.modelStart+1] {
				t.Fatalf("body %q: the model does not point into the new body", data)
			}
			g.model, w.model, g.modelBuf, w.modelBuf, g.text, w.text, g.tokenIDs, w.tokenIDs = nil, nil, nil, nil, nil, nil, nil, nil
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("body %q:\nmoved parse %+v\nreparse     %+v", data, g, w)
			}
		}
	})
}

// The parse locates the fields of the first maxRouteMessages messages only
// (routing renders no more) and weighs the rest, so a body of a million
// small messages does not cost a million spans.
func TestParseLocatesAtMostMaxRouteMessages(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[`)
	const n = 5000
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"hi"}`)
	}
	b.WriteString(`]}`)
	var rb reqBody
	if err := rb.parse([]byte(b.String()), kindChat); err != nil {
		t.Fatal(err)
	}
	if rb.nMessages != n || len(rb.msgSpans) != maxRouteMessages {
		t.Fatalf("%d messages, %d located; want %d, %d", rb.nMessages, len(rb.msgSpans), n, maxRouteMessages)
	}
	if want := (n - maxRouteMessages) * (1 + len(`"hi"`)); rb.restSize != want {
		t.Fatalf("rest weighs %d, want %d", rb.restSize, want)
	}
}

// A request's large buffers go with it: the pool keeps only small ones, so
// a burst of big prompts does not pin memory.
func TestResetDropsLargeBuffersAndKeepsSmallOnes(t *testing.T) {
	rs := &reqState{}
	big, small := 1<<20, 1<<10
	rs.tokens, rs.render, rs.arena = make([]uint32, big), make([]byte, big), make([]byte, big)
	rs.rewrite, rs.scratchOut, rs.msgs = make([]byte, big), make([]byte, big), make([]tokenizer.Message, 2*maxRouteMessages)
	rs.parsed.text, rs.parsed.tokenIDs = make([]byte, big), make([]uint32, big)
	rs.Reset()
	if cap(rs.tokens)+cap(rs.render)+cap(rs.arena)+cap(rs.rewrite)+cap(rs.scratchOut)+cap(rs.msgs)+cap(rs.parsed.text)+cap(rs.parsed.tokenIDs) != 0 {
		t.Fatal("a large buffer was kept for the next request")
	}
	rs.render, rs.tokens = make([]byte, small), make([]uint32, small)
	rs.Reset()
	if cap(rs.render) != small || cap(rs.tokens) != small || len(rs.render)+len(rs.tokens) != 0 {
		t.Fatal("small buffers are not kept (emptied) for the next request")
	}
}

// generations counts what the engine generates: each choice (the larger of
// n and best_of) of each prompt of a batch.
func TestParseCountsTheGenerationsOfABody(t *testing.T) {
	for _, tc := range []struct {
		kind int
		body string
		want int
	}{
		{kindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindChat, `{"model":"m","n":3,"messages":[{"role":"user","content":"hi"}]}`, 3},
		{kindChat, `{"model":"m","n":0,"messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindChat, `{"model":"m","n":"x","messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindCompletion, `{"model":"m","prompt":"once"}`, 1},
		{kindCompletion, `{"model":"m","prompt":["a","b","c"],"n":2}`, 6},
		{kindCompletion, `{"model":"m","prompt":[[1,2],[3]],"best_of":3,"n":2}`, 6},
		{kindCompletion, `{"model":"m","prompt":[1,2,3],"n":4}`, 4},
		{kindCompletion, `{"model":"m","prompt":["a"],"n":99999999}`, 1 << 16},
		// A repeated n or best_of counts by its last copy, as the
		// engine's JSON decoder keeps it.
		{kindChat, `{"model":"m","n":5,"n":1,"messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindChat, `{"model":"m","n":5,"n":null,"messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindCompletion, `{"model":"m","prompt":"p","best_of":4,"n":2,"best_of":2}`, 2},
		{kindCompletion, `{"model":"m","prompt":"p","n":1,"n":3}`, 3},
		// An n or best_of written otherwise than as an integer counts
		// as the engine's lax int reads it.
		{kindChat, `{"model":"m","n":3.0,"messages":[{"role":"user","content":"hi"}]}`, 3},
		{kindChat, `{"model":"m","n":"3","messages":[{"role":"user","content":"hi"}]}`, 3},
		{kindChat, `{"model":"m","n":" +3.00 ","messages":[{"role":"user","content":"hi"}]}`, 3},
		{kindCompletion, `{"model":"m","prompt":"p","best_of":4e0}`, 4},
		{kindCompletion, `{"model":"m","prompt":"p","best_of":1e300}`, 1 << 16},
		{kindChat, `{"model":"m","n":"-3","messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindChat, `{"model":"m","n":3.5,"messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindChat, `{"model":"m","n":"3.5","messages":[{"role":"user","content":"hi"}]}`, 1},
		{kindChat, `{"model":"m","n":"_3","messages":[{"role":"user","content":"hi"}]}`, 1},
		// vLLM's prompt_embeds (base64 tensors) are prompts too, with
		// or instead of prompt.
		{kindCompletion, `{"model":"m","prompt_embeds":"AAAA"}`, 1},
		{kindCompletion, `{"model":"m","prompt_embeds":["AAAA","BBBB"],"n":2}`, 4},
		{kindCompletion, `{"model":"m","prompt":null,"prompt_embeds":["AAAA"]}`, 1},
		{kindCompletion, `{"model":"m","prompt":["a","b"],"prompt_embeds":["AAAA"]}`, 3},
		{kindCompletion, `{"model":"m","prompt":"a","prompt_embeds":null}`, 1},
	} {
		var b reqBody
		if err := b.parse([]byte(tc.body), tc.kind); err != nil {
			t.Fatalf("parse(%s): %v", tc.body, err)
		}
		if got := b.generations(); got != tc.want {
			t.Errorf("generations(%s) = %d, want %d", tc.body, got, tc.want)
		}
	}
}

// validEmbeddingInput is the embeddings input check written with
// encoding/json: a non-empty string; or a non-empty array of non-empty
// strings (at most maxEmbeddingInputs), of token ids, or of non-empty
// token-id arrays (at most maxEmbeddingInputs).
func validEmbeddingInput(data []byte) bool {
	var v struct {
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(data, &v) != nil {
		return false
	}
	id := func(m json.RawMessage) bool {
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(m))
		d.UseNumber()
		if d.Decode(&n) != nil {
			return false
		}
		i, err := strconv.ParseInt(n.String(), 10, 64)
		return err == nil && i >= 0 && i <= 1<<31
	}
	var str string
	if json.Unmarshal(v.Input, &str) == nil {
		return str != ""
	}
	var items []json.RawMessage
	if json.Unmarshal(v.Input, &items) != nil || len(items) == 0 {
		return false
	}
	if json.Unmarshal(items[0], &str) == nil {
		for _, it := range items {
			if json.Unmarshal(it, &str) != nil || str == "" {
				return false
			}
		}
		return len(items) <= maxEmbeddingInputs
	}
	var inner []json.RawMessage
	if json.Unmarshal(items[0], &inner) == nil {
		for _, it := range items {
			if json.Unmarshal(it, &inner) != nil || len(inner) == 0 {
				return false
			}
			for _, x := range inner {
				if !id(x) {
					return false
				}
			}
		}
		return len(items) <= maxEmbeddingInputs
	}
	for _, it := range items {
		if !id(it) {
			return false
		}
	}
	return true
}

func TestATokenIDPromptKeepsItsLeadingIDsAndCountsAll(t *testing.T) {
	const n = maxRouteIDs + 1000
	var b reqBody
	body := `{"model":"m","prompt":[` + strings.Repeat("3,", n-1) + `4]}`
	if err := b.parse([]byte(body), kindCompletion); err != nil {
		t.Fatal(err)
	}
	if len(b.tokenIDs) != maxRouteIDs || b.estimateTokens() != n {
		t.Fatalf("kept %d ids, counted %d; want %d and %d", len(b.tokenIDs), b.estimateTokens(), maxRouteIDs, n)
	}
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	rs := &reqState{parsed: b}
	if err := r.srv.tokenize(rs, []byte(body), kindCompletion); err != nil {
		t.Fatal(err)
	}
	if got := rs.promptTokens(); len(rs.tokens) != maxRouteIDs || got != n {
		t.Fatalf("promptTokens = %d, want %d", got, n)
	}
}

// The text routing reads from a chat (prefix hashing, the token estimate,
// smart model selection's classifier) is the text the engine reads from
// its contents: vLLM's chat_utils takes the text of its text part types
// only ("text", "input_text" and "output_text" their "text", "refusal" its
// "refusal", "thinking" its "thinking"), the last of duplicate keys, and
// joins the non-empty ones with "\n"; a media part's stray "text" is not
// read.
func TestChatTextIsTheTextTheEngineReadsFromContentParts(t *testing.T) {
	f := func(messages, want string) {
		t.Helper()
		var b reqBody
		if err := b.parse([]byte(`{"model":"m","messages":`+messages+`}`), kindChat); err != nil {
			t.Fatalf("parse(%s): %v", messages, err)
		}
		if string(b.text) != want {
			t.Errorf("messages %s: text %q, want %q", messages, b.text, want)
		}
	}
	f(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="},"text":"HIDDEN"},{"type":"text","text":"VISIBLE"}]}]`,
		mediaMark("IMAGE", `"data:image/png;base64,AA=="`)+"\nVISIBLE")
	f(`[{"role":"user","content":[{"type":"input_image","image_url":"http://x/i.png","text":"HIDDEN"},{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"},"text":"HIDDEN"},{"type":"video_url","video_url":{"url":"v"},"text":"HIDDEN"},{"type":"input_text","text":"a"}]}]`,
		mediaMark("IMAGE", `"http://x/i.png"`)+"\n"+mediaMark("AUDIO", `{"data":"AA==","format":"wav"}`)+"\n"+mediaMark("VIDEO", `"v"`)+"\na")
	f(`[{"role":"assistant","content":[{"type":"refusal","refusal":"No.","text":"HIDDEN"}]}]`, "No.")
	f(`[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","text":"HIDDEN"},{"type":"output_text","text":"ok"}]}]`, "hmm\nok")
	f(`[{"role":"user","content":[{"type":"no_such_part","text":"HIDDEN"},{"text":"HIDDEN"},{"type":"text","text":"t"}]}]`, "t")
	f(`[{"role":"user","content":[{"type":"text","text":"HIDDEN","text":"last"}]}]`, "last")
	f(`[{"role":"user","content":[{"type":"image_url","type":"text","text":"shown"},{"type":"text","type":"image_url","text":"HIDDEN","image_url":{"url":"u"}}]}]`, mediaMark("IMAGE", `"u"`)+"\nshown")
	f(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":null},{"type":"refusal","refusal":null},{"type":"text","text":"b"}]}]`, "a\nb")
	f(`[{"role":"user","content":[{"t\u0079pe":"t\u0065xt","te\u0078t":"esc"}]}]`, "esc")
	f(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]},{"role":"user","content":"q"}]`, mediaMark("IMAGE", `"u"`)+"\nq")
	f(`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"u"}]}]`, "s\nu")
}

// mediaMark is a media part's marker in the routing text: the kind and
// the xxh3 hash of the JSON value that names the media.
func mediaMark(kind, id string) string {
	return fmt.Sprintf("<##%s:%016x##>", kind, xxh3.Hash([]byte(id)))
}

// A message that repeats its content key is read as the engine's JSON
// decoder reads it (Python's json, encoding/json): the last copy counts,
// for the prompt text as for the template render.
func TestARepeatedContentKeyIsReadAsItsLastCopy(t *testing.T) {
	f := func(messages, want string) {
		t.Helper()
		var b reqBody
		if err := b.parse([]byte(`{"model":"m","messages":`+messages+`}`), kindChat); err != nil {
			t.Fatalf("parse(%s): %v", messages, err)
		}
		if string(b.text) != want {
			t.Errorf("messages %s: text %q, want %q", messages, b.text, want)
		}
	}
	f(`[{"role":"user","content":"HIDDEN","content":"VISIBLE"}]`, "VISIBLE")
	f(`[{"role":"user","content":[{"type":"text","text":"HIDDEN"}],"content":"VISIBLE"}]`, "VISIBLE")
	f(`[{"role":"user","content":"HIDDEN","role":"user","content":null},{"role":"user","content":"q"}]`, "q")
	f(`[{"content":"HIDDEN","role":"user","c\u006fntent":[{"type":"text","text":"VISIBLE"}]}]`, "VISIBLE")
}

// A chat's routing text marks each media part with what names its media,
// where vLLM puts the media's placeholder in a string content: vLLM caches
// the tokens of an image under the image's hash (its uuid when given), so
// two chats with the same images share the engine's cache up to their
// first difference, and chats with other images share it only up to the
// image. The router dropped media parts from the routing text: a chat with
// another image, or with none, read as the same prompt, and the prefix
// layer sent it after a cache the engine does not have.
func TestAChatsMediaPartsMarkItsRoutingText(t *testing.T) {
	text := func(content string) string {
		t.Helper()
		var b reqBody
		body := `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":` + content + `}]}`
		if err := b.parse([]byte(body), kindChat); err != nil {
			t.Fatalf("%s: %v", content, err)
		}
		return string(b.text)
	}
	imgA, imgB := mediaMark("IMAGE", `"http://x/a.png"`), mediaMark("IMAGE", `"http://x/b.png"`)
	a := text(`[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}]`)
	if want := "sys\n" + imgA + "\ndescribe"; a != want {
		t.Errorf("text %q, want %q (the placeholders first, as vLLM's string content has them)", a, want)
	}
	// The same image, however the part names it: the same text.
	for _, c := range []string{
		`[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"detail":"auto","url":"http://x/a.png"}}]`,
		`[{"type":"text","text":"describe"},{"image_url":"http://x/a.png"}]`,
		`[{"type":"text","text":"describe"},{"type":"input_image","image_url":"http://x/a.png"}]`,
	} {
		if got := text(c); got != a {
			t.Errorf("%s: text %q, want %q", c, got, a)
		}
	}
	// Another image, or none: the text parts at the image.
	if got, want := text(`[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"http://x/b.png"}}]`), "sys\n"+imgB+"\ndescribe"; got != want {
		t.Errorf("another image: text %q, want %q", got, want)
	}
	if got := text(`[{"type":"text","text":"describe"}]`); got != "sys\ndescribe" {
		t.Errorf("no image: text %q", got)
	}
	// A uuid names the media, whatever its source says (vLLM uses it as
	// the media's hash).
	if got, want := text(`[{"type":"image_url","uuid":"img-1","image_url":{"url":"http://x/a.png"}},"describe"]`), "sys\n"+mediaMark("IMAGE", `"img-1"`)+"\ndescribe"; got != want {
		t.Errorf("uuid: text %q, want %q", got, want)
	}
	// Several media, in their order; no text: markers only.
	if got, want := text(`[{"type":"video_url","video_url":{"url":"v"}},{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}]`),
		"sys\n"+mediaMark("VIDEO", `"v"`)+"\n"+mediaMark("AUDIO", `{"data":"AA==","format":"wav"}`); got != want {
		t.Errorf("media only: text %q, want %q", got, want)
	}
	// prompt_embeds stand in their place, as vLLM's "<prompt_embeds>".
	if got, want := text(`["a",{"type":"prompt_embeds","data":"AAAA"},{"image_url":"i"},"b"]`),
		"sys\n"+mediaMark("IMAGE", `"i"`)+"\na\n"+mediaMark("PROMPT_EMBEDS", `"AAAA"`)+"\nb"; got != want {
		t.Errorf("prompt_embeds: text %q, want %q", got, want)
	}
}

func TestACompletionWithPromptEmbedsAloneIsServedAndBadOnesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		body, param string // param: the refusal's, "" when served
	}{
		{`{"model":"m","prompt_embeds":"AAAA"}`, ""},
		{`{"model":"m","prompt_embeds":["AAAA","BBBB"]}`, ""},
		{`{"model":"m","prompt_embeds":5}`, "prompt_embeds"},
		{`{"model":"m","prompt_embeds":["AAAA",5]}`, "prompt_embeds"},
		{`{"model":"m","prompt_embeds":{"a":1}}`, "prompt_embeds"},
		{`{"model":"m","prompt_embeds":"AAAA","prompt_embeds":"BBBB"}`, "prompt_embeds"},
		{`{"model":"m","Prompt_Embeds":"AAAA","prompt":"x"}`, "prompt_embeds"},
		{`{"model":"m","prompt_embeds":[]}`, "prompt"},
		{`{"model":"m","prompt_embeds":null}`, "prompt"},
		{`{"model":"m","prompt":null,"prompt_embeds":[]}`, "prompt"},
	} {
		var b reqBody
		err := b.parse([]byte(tc.body), kindCompletion)
		var br *badRequestError
		switch {
		case tc.param == "" && err != nil:
			t.Errorf("%s: %v, want it served", tc.body, err)
		case tc.param != "" && (!errors.As(err, &br) || br.param != tc.param):
			t.Errorf("%s: %v, want a 400 on %s", tc.body, err, tc.param)
		}
		if tc.param == "" && (len(b.text) != 0 || b.estimateTokens() != 0) {
			t.Errorf("%s: text %q, estimate %d: embeddings have no text", tc.body, b.text, b.estimateTokens())
		}
	}
	// A chat's top-level prompt_embeds is no field of a chat: the engine's business.
	var b reqBody
	if err := b.parse([]byte(`{"model":"m","prompt_embeds":5,"messages":[{"role":"user","content":"hi"}]}`), kindChat); err != nil {
		t.Errorf("chat with prompt_embeds: %v", err)
	}
}
