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
