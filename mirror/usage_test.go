package mirror

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestScanUsageTakesTheTopLevelUsage(t *testing.T) {
	f := func(b string, usage bool, prompt, complete int) {
		t.Helper()
		res := result{prompt: -1, complete: -1}
		scanUsage([]byte(b), &res)
		if !usage {
			if res.usage || res.prompt != -1 || res.complete != -1 {
				t.Fatalf("scanUsage(%s) = %v %d %d, want res unchanged", b, res.usage, res.prompt, res.complete)
			}
			return
		}
		if !res.usage || res.prompt != prompt || res.complete != complete {
			t.Fatalf("scanUsage(%s) = %v %d %d, want %d %d", b, res.usage, res.prompt, res.complete, prompt, complete)
		}
	}
	f(`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`, true, 11, 7)
	f(` { "usage" : { "completion_tokens" : 2 , "prompt_tokens_details" : {"cached_tokens":9}, "prompt_tokens" : 5 } } `, true, 5, 2)
	f(`{"usage":{}}`, true, 0, 0)
	f(`{"usage":{"prompt_tokens":null,"completion_tokens":3}}`, true, 0, 3)
	// The last duplicate wins, as for encoding/json; a null usage is none.
	f(`{"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":2}}`, true, 2, 2)
	f(`{"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":null}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":1,"prompt_tokens":4}}`, true, 4, 0)
	// Nested usage keys and the word in strings are not the answer's usage.
	f(`{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":9}"}}],"meta":{"usage":{"prompt_tokens":8}}}`, false, 0, 0)
	f(`{"logprobs":[{"token":"usage","x":{"usage":{"prompt_tokens":7}}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, true, 1, 2)
	f(`{"choices":[],"usage":null}`, false, 0, 0)
	// Counts that are not non-negative integers make the usage invalid.
	f(`{"usage":{"prompt_tokens":-1,"completion_tokens":2}}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":1.5,"completion_tokens":2}}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":1e3,"completion_tokens":2}}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":"1","completion_tokens":2}}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":1234567890123456,"completion_tokens":2}}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":012,"completion_tokens":2}}`, false, 0, 0)
	f(`{"usage":[1]}`, false, 0, 0)
	f(`{"usage":"x"}`, false, 0, 0)
	// Broken documents.
	f(`{"usage":{"prompt_tokens":1,"completion_tokens":2}`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":1,"completion_tokens":2}} x`, false, 0, 0)
	f(`{"usage":{"prompt_tokens":1,"completion_tokens":2},"x":[}`, false, 0, 0)
	f(`{"usage" {"prompt_tokens":1}}`, false, 0, 0)
	f(`{"a":"unterminated, "usage":{"prompt_tokens":1}}`, false, 0, 0)
	f(`[{"usage":{"prompt_tokens":1}}]`, false, 0, 0)
	f(`data: [DONE]`, false, 0, 0)
	f(``, false, 0, 0)
}

