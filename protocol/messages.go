package protocol

import "github.com/infera/infera/tokenizer"

// ChatMessages decodes the messages of a chat completions body (for
// example one produced by AnthropicCountTokensToChat) for
// tokenizer.Tokenizer.RenderChat, appending them to msgs, and returns the
// raw tools array (nil when absent; it points into chat).
//
// The messages' strings live in *arena, which is grown to len(chat) and
// reused by the next call: they are valid until then. Content given as an
// array of parts contributes its text parts joined with '\n'.
func ChatMessages(msgs []tokenizer.Message, chat []byte, arena *[]byte) ([]tokenizer.Message, []byte, error) {
	msgs, tools, _, err := ChatMessagesN(msgs, chat, arena, 0)
	return msgs, tools, err
}

// ChatMessagesN is ChatMessages decoding at most limit messages (all when
// limit <= 0); rest weighs those it skipped: for each, one plus the
// encoded length of its content, reasoning_content and tool_calls.
func ChatMessagesN(msgs []tokenizer.Message, chat []byte, arena *[]byte, limit int) (_ []tokenizer.Message, _ []byte, rest int, _ error) {
	if cap(*arena) < len(chat) {
		*arena = make([]byte, 0, len(chat))
	}
	a := (*arena)[:0]
	str := func(v []byte) string {
		raw, ok := rawStr(v)
		if !ok {
			return ""
		}
		s := len(a)
		a = unescape(a, raw)
		return bytesString(a[s:])
	}
	// dlen is the decoded length of a string value (0 for another value);
	// the arena is its scratch space.
	dlen := func(v []byte) int {
		raw, ok := rawStr(v)
		if !ok {
			return 0
		}
		m := len(a)
		a = unescape(a, raw)
		n := len(a) - m
		a = a[:m]
		return n
	}
	// textLen is the decoded length of a content value as the messages
	// below get it: a string, or the text parts joined by newlines.
	textLen := func(v []byte) int {
		if v[0] != '[' {
			return dlen(v)
		}
		n, parts := 0, 0
		elems(v, func(ps, pe int) error {
			p := v[ps:pe]
			if p[0] != '{' {
				return nil
			}
			if typ, text := blockTypeText(p); strIs(typ, "text") {
				if _, ok := rawStr(text); ok {
					if parts > 0 {
						n++
					}
					parts++
					n += dlen(text)
				}
			}
			return nil
		})
		return n
	}
	i := skipSpace(chat, 0)
	if i >= len(chat) || chat[i] != '{' {
		return msgs, nil, 0, errNotObject
	}
	var messages, tools []byte
	if _, err := walkObject(chat, i, 0, func(k []byte, s, e int) error {
		switch string(k) {
		case "messages":
			messages = chat[s:e]
		case "tools":
			if chat[s] == '[' {
				tools = chat[s:e]
			}
		}
		return nil
	}); err != nil {
		return msgs, nil, 0, errMalformedBody
	}
	if messages == nil || messages[0] != '[' {
		return msgs, nil, 0, badRequest("messages", "messages must be an array")
	}
	base := len(msgs)
	err := elems(messages, func(s, e int) error {
		mv := messages[s:e]
		if mv[0] != '{' {
			return badRequest("messages", "messages must be an array of objects")
		}
		if limit > 0 && len(msgs)-base >= limit {
			// Measured as the messages decoded below are (the caller
			// extrapolates from their ratio): one per message, plus the
			// decoded text of the content's text parts, the reasoning and
			// the tool calls' arguments; not the JSON (quotes, escapes,
			// image data), which overcounted up to 14 times.
			rest++
			fields(mv, func(k []byte, s, e int) error {
				v := mv[s:e]
				switch string(k) {
				case "content", "reasoning", "reasoning_content":
					rest += textLen(v)
				case "tool_calls":
					if v[0] == '[' {
						elems(v, func(cs, ce int) error {
							if cv := v[cs:ce]; cv[0] == '{' {
								fields(cv, func(k []byte, s, e int) error {
									if string(k) == "function" && cv[s] == '{' {
										fv := cv[s:e]
										fields(fv, func(k []byte, s, e int) error {
											if string(k) == "arguments" {
												rest += dlen(fv[s:e])
											}
											return nil
										})
									}
									return nil
								})
							}
							return nil
						})
					}
				}
				return nil
			})
			return nil
		}
		var m tokenizer.Message
		// vLLM takes reasoning when it is given (not null), else the
		// deprecated reasoning_content.
		var reasoning, reasoningContent []byte
		fields(mv, func(k []byte, s, e int) error {
			v := mv[s:e]
			switch string(k) {
			case "role":
				m.Role = str(v)
			case "content":
				if v[0] != '[' {
					m.Content = str(v)
					return nil
				}
				start, n := len(a), 0
				elems(v, func(ps, pe int) error {
					p := v[ps:pe]
					if p[0] != '{' {
						return nil
					}
					typ, text := blockTypeText(p)
					if raw, ok := rawStr(text); ok && strIs(typ, "text") {
						if n > 0 {
							a = append(a, '\n')
						}
						n++
						a = unescape(a, raw)
					}
					return nil
				})
				m.Content = bytesString(a[start:])
			case "name":
				m.Name = str(v)
			case "tool_call_id":
				m.ToolCallID = str(v)
			case "reasoning":
				reasoning = v
			case "reasoning_content":
				reasoningContent = v
			case "tool_calls":
				if v[0] != '[' {
					return nil
				}
				elems(v, func(cs, ce int) error {
					cv := v[cs:ce]
					if cv[0] != '{' {
						return nil
					}
					var tc tokenizer.ToolCall
					fields(cv, func(k []byte, s, e int) error {
						fv := cv[s:e]
						switch string(k) {
						case "id":
							tc.ID = str(fv)
						case "type":
							tc.Type = str(fv)
						case "function":
							if fv[0] == '{' {
								fields(fv, func(k []byte, s, e int) error {
									switch string(k) {
									case "name":
										tc.Function.Name = str(fv[s:e])
									case "arguments":
										tc.Function.Arguments = str(fv[s:e])
									}
									return nil
								})
							}
						}
						return nil
					})
					m.ToolCalls = append(m.ToolCalls, tc)
					return nil
				})
			}
			return nil
		})
		r := reasoning
		if len(r) == 0 || r[0] == 'n' {
			r = reasoningContent
		}
		if len(r) > 0 && r[0] == '"' {
			m.ReasoningContent, m.HasReasoning = str(r), true
		}
		msgs = append(msgs, m)
		return nil
	})
	*arena = a
	if err != nil {
		return msgs, tools, rest, jsonErr(err)
	}
	return msgs, tools, rest, nil
}
