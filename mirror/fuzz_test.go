package mirror

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// FuzzReplaceModel: for a JSON object, the result is a JSON object equal
// to the input except for a top-level "model" set to the target model;
// anything else never panics.
func FuzzReplaceModel(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), "canary")
	f.Add([]byte(`{"a":{"model":"x"},"mod\u0065l":1,"model":null}`), "q\"x")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out := replaceModel(nil, body, model)
		var in map[string]any
		if json.Unmarshal(body, &in) != nil || in == nil {
			return
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("replaceModel(%q) = %q: %v", body, out, err)
		}
		if _, had := in["model"]; had {
			// encoding/json replaces invalid UTF-8 with U+FFFD on both sides.
			want, _ := json.Marshal(model)
			var wantS string
			json.Unmarshal(want, &wantS)
			if got["model"] != wantS {
				t.Fatalf("model %q, want %q (body %q)", got["model"], wantS, out)
			}
			in["model"] = wantS
		}
		if !reflect.DeepEqual(in, got) {
			t.Fatalf("replaceModel changed more than the model:\n in %q\nout %q", body, out)
		}
	})
}

// FuzzReadStream: any answer bytes are read to the end without panicking;
// events never exceed the lines.
func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: x\r\ndata:{\"usage\":null}\r\n\r\n: comment\ndata"))
	m := &Mirror{opts: Options{MaxResponseBytes: 1 << 16}}
	f.Fuzz(func(t *testing.T, b []byte) {
		var res result
		s := acquireSender()
		defer releaseSender(s)
		m.readStream(s, bytes.NewReader(b), &keeper{m: m, budget: 1 << 30}, time.Now(), &res)
		if res.err != nil {
			t.Fatalf("error %v on an in-memory reader", res.err)
		}
		if res.bytes != int64(len(b)) {
			t.Fatalf("read %d of %d bytes", res.bytes, len(b))
		}
		if res.events > bytes.Count(b, []byte("\n"))+1 {
			t.Fatalf("%d events in %d lines", res.events, bytes.Count(b, []byte("\n"))+1)
		}
		if res.prompt < 0 || res.complete < 0 {
			t.Fatalf("negative token counts %d %d would wrap the counters", res.prompt, res.complete)
		}
	})
}

