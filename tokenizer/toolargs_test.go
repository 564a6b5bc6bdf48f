package tokenizer

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/infera/infera/jinja"
)

// An assistant tool call's arguments are rendered as vLLM renders them:
// its chat_utils decodes the arguments string with json.loads (an empty
// object when that fails) and Qwen3's template writes the mapping with
// tojson, so a client's compact `{"city":"Paris"}` reaches the engine as
// `{"city": "Paris"}`; the router rendered the client's text and every
// block after an agent's first tool call hashed differently from the
// engine's. The wanted texts are what Python printed for
// json.dumps(json.loads(s), ensure_ascii=False) (a string as it is, the
// template's `is string` branch).
func TestToolCallArgumentsRenderAsVLLMDecodesThem(t *testing.T) {
	h := loadQwen3(t)
	for _, c := range []struct{ args, want string }{
		{`{"city":"Paris","unit":"celsius"}`, `{"city": "Paris", "unit": "celsius"}`},
		{`{oops`, `{}`},
		{``, `{}`},
		{`[1,2,{"a":null}]`, `[1, 2, {"a": null}]`},
		{`"plain"`, `plain`},
		{`{"t":1.50,"n":1E5,"u":"\u00fc東京"}`, `{"t": 1.5, "n": 100000.0, "u": "ü東京"}`},
		{`  {"a" : true }  `, `{"a": true}`},
		{`{"a":1,"a":2}`, `{"a": 2}`},
	} {
		msgs := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Type: "function"}}}}
		msgs[1].ToolCalls[0].Function.Name = "f"
		msgs[1].ToolCalls[0].Function.Arguments = c.args
		for i := 0; i < 2; i++ { // the second render's arguments come from the cache
			got, err := h.RenderChat(nil, msgs, nil, false)
			if err != nil {
				t.Fatalf("%q: %v", c.args, err)
			}
			want := `{"name": "f", "arguments": ` + c.want + "}\n</tool_call>"
			if !strings.Contains(string(got), want) {
				t.Errorf("arguments %q (render %d) rendered\n%s\nwant it to hold %q", c.args, i+1, got, want)
			}
		}
	}
}

// The arguments cache keeps its own copy of the key: the router's
// arguments live in a request's arena, overwritten by the next request.
func TestToolCallArgumentsCacheKeepsItsOwnKey(t *testing.T) {
	h := loadQwen3(t)
	buf := []byte(`{"k":"first"}`)
	msgs := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", ToolCalls: []ToolCall{{}}}}
	msgs[1].ToolCalls[0].Function.Name = "f"
	msgs[1].ToolCalls[0].Function.Arguments = unsafe.String(unsafe.SliceData(buf), len(buf))
	if _, err := h.RenderChat(nil, msgs, nil, false); err != nil {
		t.Fatal(err)
	}
	copy(buf, `{"k":"other"}`)
	got, err := h.RenderChat(nil, msgs, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `"arguments": {"k": "other"}`) {
		t.Fatalf("after the arena changed the render holds\n%s\nwant the new arguments", got)
	}
}

// Absent tools and documents reach the template as None, as transformers
// passes them: a template testing `tools is not none` (Mistral's, once it
// set an undefined tools to none) saw them undefined, which is not none.
func TestAbsentToolsAndDocumentsAreNone(t *testing.T) {
	tpl, err := jinja.ParseWithOptions(`[{{ 'T' if tools is defined else 'F' }}{{ 'T' if tools is not none else 'F' }}{{ 'T' if documents is none else 'F' }}]`,
		jinja.Options{PythonStrip: true})
	if err != nil {
		t.Fatal(err)
	}
	h := &HF{chat: tpl}
	got, err := h.RenderChat(nil, []Message{{Role: "user", Content: "hi"}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "[TFT]" { // what Python's jinja2 prints with tools=None, documents=None
		t.Fatalf("rendered %s", got)
	}
}
