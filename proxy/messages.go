package proxy

import (
	"github.com/infera/infera/tokenizer"
)

// decodeMessages decodes a chat messages array into msgs for template
// rendering. It runs only when the router tokenizes prompts (kv-aware).
func decodeMessages(msgs []tokenizer.Message, d []byte) ([]tokenizer.Message, error) {
	var text []byte
	_, err := forEachElem(d, 0, func(vs, ve int) error {
		if d[vs] != '{' {
			return errMessages
		}
		var m tokenizer.Message
		_, err := forEachField(d, vs, func(key []byte, s, e int) error {
			switch string(key) {
			case "role":
				m.Role = jsonStr(d[s:e], &text)
			case "content":
				if d[s] == '[' {
					text = text[:0]
					forEachElem(d, s, func(ps, pe int) error {
						if d[ps] == '{' {
							forEachField(d, ps, func(k []byte, ks, ke int) error {
								if string(k) == "text" && d[ks] == '"' {
									text = unescape(text, d[ks+1:ke-1])
								}
								return nil
							})
						}
						return nil
					})
					m.Content = string(text)
				} else {
					m.Content = jsonStr(d[s:e], &text)
				}
			case "name":
				m.Name = jsonStr(d[s:e], &text)
			case "tool_call_id":
				m.ToolCallID = jsonStr(d[s:e], &text)
			case "reasoning_content":
				m.ReasoningContent = jsonStr(d[s:e], &text)
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
							tc.ID = jsonStr(d[ks:ke], &text)
						case "type":
							tc.Type = jsonStr(d[ks:ke], &text)
						case "function":
							forEachField(d, ks, func(fk []byte, fs, fe int) error {
								switch string(fk) {
								case "name":
									tc.Function.Name = jsonStr(d[fs:fe], &text)
								case "arguments":
									if d[fs] == '"' {
										tc.Function.Arguments = jsonStr(d[fs:fe], &text)
									} else {
										tc.Function.Arguments = string(d[fs:fe])
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
	return msgs, err
}

// jsonStr returns the decoded string value v (a JSON string), or "" for
// other kinds. buf is scratch space.
func jsonStr(v []byte, buf *[]byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	*buf = unescape((*buf)[:0], v[1:len(v)-1])
	return string(*buf)
}
