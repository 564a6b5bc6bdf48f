package proxy

import (
	"math/bits"
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
// carry tool calls. A content given as parts keeps them (Message.Parts) only
// with parts set: the tokenizer renders contents as parts.
func decodeMessages(msgs []tokenizer.Message, d []byte, spans []msgSpan, arena *[]byte, parts bool) []tokenizer.Message {
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
			// Reuse the tool-call and part slices a previous request left
			// in this slot.
			prev := &msgs[: len(msgs)+1 : len(msgs)+1][len(msgs)]
			m.ToolCalls, m.Parts = prev.ToolCalls[:0], prev.Parts[:0]
		}
		m.Role = str(sp.role)
		if c := sp.content; c.e > c.s && d[c.s] == '[' {
			start := len(a)
			a, m.Parts = appendTextParts(a, d, c.s, m.Parts, parts)
			m.Content = arenaString(a[start:])
			m.ContentArray = true
		} else {
			m.Content = str(c)
			m.NoContent = c.e == c.s || d[c.s] == 'n'
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
// non-empty texts of its text parts, joined by "\n" (the last of
// duplicate keys counts, as for the engine's JSON decoder). The result is
// never longer than the array's JSON. It appends to parts the parts as
// vLLM keeps them for a template that loops over the content: each text
// part (its Text in a, which must not grow past its capacity:
// decodeMessages' arena), and each image, audio or video part as its
// modality, when keep is set (the tokenizer renders parts: they cost 32
// bytes each, where a flattened part costs nothing). Text parts are
// vLLM's TEXT_PART_TYPES (chat_utils' _parse_chat_message_content_part):
// "text", "input_text" and "output_text" (their "text"), "refusal" (its
// "refusal") and "thinking" (its "thinking"), each a {"type": "text"}
// part; one whose text is null or absent is dropped, except that an
// "input_text", "output_text" or "thinking" part stays a part (its text
// None) for a template that loops. A plain string element is a text
// part too (chat_utils: "Handle plain text parts"). A "tool_reference"
// part (or an untyped one with a tool_reference key and no media key)
// gives its "name" as a text, and stays a tool_reference part (its name
// in Text, None kept) for a template that loops (MM_PARSER_MAP's
// "tool_reference").
func appendTextParts(a, d []byte, i int, parts []tokenizer.ContentPart, keep bool) ([]byte, []tokenizer.ContentPart) {
	n := 0
	forEachElem(d, i, func(ps, pe int) error {
		var text span
		keepNone := false
		ptype := "text" // the part's type for a template that loops
		switch d[ps] {
		case '"':
			text = span{ps, pe} // a plain string is a text part
		case '{':
			var typ, refusal, thinking, name span
			var media uint // untypedMedia's keys the part holds
			byKeys, toolRef := false, false
			forEachField(d, ps, func(k []byte, ks, ke int) error {
				switch string(k) {
				case "type":
					typ = span{ks, ke}
				case "text":
					text = span{ks, ke}
				case "refusal":
					refusal = span{ks, ke}
				case "thinking":
					thinking = span{ks, ke}
				case "name":
					name = span{ks, ke}
				case "tool_reference":
					toolRef = true
				case "uuid":
					byKeys = d[ks] != 'n' // the last copy counts
				default:
					for j, mk := range untypedMedia {
						if string(k) == mk[0] {
							if mk[0] == "input_audio" && d[ks] == 'n' {
								media &^= 1 << j // only when not None
							} else {
								media |= 1 << j
							}
						}
					}
				}
				return nil
			})
			if byKeys || typ.e == typ.s || d[typ.s] == 'n' {
				// Read by its keys (chat_utils: a missing type, or a
				// uuid): the first media key it holds, else a
				// tool_reference key (the part's name); with none the
				// engine refuses the part.
				if media == 0 && toolRef {
					text, ptype, keepNone = name, "tool_reference", true
					break
				}
				if m := untypedMedia[bits.TrailingZeros(media)%len(untypedMedia)][1]; media != 0 && m != "" && keep {
					parts = append(parts, tokenizer.ContentPart{Type: m})
				}
				return nil
			}
			if m := partModality(d[typ.s:typ.e]); m != "" {
				if keep {
					parts = append(parts, tokenizer.ContentPart{Type: m})
				}
				return nil
			}
			t := d[typ.s:typ.e]
			switch {
			case isJSONString(t, "text"):
			case isJSONString(t, "input_text"), isJSONString(t, "output_text"):
				keepNone = true
			case isJSONString(t, "refusal"):
				text = refusal
			case isJSONString(t, "thinking"):
				text, keepNone = thinking, true
			case isJSONString(t, "tool_reference"):
				// Its name, kept as a tool_reference part for a
				// template that loops (one that expands deferred tools).
				text, ptype, keepNone = name, "tool_reference", true
			default:
				return nil
			}
		default:
			return nil
		}
		if text.e == text.s || d[text.s] == 'n' {
			if keepNone && keep {
				parts = append(parts, tokenizer.ContentPart{Type: ptype, NullText: true})
			}
			return nil
		}
		if text.e-text.s < 2 || d[text.s] != '"' {
			return nil
		}
		if text.e-text.s == 2 {
			if keep {
				parts = append(parts, tokenizer.ContentPart{Type: ptype})
			}
			return nil
		}
		if n > 0 {
			a = append(a, '\n')
		}
		n++
		start := len(a)
		a = unescape(a, d[text.s+1:text.e-1])
		if keep {
			parts = append(parts, tokenizer.ContentPart{Type: ptype, Text: arenaString(a[start:])})
		}
		return nil
	})
	return a, parts
}

// partModality returns the modality vLLM renders a media content part of
// type typ (raw JSON) as, or "".
func partModality(typ []byte) string {
	if len(typ) < 2 || typ[0] != '"' {
		return ""
	}
	for _, m := range partModalities {
		if isJSONString(typ, m[0]) {
			return m[1]
		}
	}
	return ""
}

// partModalities are vLLM's media content part types and their modality.
var partModalities = [...][2]string{{"image_url", "image"}, {"input_image", "image"}, {"image_pil", "image"},
	{"image_embeds", "image"}, {"audio_url", "audio"}, {"input_audio", "audio"}, {"audio_embeds", "audio"}, {"video_url", "video"}}

// untypedMedia are the keys by which vLLM reads a content part without a
// type (or with a uuid), in the order it tries them
// (_parse_chat_message_content_mm_part), with their modality; a
// prompt_embeds part renders no media part ("": it needs the engine's
// --enable-prompt-embeds).
var untypedMedia = [...][2]string{{"image_url", "image"}, {"image_pil", "image"}, {"image_embeds", "image"},
	{"audio_embeds", "audio"}, {"prompt_embeds", ""}, {"audio_url", "audio"}, {"input_audio", "audio"}, {"video_url", "video"}}

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
