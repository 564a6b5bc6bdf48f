package engine

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/infera/infera/jinja"
)

// Answer shaping (--reasoning, --tool-calls): chat answers that reason
// before they speak, or call a tool, the way vLLM streams them from a
// reasoning parser and a tool parser. Text is still the deterministic
// filler; only its framing changes. Off (the default), chat answers are
// filler text only.

// answerPlan is how one chat answer is framed. The zero plan is plain text.
type answerPlan struct {
	// reasoning is the number of leading tokens sent as reasoning_content.
	reasoning int
	// tool, when set, makes the answer one tool call whose arguments are
	// sent as pieces, one per token.
	tool *toolPlan
	// toolID is the call's id (set once the answer's id is known).
	toolID string
	// text, when set, is the answer's content as pieces, one per token
	// (a response_format's JSON).
	text []string
}

func (p *answerPlan) active() bool {
	return p != nil && (p.reasoning > 0 || p.tool != nil || p.text != nil)
}

// formatPieces is the answer a response_format asks for, as per-token
// pieces: for a json_schema an object of its required properties
// (simArguments), for json_object "{}"; nil for text or none. Engines with
// guided decoding (vLLM, SGLang) answer in the schema's shape.
func formatPieces(rf json.RawMessage) []string {
	if isNull(rf) {
		return nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if json.Unmarshal(rf, &f) != nil {
		return nil
	}
	switch f.Type {
	case "json_schema":
		return splitPieces(simArguments(f.JSONSchema.Schema), 4)
	case "json_object":
		return []string{"{}"}
	}
	return nil
}

// toolPlan is the tool call an answer makes.
type toolPlan struct {
	name   string
	args   string   // JSON object text
	pieces []string // args split into the per-token deltas
}

// toolWire is the part of a chat tool definition the simulator reads.
type toolWire struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// wantsThinking reports whether a chat request asks the model to reason:
// chat_template_kwargs.enable_thinking given, or else a reasoning_effort
// other than none/minimal, or else the server's default enable_thinking
// (def: --default-chat-template-kwargs; the request's effort sets
// enable_thinking over the defaults, as vLLM's build_chat_params does).
// enable_thinking is read as the chat template reads it: Qwen3's closes
// the thinking block only when `enable_thinking is false`, jinja's test
// for the boolean false alone, so any other value the template gets
// ("false", 0, "no", true, a default's null) leaves the model thinking; a
// request's null or "auto" is dropped before the template (vLLM's
// merge_kwargs, tokenizer.HF.render), as if not given. The key is matched
// exactly, as the template's variable is named.
func wantsThinking(w *chatWire, def *jinja.Object) bool {
	named := false
	var kw map[string]json.RawMessage
	if json.Unmarshal(w.ChatTemplateKwargs, &kw) == nil {
		if v, ok := kw["enable_thinking"]; ok {
			named = true
			var s string
			if !isNull(v) && (json.Unmarshal(v, &s) != nil || s != "auto") {
				return string(bytes.TrimSpace(v)) != "false"
			}
		}
	}
	if w.ReasoningEffort != nil && !named {
		return effortThinks(*w.ReasoningEffort)
	}
	if v, ok := def.Get("enable_thinking"); ok {
		return v.Kind() != jinja.KindBool || v.Truth()
	}
	if w.ReasoningEffort != nil {
		return effortThinks(*w.ReasoningEffort)
	}
	return false
}

// effortThinks reports whether a reasoning_effort asks the model to reason.
func effortThinks(effort string) bool {
	switch effort {
	case "", "none", "minimal":
		return false
	}
	return true
}

// chooseTool returns the tool call a model with tools would make: none when
// no tools are offered, tool_choice is "none", or the conversation ends
// with a tool result (the model answers it in text); otherwise the named
// tool of tool_choice, or the first tool.
func chooseTool(w *chatWire) *toolPlan {
	if isNull(w.Tools) || len(w.Messages) == 0 || w.Messages[len(w.Messages)-1].Role == "tool" {
		return nil
	}
	var tools []toolWire
	if json.Unmarshal(w.Tools, &tools) != nil || len(tools) == 0 {
		return nil
	}
	want := ""
	if c := bytes.TrimSpace(w.ToolChoice); len(c) > 0 {
		if c[0] == '"' {
			var s string
			_ = json.Unmarshal(c, &s)
			if s == "none" {
				return nil
			}
		} else if c[0] == '{' {
			var named struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			_ = json.Unmarshal(c, &named)
			want = named.Function.Name
		}
	}
	t := &tools[0]
	for i := range tools {
		if want != "" && tools[i].Function.Name == want {
			t = &tools[i]
		}
	}
	if t.Function.Name == "" {
		return nil
	}
	args := simArguments(t.Function.Parameters)
	return &toolPlan{name: t.Function.Name, args: args, pieces: splitPieces(args, 4)}
}

// simArguments makes deterministic arguments for a JSON schema: each
// required property (every property when none is required), in name order,
// with a value of its type: the first enum value, "sim", 1, true, [] or {}.
func simArguments(schema json.RawMessage) string {
	var s struct {
		Properties map[string]struct {
			Type any               `json:"type"`
			Enum []json.RawMessage `json:"enum"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return "{}"
	}
	names := s.Required
	if len(names) == 0 {
		for k := range s.Properties {
			names = append(names, k)
		}
	}
	names = append([]string(nil), names...)
	sort.Strings(names)
	b := []byte{'{'}
	n := 0
	for _, k := range names {
		p, ok := s.Properties[k]
		if !ok {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		kj, _ := json.Marshal(k)
		b = append(b, kj...)
		b = append(b, ':')
		typ, _ := p.Type.(string)
		if l, ok := p.Type.([]any); ok && len(l) > 0 {
			typ, _ = l[0].(string)
		}
		switch {
		case len(p.Enum) > 0:
			b = append(b, bytes.TrimSpace(p.Enum[0])...)
		case typ == "integer" || typ == "number":
			b = append(b, '1')
		case typ == "boolean":
			b = append(b, "true"...)
		case typ == "array":
			b = append(b, "[]"...)
		case typ == "object":
			b = append(b, "{}"...)
		case typ == "null":
			b = append(b, "null"...)
		default:
			b = append(b, `"sim"`...)
		}
	}
	return string(append(b, '}'))
}

// splitPieces splits s into at most n non-empty pieces at rune boundaries.
func splitPieces(s string, n int) []string {
	var out []string
	size := (len(s) + n - 1) / n
	for len(s) > 0 {
		k := min(size, len(s))
		for k < len(s) && !utf8.RuneStart(s[k]) {
			k++
		}
		out = append(out, s[:k])
		s = s[k:]
	}
	return out
}

// plan decides the framing of a chat answer of max tokens from the
// request and the engine's flags, and the tokens to generate (a tool call
// ends when its arguments are complete, as a model's does).
func (s *Server) plan(g *genRequest, max int) (answerPlan, int) {
	var p answerPlan
	if !g.chat {
		return p, max
	}
	if s.cfg.ToolCalls && g.tool != nil {
		p.tool = g.tool
		return p, min(max, len(g.tool.pieces))
	}
	if g.format != nil {
		p.text = g.format
		return p, min(max, len(g.format))
	}
	if s.cfg.Reasoning && g.thinking {
		p.reasoning = max / 2
	}
	return p, max
}

func appendJSONStr(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}

// finishReason is the answer's finish reason after n tokens.
func (p *answerPlan) finishReason(n int) string {
	if p.tool != nil && n >= len(p.tool.pieces) {
		return "tool_calls"
	}
	if p.text != nil && n >= len(p.text) {
		return "stop"
	}
	return "length"
}

// toolArgs is the arguments sent by n tokens.
func (p *answerPlan) toolArgs(n int) string {
	out := ""
	for i := 0; i < n && i < len(p.tool.pieces); i++ {
		out += p.tool.pieces[i]
	}
	return out
}

// appendPlannedUsage is appendUsage plus the reasoning tokens.
func (p *answerPlan) appendUsage(dst []byte, prompt, n, cached int) []byte {
	dst = appendUsage(dst, prompt, n, cached)
	if r := min(p.reasoning, n); r > 0 {
		dst = dst[:len(dst)-1]
		dst = append(dst, `,"completion_tokens_details":{"reasoning_tokens":`...)
		dst = strconv.AppendInt(dst, int64(r), 10)
		dst = append(dst, "}}"...)
	}
	return dst
}

// appendFull renders a non-streaming chat answer of n tokens.
func (p *answerPlan) appendFull(dst, head []byte, n, prompt, cached int) []byte {
	dst = append(dst, head...)
	dst = append(dst, `"choices":[{"index":0,"message":{"role":"assistant",`...)
	if p.tool != nil {
		dst = append(dst, `"content":null,"tool_calls":[{"id":`...)
		dst = appendJSONStr(dst, p.toolID)
		dst = append(dst, `,"type":"function","function":{"name":`...)
		dst = appendJSONStr(dst, p.tool.name)
		dst = append(dst, `,"arguments":`...)
		dst = appendJSONStr(dst, p.toolArgs(n))
		dst = append(dst, `}}]`...)
	} else if p.text != nil {
		text := ""
		for i := 0; i < n && i < len(p.text); i++ {
			text += p.text[i]
		}
		dst = append(dst, `"content":`...)
		dst = appendJSONStr(dst, text)
	} else {
		r := min(p.reasoning, n)
		if r > 0 {
			dst = append(dst, `"reasoning_content":"`...)
			dst = appendFiller(dst, 0, r)
			dst = append(dst, `",`...)
		}
		dst = append(dst, `"content":"`...)
		dst = appendFiller(dst, r, n)
		dst = append(dst, '"')
	}
	dst = append(dst, `},"logprobs":null,"finish_reason":"`...)
	dst = append(dst, p.finishReason(n)...)
	dst = append(dst, `"}],"usage":`...)
	dst = p.appendUsage(dst, prompt, n, cached)
	return append(dst, '}')
}

// renderPlanned is tokenStream.render for a planned chat answer: tokens
// sent..n as reasoning_content, content or tool call deltas, then the
// closing chunks when final.
func (t *tokenStream) renderPlanned(n int, final bool) {
	p := t.plan
	b := t.buf[:0]
	if t.sent == 0 && n > 0 {
		b = append(b, "data: "...)
		b = append(b, t.head...)
		b = append(b, chatRoleChunk...)
		b = t.endChunk(b, 0)
	}
	for i := t.sent; i < n; i++ {
		b = append(b, "data: "...)
		b = append(b, t.head...)
		switch {
		case p.tool != nil && i < len(p.tool.pieces):
			b = append(b, `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,`...)
			if i == 0 {
				b = append(b, `"id":`...)
				b = appendJSONStr(b, p.toolID)
				b = append(b, `,"type":"function","function":{"name":`...)
				b = appendJSONStr(b, p.tool.name)
				b = append(b, ',')
			} else {
				b = append(b, `"function":{`...)
			}
			b = append(b, `"arguments":`...)
			b = appendJSONStr(b, p.tool.pieces[i])
			b = append(b, `}}]},"logprobs":null,"finish_reason":null}]`...)
		case p.text != nil && i < len(p.text):
			b = append(b, `"choices":[{"index":0,"delta":{"content":`...)
			b = appendJSONStr(b, p.text[i])
			b = append(b, `},"logprobs":null,"finish_reason":null}]`...)
		case i < p.reasoning:
			b = append(b, `"choices":[{"index":0,"delta":{"reasoning_content":"`...)
			b = append(b, fillerWords[i%len(fillerWords)]...)
			b = append(b, chatTokenSuffix...)
		default:
			b = append(b, chatTokenPrefix...)
			b = append(b, fillerWords[i%len(fillerWords)]...)
			b = append(b, chatTokenSuffix...)
		}
		b = t.endChunk(b, i+1)
	}
	t.sent = n
	if final {
		b = append(b, "data: "...)
		b = append(b, t.head...)
		b = append(b, `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"`...)
		b = append(b, p.finishReason(n)...)
		b = append(b, `"}]`...)
		b = t.endChunk(b, n)
		if t.includeUsage {
			b = append(b, "data: "...)
			b = append(b, t.head...)
			b = append(b, usagePrefix...)
			b = p.appendUsage(b, t.promptTokens, n, t.sq.req.CachedTokens)
			b = append(b, "}\n\n"...)
		}
		b = append(b, doneChunk...)
		t.eof = true
	}
	t.buf = b
	t.pending = b
}
