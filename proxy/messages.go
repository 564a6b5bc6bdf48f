package proxy

import (
	"math/bits"
	"slices"
	"unsafe"

	"github.com/infera/infera/tokenizer"
	"github.com/zeebo/xxh3"
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
						// The last "function" counts, whole, as for
						// the engine's JSON decoder: nothing of an
						// earlier one is kept (it was merged in).
						tc.Function.Name, tc.Function.Arguments = "", ""
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
								default:
									tc.Function.Arguments = "" // over an earlier duplicate's
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
// bytes each, where a flattened part costs nothing). How a part is read
// is readPart's.
func appendTextParts(a, d []byte, i int, parts []tokenizer.ContentPart, keep bool) ([]byte, []tokenizer.ContentPart) {
	n := 0
	forEachElem(d, i, func(ps, pe int) error {
		p := readPart(d, ps, pe)
		switch p.typ {
		case "", "prompt_embeds":
			return nil
		case "image", "audio", "video":
			if keep {
				parts = append(parts, tokenizer.ContentPart{Type: p.typ})
			}
			return nil
		}
		text := p.text
		if text.e == text.s || d[text.s] == 'n' {
			if p.keepNone && keep {
				parts = append(parts, tokenizer.ContentPart{Type: p.typ, NullText: true})
			}
			return nil
		}
		if text.e-text.s < 2 || d[text.s] != '"' {
			return nil
		}
		if text.e-text.s == 2 {
			if keep {
				parts = append(parts, tokenizer.ContentPart{Type: p.typ})
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
			parts = append(parts, tokenizer.ContentPart{Type: p.typ, Text: arenaString(a[start:])})
		}
		return nil
	})
	return a, parts
}

// appendRouteText appends the routing text of the content parts array at
// d[i]: its text as appendTextParts flattens it, and a media marker
// (mediaMarker) for each image, audio or video part, placed as vLLM's
// chat_utils places a string content's media placeholders
// (_get_full_multimodal_text_prompt, interleave_mm_strings off, its
// default): all before the text, in the parts' order, each followed by
// "\n" (the last one only when text follows); a prompt_embeds part's
// marker stands in its place among the texts, as vLLM's
// "<prompt_embeds>" does. The engine caches the tokens of a media item
// under its content's hash, so requests with the same media must share
// this text and requests with other media must part at it.
func appendRouteText(a, d []byte, i int) []byte {
	start, n, media := len(a), 0, 0
	forEachElem(d, i, func(ps, pe int) error {
		p := readPart(d, ps, pe)
		switch p.typ {
		case "":
			return nil
		case "image", "audio", "video":
			media++
			return nil
		case "prompt_embeds":
			if n > 0 {
				a = append(a, '\n')
			}
			n++
			a = appendMediaMarker(a, d, &p)
			return nil
		}
		if t := p.text; t.e-t.s > 2 && d[t.s] == '"' {
			if n > 0 {
				a = append(a, '\n')
			}
			n++
			a = unescape(a, d[t.s+1:t.e-1])
		}
		return nil
	})
	if media == 0 {
		return a
	}
	// Make room for the markers before the text, then write them.
	room := media * (mediaMarkerLen + 1)
	if n == 0 {
		room-- // no text: no separator after the last marker
	}
	textEnd := len(a)
	a = slices.Grow(a, room)[:textEnd+room]
	copy(a[start+room:], a[start:textEnd])
	w := start
	forEachElem(d, i, func(ps, pe int) error {
		p := readPart(d, ps, pe)
		if p.typ == "image" || p.typ == "audio" || p.typ == "video" {
			var buf [mediaMarkerLen]byte
			w += copy(a[w:], appendMediaMarker(buf[:0], d, &p))
			if w < start+room {
				a[w] = '\n'
				w++
			}
		}
		return nil
	})
	return a
}

// mediaMarkerLen is the length of an image, audio or video part's marker.
const mediaMarkerLen = len("<##IMAGE:0123456789abcdef##>")

// appendMediaMarker appends the routing text's marker of the media part p:
// vLLM's generic placeholder for its modality (chat_utils'
// MODALITY_PLACEHOLDERS_MAP: "<##IMAGE##>", "<##AUDIO##>", "<##VIDEO##>",
// "<##PROMPT_EMBEDS##>") with the xxh3 hash of what names its media
// (partRead.id) in 16 hex digits inside: "<##IMAGE:0123456789abcdef##>".
func appendMediaMarker(dst, d []byte, p *partRead) []byte {
	var name string
	switch p.typ {
	case "image":
		name = "IMAGE"
	case "audio":
		name = "AUDIO"
	case "video":
		name = "VIDEO"
	default:
		name = "PROMPT_EMBEDS"
	}
	dst = append(dst, "<##"...)
	dst = append(dst, name...)
	dst = append(dst, ':')
	h := xxh3.Hash(d[p.id.s:p.id.e])
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, "0123456789abcdef"[h>>uint(shift)&15])
	}
	return append(dst, "##>"...)
}

