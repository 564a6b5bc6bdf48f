package proxy

import (
	"unsafe"

	"github.com/infera/infera/tokenizer"
)

// decodeMessages decodes the chat messages array d, whose fields the parse
// located (spans), into msgs for template rendering. It runs only when the
// router tokenizes prompts (kv-aware); the messages array is not walked a
// second time.
//
// The messages' strings live in arena, which is reused by the next request:
// they are valid only until the request handler returns (RenderChat does not
// retain them). Decoded JSON strings are never longer than their encoding,
// so an arena of the spans' total length never reallocates and the strings
// stay put. Steady state: no allocations unless messages
// carry tool calls.
func decodeMessages(msgs []tokenizer.Message, d []byte, spans []msgSpan, arena *[]byte) []tokenizer.Message {
	need := 0 // the decoded strings are no longer than the fields' values
	for i := range spans {
		sp := &spans[i]
		for _, v := range [...]span{sp.role, sp.content, sp.name, sp.toolCallID, sp.reasoningSpan(), sp.toolCalls} {
			need += v.e - v.s
		}
	}
	if cap(*arena) < need {
		*arena = make([]byte, 0, need+need/4)
	}
	a := (*arena)[:0]
	str := func(v span) string {
		if v.e-v.s < 2 || d[v.s] != '"' {
			return ""
		}
		start := len(a)
		a = unescape(a, d[v.s+1:v.e-1])
		return arenaString(a[start:])
	}
	for i := range spans {
		sp := &spans[i]
		var m tokenizer.Message
		if len(msgs) < cap(msgs) {
			// Reuse the tool-call slice a previous request left in this slot.
			m.ToolCalls = msgs[: len(msgs)+1 : len(msgs)+1][len(msgs)].ToolCalls[:0]
		}
		m.Role = str(sp.role)
		if c := sp.content; c.e > c.s && d[c.s] == '[' {
			start := len(a)
			a = appendTextParts(a, d, c.s)
			m.Content = arenaString(a[start:])
		} else {
			m.Content = str(c)
		}
		m.Name = str(sp.name)
		m.ToolCallID = str(sp.toolCallID)
		if r := sp.reasoningSpan(); r.e > r.s && d[r.s] == '"' {
			m.ReasoningContent, m.HasReasoning = str(r), true
		}
		if c := sp.toolCalls; c.e > c.s && d[c.s] == '[' {
			forEachElem(d, c.s, func(cs, ce int) error {
				var tc tokenizer.ToolCall
				if d[cs] != '{' {
					return nil
				}
				forEachField(d, cs, func(k []byte, ks, ke int) error {
					switch string(k) {
					case "id":
						tc.ID = str(span{ks, ke})
					case "type":
						tc.Type = str(span{ks, ke})
					case "function":
						forEachField(d, ks, func(fk []byte, fs, fe int) error {
							switch string(fk) {
							case "name":
								tc.Function.Name = str(span{fs, fe})
							case "arguments":
								switch d[fs] {
								case '"':
									tc.Function.Arguments = str(span{fs, fe})
								case '{', '[':
									// Given as JSON: vLLM renders it as it is
									// (a number, true or null as an empty
									// object: arguments "", which is not JSON).
									start := len(a)
									a = append(a, d[fs:fe]...)
									tc.Function.Arguments = arenaString(a[start:])
								}
							}
							return nil
						})
					}
					return nil
				})
				m.ToolCalls = append(m.ToolCalls, tc)
				return nil
			})
		}
		msgs = append(msgs, m)
	}
	*arena = a
	return msgs
}

// appendTextParts appends the text of the content parts array at d[i] as
// vLLM flattens it for a template that takes content as a string: the
// non-empty texts of the parts of type "text", joined by "\n" (the last of
// duplicate keys counts, as for the engine's JSON decoder). The result is
// never longer than the array's JSON.
func appendTextParts(a, d []byte, i int) []byte {
	n := 0
	forEachElem(d, i, func(ps, pe int) error {
		if d[ps] != '{' {
			return nil
		}
		var typ, text span
		forEachField(d, ps, func(k []byte, ks, ke int) error {
			switch string(k) {
			case "type":
				typ = span{ks, ke}
			case "text":
				text = span{ks, ke}
			}
			return nil
		})
		if text.e-text.s <= 2 || d[text.s] != '"' || !isJSONString(d[typ.s:typ.e], "text") {
			return nil
		}
		if n > 0 {
			a = append(a, '\n')
		}
		n++
		a = unescape(a, d[text.s+1:text.e-1])
		return nil
	})
	return a
}

// isJSONString reports whether the JSON value v is a string that decodes to
// s (len(s) <= 32).
func isJSONString(v []byte, s string) bool {
	if len(v) < 2 || v[0] != '"' || len(v) > 6*32+2 {
		return false
	}
	raw := v[1 : len(v)-1]
	if !hasEscape(raw) {
		return string(raw) == s
	}
	var buf [32 * 4]byte
	return string(unescape(buf[:0], raw)) == s
}

// arenaString views b as a string without copying. b must not change while
// the string is in use (see decodeMessages).
func arenaString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