// refUsage is the reference for FuzzScanUsage: encoding/json's tokens,
// keys matched exactly, counts that are integers of at most
// maxTokenDigits digits; the last "usage" member wins (the last count
// within it), and any invalid one voids the usage, as a type error voids
// encoding/json's Unmarshal.
func refUsage(b []byte) (usage bool, prompt, complete int) {
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
	count := func(v json.RawMessage) (int, bool) {
		if string(v) == "null" {
			return 0, true
		}
		if len(v) == 0 || len(v) > maxTokenDigits || len(v) > 1 && v[0] == '0' {
			return 0, false
		}
		n := 0
		for _, c := range v {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	ok := members(b, func(k string, v json.RawMessage) bool {
		if k != "usage" {
			return true
		}
		if string(v) == "null" {
			usage, prompt, complete = false, 0, 0
			return true
		}
		var p, c int
		valid := members(v, func(k string, v json.RawMessage) bool {
			var ok bool
			switch k {
			case "prompt_tokens":
				p, ok = count(v)
			case "completion_tokens":
				c, ok = count(v)
			default:
				ok = true
			}
			return ok
		})
		usage, prompt, complete = true, p, c
		return valid
	})
	if !ok {
		return false, 0, 0
	}
	return usage, prompt, complete
}

// The target model replaces every top-level "model" member, keys compared
// as a JSON decoder decodes them; a body the scan cannot walk is left as
// it is.
func TestReplaceModelDecodesKeysAsJSONDoes(t *testing.T) {
	f := func(body, want string) {
		t.Helper()
		dst := []byte("prefix:")
		if got := string(replaceModelQuoted(dst, []byte(body), []byte(`"v2"`))); got != "prefix:"+want {
			t.Fatalf("replaceModelQuoted(%s)\n got %s\nwant prefix:%s", body, got, want)
		}
	}
	f(`{"\u006d\u006f\u0064\u0065\u006c":"a"}`, `{"\u006d\u006f\u0064\u0065\u006c":"v2"}`)
	f(`{"mode\u006C":{"x":[1,{"model":2}]},"y":1}`, `{"mode\u006C":"v2","y":1}`)
	f(`{"\ud83d\ude00":1,"model":2,"\ud800":3,"\ud800\u0041":4}`, `{"\ud83d\ude00":1,"model":"v2","\ud800":3,"\ud800\u0041":4}`)
	f(`{"model\u0000":"a","Model":"b","mode":"c","models":"d"}`, `{"model\u0000":"a","Model":"b","mode":"c","models":"d"}`)
	f(`{"m\odel":"a"}`, `{"m\odel":"a"}`)
	f(`{"model":"a"} x`, `{"model":"a"} x`)
	f(`{"model":"a",}`, `{"model":"a",}`)
	f(`{"model" "a"}`, `{"model" "a"}`)
	f(`{"model":["a"}`, `{"model":["a"}`)
	f(`{}`, `{}`)
	f(``, ``)
}

func TestScanAPIUsage(t *testing.T) {
	f := func(b string, usage bool, prompt, complete int) {
		t.Helper()
		for _, api := range []apiKind{apiMessages, apiResponses} {
			res := result{prompt: -1, complete: -1, api: api}
			scanAPIUsage([]byte(b), &res)
			if res.usage != usage || res.prompt != prompt || res.complete != complete {
				t.Fatalf("scanAPIUsage(%s) as %d = %v %d %d, want %v %d %d", b, api, res.usage, res.prompt, res.complete, usage, prompt, complete)
			}
		}
	}
	f(`{"usage":{"input_tokens":12,"output_tokens":6}}`, true, 12, 6)
	f(`{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}`, true, 25, 1)
	f(`{"type":"message_delta","delta":{},"usage":{"output_tokens":15}}`, true, -1, 15) // input left as it was
	f(`{"type":"response.completed","response":{"output":[{"usage":{"input_tokens":1}}],"usage":{"input_tokens":33,"input_tokens_details":{"cached_tokens":2},"output_tokens":9}}}`, true, 33, 9)
	f(`{"response":{"usage":null}}`, false, -1, -1)
	f(`{"message":{"usage":{"output_tokens":null}}}`, false, -1, -1)             // null is absent
	f(`{"usage":{"input_tokens":null,"output_tokens":4}}`, true, -1, 4)          // null leaves input
	f(`{"usage":{"input_tokens":3},"usage":{"input_tokens":null}}`, true, 3, -1) // last count wins
	f(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`, false, -1, -1)      // not this API's names
	f(`{"a":{"message":{"usage":{"input_tokens":5}}}}`, false, -1, -1)           // deeper than message/response
	f(`{"usage":{"input_tokens":12,"output_tokens":6}`, false, -1, -1)           // cut short
	f(`{"usage":{"input_tokens":1.5,"output_tokens":6}}`, false, -1, -1)         // not a count
	f(`{"usage":{"input_tokens":12,"output_tokens":6}} x`, false, -1, -1)        // trailing bytes
	f(`{"text":"\"usage\":{\"input_tokens\":9}"}`, false, -1, -1)                // in a string
}

// A Messages usage's input is Anthropic's total input: input_tokens plus
// cache_creation_input_tokens plus cache_read_input_tokens. In a stream
// each event sets the parts it carries (message_start all of them,
// message_delta its cumulative counts when not null), the others keep
// their last value. Responses has no such fields: its input_tokens already
// includes the cached tokens.
func TestScanAPIUsageCountsAnthropicCacheTokensAsInput(t *testing.T) {
	f := func(api apiKind, events []string, usage bool, prompt, complete int) {
		t.Helper()
		res := result{api: api}
		for _, e := range events {
			scanAPIUsage([]byte(e), &res)
		}
		if res.usage != usage || res.prompt != prompt || res.complete != complete {
			t.Fatalf("scanAPIUsage(%q) = %v %d %d, want %v %d %d", events, res.usage, res.prompt, res.complete, usage, prompt, complete)
		}
	}
	// A whole answer.
	f(apiMessages, []string{`{"id":"msg_1","type":"message","usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":300,"cache_creation":{"ephemeral_5m_input_tokens":100,"ephemeral_1h_input_tokens":0},"output_tokens":6}}`}, true, 412, 6)
	// message_start, then a message_delta with the output only (its
	// input counts absent or null).
	start := `{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":4,"cache_creation_input_tokens":900,"cache_read_input_tokens":40,"output_tokens":1}}}`
	f(apiMessages, []string{start, `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`}, true, 944, 15)
	f(apiMessages, []string{start, `{"type":"message_delta","usage":{"input_tokens":null,"cache_creation_input_tokens":null,"cache_read_input_tokens":null,"output_tokens":15}}`}, true, 944, 15)
	// A message_delta with cumulative input counts: they replace
	// message_start's, part by part.
	f(apiMessages, []string{start, `{"type":"message_delta","usage":{"input_tokens":5,"cache_creation_input_tokens":900,"cache_read_input_tokens":40,"output_tokens":15}}`}, true, 945, 15)
	f(apiMessages, []string{start, `{"type":"message_delta","usage":{"cache_read_input_tokens":60,"output_tokens":15}}`}, true, 964, 15)
	// Cache counts alone are input too; null ones are absent.
	f(apiMessages, []string{`{"usage":{"cache_read_input_tokens":7}}`}, true, 7, 0)
	f(apiMessages, []string{`{"usage":{"cache_read_input_tokens":null,"cache_creation_input_tokens":null}}`}, false, 0, 0)
	// An invalid cache count voids the usage object, as an invalid
	// input_tokens does.
	f(apiMessages, []string{`{"usage":{"input_tokens":3,"cache_read_input_tokens":-1,"output_tokens":2}}`}, false, 0, 0)
	f(apiMessages, []string{`{"usage":{"input_tokens":3,"cache_read_input_tokens":"9","output_tokens":2}}`}, false, 0, 0)
	// Nested deeper than usage: not counted.
	f(apiMessages, []string{`{"usage":{"input_tokens":3,"cache_creation":{"cache_read_input_tokens":9},"output_tokens":2}}`}, true, 3, 2)
	// Responses: input_tokens is the whole input; the Anthropic names are
	// not its fields.
	f(apiResponses, []string{`{"type":"response.completed","response":{"usage":{"input_tokens":33,"input_tokens_details":{"cached_tokens":20},"cache_read_input_tokens":20,"output_tokens":9}}}`}, true, 33, 9)
	f(apiResponses, []string{`{"usage":{"input_tokens":3,"cache_read_input_tokens":"x","output_tokens":2}}`}, true, 3, 2)
}
