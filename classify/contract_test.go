package classify

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppendRequestEscapesAndCutsAtARuneBoundary(t *testing.T) {
	type req struct {
		Model     string `json:"model"`
		Text      string `json:"text"`
		TextBytes int    `json:"text_bytes"`
	}
	f := func(model, text string, max int, want req) {
		t.Helper()
		b := AppendRequest(nil, []byte(model), []byte(text), max)
		var got req
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("AppendRequest(%q, %q) = %s: not JSON: %v", model, text, b, err)
		}
		if got != want {
			t.Fatalf("AppendRequest(%q, %q, %d) decodes to %+v, want %+v", model, text, max, got, want)
		}
	}
	f("m", "hello", 100, req{"m", "hello", 5})
	f(`q"\`, "a\"b\\c\n\r\t\x00\x1f</script>\u2028", 100, req{`q"\`, "a\"b\\c\n\r\t\x00\x1f</script>\u2028", 22})
	f("m", "0123456789", 4, req{"m", "6789", 10})
	// "é" is 2 bytes: a cut inside it drops the half rune.
	f("m", "aéb", 2, req{"m", "b", 4})
	f("m", "日本語", 7, req{"m", "本語", 9})
	f("m", "日本語", 5, req{"m", "語", 9})
	f("m", "x", 0, req{"m", "", 1})
	// Invalid UTF-8 becomes U+FFFD: the body stays valid JSON.
	f("m\xff", "a\xc3(b", 100, req{"m\ufffd", "a\ufffd(b", 4})
}

func TestParseAnswer(t *testing.T) {
	ok := func(in string, want Tier) {
		t.Helper()
		got, err := ParseAnswer([]byte(in))
		if err != nil || got != want {
			t.Fatalf("ParseAnswer(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	bad := func(in string, want error) {
		t.Helper()
		got, err := ParseAnswer([]byte(in))
		if err != want || got != TierUnknown {
			t.Fatalf("ParseAnswer(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	ok(`{"tier":"L1"}`, TierL1)
	ok(` {"tier":"L2","score":0.7,"why":{"a":[1,2]}}`+"\n", TierL2)
	ok(`{"tier":"l3"}`, TierL3)
	ok(`{"tier":"\u004c3"}`, TierL3) // escaped, as a JSON decoder reads it
	ok(`{"tier":"L4","tier":"L1"}`, TierL1)
	ok(`{"\u0074ier":"L2"}`, TierL2) // an escaped key is the key it decodes to
	ok(`{"a":{"tier":"L1"},"b":["}",{"c":"\"tier\":"}],"tier":"L3","n":-1.5e3,"t":true,"z":null}`, TierL3)
	ok("\n\t{ \"tier\" :\r\n\"L1\" }\n", TierL1)
	bad(``, ErrAnswerNotObject)
	bad(`L1`, ErrAnswerNotObject)
	bad(`"L1"`, ErrAnswerNotObject)
	bad(`[{"tier":"L1"}]`, ErrAnswerNotObject)
	bad(`{"tier":"L1"`, ErrAnswerNotObject)
	bad(`{"tier":"L1"} x`, ErrAnswerNotObject)
	bad(`null`, ErrAnswerNotObject)
	bad(`{"tier":"L1"}`+"\f", ErrAnswerNotObject)
	bad(`{}`, ErrAnswerNoTier)
	bad(`{"TIER":"L2"}`, ErrAnswerNoTier) // keys are exact
	bad(`{"a":{"tier":"L1"}}`, ErrAnswerNoTier)
	bad(`{"tier":"L1","tier":null}`, ErrAnswerNoTier) // the last one decides
	bad(`{"tier":null}`, ErrAnswerNoTier)
	bad(`{"tier":1}`, ErrAnswerNoTier)
	bad(`{"tier":{"x":"L1"}}`, ErrAnswerNoTier)
	bad(`{"tier":"L4"}`, ErrAnswerBadTier)
	bad(`{"tier":""}`, ErrAnswerBadTier)
	bad(`{"tier":"L1 "}`, ErrAnswerBadTier)
	bad(`{"tier":"L1","tier":"hard"}`, ErrAnswerBadTier)
	bad(`{"tier":"L1","x":"`+strings.Repeat("a", MaxAnswerBytes)+`"}`, ErrAnswerTooLarge)
}

// FuzzParseAnswer: the scanner agrees with encoding/json decoding the
// answer into a map (exact keys, last duplicate wins) on every input.
func FuzzParseAnswer(f *testing.F) {
	f.Add([]byte(`{"tier":"L1"}`))
	f.Add([]byte(`{"tier":"\u004c2","x":[null,true,{"y":-1e9}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tier, err := ParseAnswer(b)
		want := TierUnknown
		var m map[string]any
		if len(b) <= MaxAnswerBytes && json.Unmarshal(b, &m) == nil && m != nil {
			if s, ok := m["tier"].(string); ok {
				want = ParseTier(s)
			}
		}
		if tier != want {
			t.Fatalf("ParseAnswer(%q) = %v, %v; encoding/json says %v", b, tier, err, want)
		}
		if (err == nil) != (want != TierUnknown) {
			t.Fatalf("ParseAnswer(%q) = %v, %v", b, tier, err)
		}
	})
}

// FuzzAppendRequest: the request body is valid JSON for any input and
// carries the (cut) text exactly when the text is valid UTF-8.
func FuzzAppendRequest(f *testing.F) {
	f.Add([]byte("model"), []byte("some text é 日本"), 8)
	f.Add([]byte("\x00\"\\"), []byte("\xff\xfe\u2028"), 3)
	f.Fuzz(func(t *testing.T, model, text []byte, max int) {
		if max < 0 {
			max = -max
		}
		b := AppendRequest(nil, model, text, max)
		var got struct {
			Model     string `json:"model"`
			Text      string `json:"text"`
			TextBytes int    `json:"text_bytes"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("body %q is not JSON: %v", b, err)
		}
		if got.TextBytes != len(text) {
			t.Fatalf("text_bytes %d, want %d", got.TextBytes, len(text))
		}
		if utf8.Valid(text) {
			if !strings.HasSuffix(string(text), got.Text) || len(got.Text) > max {
				t.Fatalf("text %q is not a suffix of at most %d bytes of %q", got.Text, max, text)
			}
		}
		if utf8.Valid(model) && got.Model != string(model) {
			t.Fatalf("model %q, want %q", got.Model, model)
		}
	})
}
