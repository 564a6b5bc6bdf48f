package proxy

import (
	"unsafe"

	"github.com/infera/infera/tokenizer"
)

// decodeMessages decodes a chat messages array into msgs for template
// rendering. It runs only when the router tokenizes prompts (kv-aware).
//
// The messages' strings live in arena, which is reused by the next request:
// they are valid only until the request handler returns (RenderChat does not
// retain them). Decoded JSON strings are never longer than their encoding,
// so an arena of len(d) bytes never reallocates and the strings stay put.
// Steady state: no allocations unless messages carry tool calls.
func decodeMessages(msgs []tokenizer.Message, d []byte, arena *[]byte) ([]tokenizer.Message, error) {
	if cap(*arena) < len(d) {
		*arena = make([]byte, 0, len(d)+len(d)/4)
	}
	a := (*arena)[:0]
	str := func(v []byte) string { // v is a JSON value
		if len(v) < 2 || v[0] != '"' {
			return ""
		}
		start := len(a)
		a = unescape(a, v[1:len(v)-1])
		return arenaString(a[start:])
	}
	_, err := forEachElem(d, 0, func(vs, ve int) error {
		if d[vs] != '{' {
			return errMessages
		}
		var m tokenizer.Message
		if len(msgs) < cap(msgs) {
			// Reuse the tool-call slice a previous request left in this slot.
			m.ToolCalls = msgs[: len(msgs)+1 : len(msgs)+1][len(msgs)].ToolCalls[:0]
		}
		_, err := forEachField(d, vs, func(key []byte, s, e int) error {
			switch string(key) {
			case "role":
				m.Role = str(d[s:e])
			case "content":
				if d[s] == '[' {
					start := len(a)
					forEachElem(d, s, func(ps, pe int) error {
						if d[ps] == '{' {
							forEachField(d, ps, func(k []byte, ks, ke int) error {
								if string(k) == "text" && d[ks] == '"' {
									a = unescape(a, d[ks+1:ke-1])
								}
								return nil
							})
						}
						return nil
					})
					m.Content = arenaString(a[start:])
				} else {
					m.Content = str(d[s:e])
				}
			case "name":
				m.Name = str(d[s:e])
			case "tool_call_id":
				m.ToolCallID = str(d[s:e])
			case "reasoning_content":
				m.ReasoningContent = str(d[s:e])
			case "tool_calls":
				if d[s] != '[' {
					return nil
				}
				forEachElem(d, s, func(cs, ce int) error {
					var tc tokenizer.ToolCall
					if d[cs] != '{' {
						return nil
					}
					forEachField(d, cs, func(k []byte, ks, ke int) error {
						switch string(k) {
						case "id":
							tc.ID = str(d[ks:ke])
						case "type":
							tc.Type = str(d[ks:ke])
						case "function":
							forEachField(d, ks, func(fk []byte, fs, fe int) error {
								switch string(fk) {
								case "name":
									tc.Function.Name = str(d[fs:fe])
								case "arguments":
									if d[fs] == '"' {
										tc.Function.Arguments = str(d[fs:fe])
									} else {
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
			return nil
		})
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
		return nil
	})
	*arena = a
	return msgs, err
}

// arenaString views b as a string without copying. b must not change while
// the string is in use (see decodeMessages).
func arenaString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