// partRead is a content part as vLLM's chat_utils reads it
// (_parse_chat_message_content_part).
type partRead struct {
	// typ is "text" (for any of vLLM's text part types),
	// "tool_reference", a media modality ("image", "audio", "video"),
	// "prompt_embeds", or "" for a part that gives nothing (an unknown
	// type, which the engine refuses).
	typ string
	// text is a text part's text or a tool_reference's name, a JSON value
	// (empty when absent); keepNone: an absent or null one still makes a
	// part for a template that loops.
	text     span
	keepNone bool
	// id is the JSON value that names a media part's media: its uuid when
	// given (vLLM then identifies the media by it), else its source (a
	// URL, the audio data, the embeddings).
	id span
}

// readPart reads the content part d[ps:pe] as vLLM's chat_utils reads it.
// Text parts are vLLM's TEXT_PART_TYPES (_parse_chat_message_content_part):
// "text", "input_text" and "output_text" (their "text"), "refusal" (its
// "refusal") and "thinking" (its "thinking"); one whose text is null or
// absent makes no part, except that an "input_text", "output_text" or
// "thinking" part stays a part (its text None) for a template that loops.
// A plain string element is a text part too ("Handle plain text parts").
// A "tool_reference" part gives its "name" (MM_PARSER_MAP), None kept. A
// part without a type, or with a non-null uuid, is read by its keys
// (_parse_chat_message_content_mm_part): the first media key it holds
// (untypedMedia), else a tool_reference key (its name); with neither the
// engine refuses it. The last of duplicate keys counts.
func readPart(d []byte, ps, pe int) (p partRead) {
	switch d[ps] {
	case '"':
		return partRead{typ: "text", text: span{ps, pe}}
	case '{':
	default:
		return partRead{}
	}
	var typ, text, refusal, thinking, name, uuid, data span
	var media uint                  // untypedMedia's keys the part holds
	var src [len(untypedMedia)]span // their values
	toolRef := false
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
		case "data":
			data = span{ks, ke}
		case "tool_reference":
			toolRef = true
		case "uuid":
			uuid = span{ks, ke}
		default:
			for j, mk := range untypedMedia {
				if string(k) == mk[0] {
					src[j] = span{ks, ke}
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
	byUUID := uuid.e > uuid.s && d[uuid.s] != 'n'
	var key int // the untypedMedia key that holds a media part's source
	switch {
	case byUUID || typ.e == typ.s || d[typ.s] == 'n':
		switch {
		case media != 0:
			key = bits.TrailingZeros(media)
			p.typ = untypedMedia[key][1]
		case toolRef:
			return partRead{typ: "tool_reference", text: name, keepNone: true}
		default:
			return partRead{}
		}
	default:
		t := d[typ.s:typ.e]
		if p.typ, key = partMedia(t); p.typ == "" {
			switch {
			case isJSONString(t, "text"):
				return partRead{typ: "text", text: text}
			case isJSONString(t, "input_text"), isJSONString(t, "output_text"):
				return partRead{typ: "text", text: text, keepNone: true}
			case isJSONString(t, "refusal"):
				return partRead{typ: "text", text: refusal}
			case isJSONString(t, "thinking"):
				return partRead{typ: "text", text: thinking, keepNone: true}
			case isJSONString(t, "tool_reference"):
				return partRead{typ: "tool_reference", text: name, keepNone: true}
			}
			return partRead{}
		}
	}
	switch {
	case byUUID:
		p.id = uuid
	case p.typ == "prompt_embeds":
		p.id = data
	default:
		p.id = src[key]
		if v := p.id; v.e > v.s && d[v.s] == '{' {
			// {"url": ...}: the URL names it.
			forEachField(d, v.s, func(k []byte, ks, ke int) error {
				if string(k) == "url" {
					p.id = span{ks, ke}
				}
				return nil
			})
		}
	}
	return p
}

// partMedia returns the modality vLLM reads a media content part of type
// typ (raw JSON) as, and the untypedMedia key that holds its source; ""
// for another type.
func partMedia(typ []byte) (string, int) {
	if len(typ) < 2 || typ[0] != '"' {
		return "", 0
	}
	for _, m := range partModalities {
		if isJSONString(typ, m.typ) {
			return untypedMedia[m.key][1], m.key
		}
	}
	return "", 0
}

// partModalities are vLLM's media content part types (MM_PARSER_MAP) and
// the untypedMedia key that holds their source (an input_image's
// image_url; a prompt_embeds part's is its data).
var partModalities = [...]struct {
	typ string
	key int
}{{"image_url", 0}, {"input_image", 0}, {"image_pil", 1}, {"image_embeds", 2}, {"audio_embeds", 3},
	{"prompt_embeds", 4}, {"audio_url", 5}, {"input_audio", 6}, {"video_url", 7}}

// untypedMedia are the keys by which vLLM reads a content part without a
// type (or with a uuid), in the order it tries them
// (_parse_chat_message_content_mm_part), with their modality; a
// prompt_embeds part (it needs the engine's --enable-prompt-embeds)
// renders no media part for a template.
var untypedMedia = [...][2]string{{"image_url", "image"}, {"image_pil", "image"}, {"image_embeds", "image"},
	{"audio_embeds", "audio"}, {"prompt_embeds", "prompt_embeds"}, {"audio_url", "audio"}, {"input_audio", "audio"}, {"video_url", "video"}}

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
