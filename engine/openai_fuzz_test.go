package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/infera/infera/tokenizer"
)

// FuzzParseRequest: arbitrary bodies never panic, and accepted prompts are
// non-empty token lists or clean errors.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":"abc"}`, `{"prompt":["a","b"]}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1],[2]]}`,
		`{"prompt":[[["x"]]]}`, `{"messages":[{"role":"a","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`,
		`{`, `null`, `[]`, `{"max_tokens":-1,"prompt":"x"}`,
		`{"messages":[{"role":"user","content":"w?"}],"tool_choice":{"type":"function","function":{"name":"g"}},"reasoning_effort":"high",` +
			`"chat_template_kwargs":{"enable_thinking":true},"tools":[{"type":"function","function":{"name":"g","parameters":` +
			`{"type":"object","properties":{"a":{"type":["string","null"]},"b":{"enum":[{"x":1}]},"c":{"type":"number"}},"required":["c","a","zz"]}}}]}`,
	} {
		f.Add([]byte(s))
	}
	tok := tokenizer.Simple{}
	f.Fuzz(func(t *testing.T, body []byte) {
		if fl, err := ParseFault(body); err == nil && fl.Mode != FaultNone {
			if fl.Rate <= 0 || fl.Rate > 1 || fl.Status < 100 || fl.Status > 599 || fl.Factor <= 0 || fl.AfterTokens < 0 {
				t.Fatalf("fault not normalized: %+v", fl)
			}
		}
		if g, _, _, err := parseChat(body, tok, nil, nil); err != nil {
			if _, ok := err.(*badRequestError); !ok {
				t.Fatalf("chat: non-client error %T %v", err, err)
			}
		} else if tp := g.tool; tp != nil {
			// A planned tool call streams valid JSON arguments in pieces.
			if !json.Valid([]byte(tp.args)) || strings.Join(tp.pieces, "") != tp.args || len(tp.pieces) > 4 {
				t.Fatalf("tool plan %+v", tp)
			}
		}
		g, _, err := parseCompletion(body, tok, nil)
		if err != nil {
			if _, ok := err.(*badRequestError); !ok {
				t.Fatalf("completion: non-client error %T %v", err, err)
			}
			return
		}
		if g.maxTokens < 0 {
			t.Fatalf("negative max tokens")
		}
	})
}
