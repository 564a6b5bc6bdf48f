package protocol

import (
	"strings"
	"testing"
)

// Hostile request bodies end in a 400, never a panic, and cost work
// linear in their size.
func TestHostileRequestBodiesAreRefusedOrConverted(t *testing.T) {
	opt := DefaultOptions()
	deep := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"metadata":` + strings.Repeat(`{"a":`, 100000) + `1` + strings.Repeat(`}`, 100000) + `}`
	many := `{"model":"m","max_tokens":1,"messages":[` + strings.Repeat(`{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},`, 20000) + `{"role":"user","content":"z"}]}`
	bigString := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat(`\u00e9\n`, 200000) + `"}]}`
	for name, body := range map[string]string{
		"nesting 100000 deep":      deep,
		"40000 content blocks":     many,
		"2.4 MB of escaped string": bigString,
		"truncated":                many[:len(many)/2],
		"invalid UTF-8":            `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + "\xff\xfe" + `"}]}`,
		"control character":        `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + "\x01" + `"}]}`,
		"lone surrogate":           `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"\ud800"}]}`,
		"NaN":                      `{"model":"m","max_tokens":1,"temperature":NaN,"messages":[{"role":"user","content":"x"}]}`,
	} {
		var m Meta
		out, err := AnthropicToChat(nil, []byte(body), &opt, &m)
		if err == nil {
			if !validJSONObject(out) {
				t.Errorf("%s: converted to invalid JSON", name)
			}
			continue
		}
		if e, ok := err.(*Error); !ok || e.Status != 400 {
			t.Errorf("%s: %v", name, err)
		}
		var m2 Meta
		if _, err := ResponsesToChat(nil, []byte(strings.Replace(body, `"messages"`, `"input"`, 1)), &opt, &m2); err != nil {
			if e, ok := err.(*Error); !ok || e.Status != 400 {
				t.Errorf("%s (responses): %v", name, err)
			}
		}
	}
}