// FuzzScanUsage: on any bytes scanUsage never panics and never reports a
// negative count; on a valid JSON object whose keys hold no escape (the
// scan matches keys as written) it agrees with the reference decoder.
func FuzzScanUsage(f *testing.F) {
	f.Add([]byte(`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1},"usage":null,"meta":{"usage":{"completion_tokens":2}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens_details":{"cached_tokens":3},"completion_tokens":012}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var res result
		scanUsage(b, &res)
		if res.prompt < 0 || res.complete < 0 || !res.usage && (res.prompt != 0 || res.complete != 0) {
			t.Fatalf("scanUsage(%q) = %v %d %d", b, res.usage, res.prompt, res.complete)
		}
		if !json.Valid(b) || bytes.IndexByte(b, '\\') >= 0 {
			return
		}
		usage, prompt, complete := refUsage(b)
		if res.usage != usage || res.prompt != prompt || res.complete != complete {
			t.Fatalf("scanUsage(%q) = %v %d %d, reference %v %d %d", b, res.usage, res.prompt, res.complete, usage, prompt, complete)
		}
	})
}

// FuzzScanAPIUsage: on any bytes scanAPIUsage never panics, never
// allocates and never reports a negative count; on a valid JSON object
// whose keys hold no escape it agrees with refAPIUsage, an ordered walk
// with encoding/json, for a Messages answer (messages: cache counts are
// input) and a Responses one.
func FuzzScanAPIUsage(f *testing.F) {
	f.Add([]byte(`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"output_tokens":1}}}`), true)
	f.Add([]byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`), true)
	f.Add([]byte(`{"type":"response.completed","response":{"usage":{"input_tokens":33,"input_tokens_details":{"cached_tokens":2},"output_tokens":9}}}`), false)
	f.Add([]byte(`{"usage":{"input_tokens":1},"message":{"usage":{"input_tokens":2,"output_tokens":null}},"usage":{"output_tokens":3}}`), true)
	f.Add([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":4,"cache_creation_input_tokens":900,"cache_read_input_tokens":40,"output_tokens":1}}}`), true)
	f.Add([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":4,"cache_creation_input_tokens":900,"cache_read_input_tokens":40,"output_tokens":1}}}`), false)
	f.Fuzz(func(t *testing.T, b []byte, messages bool) {
		api := apiResponses
		if messages {
			api = apiMessages
		}
		if n := testing.AllocsPerRun(1, func() { scanAPIUsage(b, &result{api: api}) }); n != 0 {
			t.Fatalf("scanAPIUsage(%q) allocates %v times", b, n)
		}
		res := result{prompt: -1, complete: -1, api: api}
		scanAPIUsage(b, &res)
		if res.prompt < -1 || res.complete < -1 || !res.usage && (res.prompt != -1 || res.complete != -1) {
			t.Fatalf("scanAPIUsage(%q) = %v %d %d", b, res.usage, res.prompt, res.complete)
		}
		if !json.Valid(b) || bytes.IndexByte(b, '\\') >= 0 {
			return
		}
		usage, prompt, complete := refAPIUsage(b, messages, -1, -1)
		if res.usage != usage || res.prompt != prompt || res.complete != complete {
			t.Fatalf("scanAPIUsage(%q, messages %v) = %v %d %d, reference %v %d %d", b, messages, res.usage, res.prompt, res.complete, usage, prompt, complete)
		}
	})
}

// refAPIUsage is scanAPIUsage's reference: it walks the members of b in
// order with encoding/json and lets every "usage" object (top level, or in
// a top-level "message" or "response" object) set the counts it holds, as
// json.Unmarshal into a *int sets it: null leaves the count as it was. The
// prompt is the sum of the input counts seen (input_tokens, and with
// messages cache_creation_input_tokens and cache_read_input_tokens). A
// count that is not a non-negative integer of at most maxTokenDigits
// digits leaves everything as it was.
func refAPIUsage(b []byte, messages bool, prompt, complete int) (bool, int, int) {
	members := func(b []byte, each func(k string, v json.RawMessage) bool) bool {
		dec := json.NewDecoder(bytes.NewReader(b))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return false
		}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return false
			}
			var v json.RawMessage
			if dec.Decode(&v) != nil || !each(tok.(string), v) {
				return false
			}
		}
		return true
	}
	isObj := func(v json.RawMessage) bool { return len(v) > 0 && v[0] == '{' }
	inputs := map[string]bool{"input_tokens": true}
	if messages {
		inputs["cache_creation_input_tokens"] = true
		inputs["cache_read_input_tokens"] = true
	}
	in := map[string]int{} // the input counts seen, by name
	var (
		out    *int
		hasOut bool
	)
	count := func(v json.RawMessage) (*int, bool) {
		if string(v) == "null" {
			return nil, true
		}
		if len(v) == 0 || len(v) > maxTokenDigits || len(v) > 1 && v[0] == '0' || bytes.ContainsAny(v, ".eE-+") {
			return nil, false
		}
		var n int
		if json.Unmarshal(v, &n) != nil {
			return nil, false
		}
		return &n, true
	}
	usage := func(v json.RawMessage) bool {
		return members(v, func(k string, v json.RawMessage) bool {
			switch {
			case inputs[k]:
				n, ok := count(v)
				if n != nil {
					in[k] = *n
				}
				return ok
			case k == "output_tokens":
				n, ok := count(v)
				if n != nil {
					out, hasOut = n, true
				}
				return ok
			}
			return true
		})
	}
	ok := members(b, func(k string, v json.RawMessage) bool {
		switch {
		case !isObj(v):
			return true
		case k == "usage":
			return usage(v)
		case k == "message" || k == "response":
			return members(v, func(k string, v json.RawMessage) bool {
				if k == "usage" && isObj(v) {
					return usage(v)
				}
				return true
			})
		}
		return true
	})
	if !ok || len(in) == 0 && !hasOut {
		return false, prompt, complete
	}
	if len(in) > 0 {
		prompt = 0
		for _, n := range in {
			prompt += n
		}
	}
	if hasOut {
		complete = *out
	}
	return true, prompt, complete
}
