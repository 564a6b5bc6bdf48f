package proxy

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/infera/infera/tokenizer"
)

func FuzzDecodeMessages(f *testing.F) {
	for _, s := range []string{
		chatBody, streamBody,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x\ud83d\ude00"}],"tool_calls":[{"id":"1","function":{"name":"f","arguments":{"a":1}}}]}]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","text":"b"},{"type":"text","text":""},{"text":"c","type":"t\u0065xt","text":"d"},{"type":"text","text":"e","text":1}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"refusal","refusal":"r","text":"x"},{"type":"thinking","thinking":null},{"type":"output_text"},{"type":"refusal"},{"type":"output_text","text":""}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rs := &reqState{}
		for _, kind := range []int{kindChat, kindCompletion} {
			if rs.parsed.parse(data, kind) != nil {
				continue
			}
			rs.rewriteModel(data, "other")
			if kind == kindChat {
				b := &rs.parsed
				arr := data[b.msgStart:b.msgEnd]
				size := len(arr)
				msgs := decodeMessages(nil, arr, b.msgSpans, &rs.arena, true)
				// Every decoded string lives in the arena, which never
				// outgrows the messages array: nothing was reallocated
				// under them.
				if len(rs.arena) > size {
					t.Fatalf("arena %d bytes > messages %d", len(rs.arena), size)
				}
				// The parse's spans decode as a walk of the array does.
				var ref []byte
				want, err := decodeMessagesWalk(nil, arr, &ref)
				if err != nil {
					t.Fatalf("the parse accepted messages the walk refuses: %v", err)
				}
				if len(want) > maxRouteMessages {
					want = want[:maxRouteMessages] // the rest is only weighed
				}
				if !reflect.DeepEqual(normalize(msgs), normalize(want)) {
					t.Fatalf("decoded from spans:\n%#v\nwalked:\n%#v", msgs, want)
				}
				// Rendering works on the decoded messages.
				tokenizer.Simple{}.RenderChat(nil, msgs, nil, true)
			}
			rs.parsed.estimateTokens()
		}
	})
}

// normalize makes empty and nil tool-call lists compare equal.
func normalize(ms []tokenizer.Message) []tokenizer.Message {
	out := make([]tokenizer.Message, len(ms))
	for i, m := range ms {
		if len(m.ToolCalls) == 0 {
			m.ToolCalls = nil
		}
		if len(m.Parts) == 0 {
			m.Parts = nil
		}
		out[i] = m
	}
	return out
}

// decodeMessagesWalk is the reference decodeMessages is checked against: it
// walks the messages array itself instead of using the parse's spans.
func decodeMessagesWalk(msgs []tokenizer.Message, d []byte, arena *[]byte) ([]tokenizer.Message, error) {
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
		m.NoContent = true // until a content that is not null
		_, err := forEachField(d, vs, func(key []byte, s, e int) error {
			switch string(key) {
			case "role":
				m.Role = str(d[s:e])
			case "content":
				m.NoContent, m.ContentArray, m.Parts = d[s] == 'n', false, nil
				if d[s] == '[' {
					// vLLM: "\n".join of the non-empty texts of its text
					// parts (plain strings included); the parts as vLLM keeps them for a template
					// that loops over the content.
					m.ContentArray = true
					var texts []string
					forEachElem(d, s, func(ps, pe int) error {
						if d[ps] == '"' { // a plain string: a text part
							v := string(unescape(nil, d[ps+1:pe-1]))
							m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "text", Text: v})
							if v != "" {
								texts = append(texts, v)
							}
						}
						if d[ps] == '{' {
							var typ string
							vals := map[string]string{} // text, refusal, thinking
							strs := map[string]bool{}   // ... given as a string
							nulls := map[string]bool{}  // ... given as null
							typed, uuid := false, false
							keys := map[string]bool{} // present (input_audio: not null)
							forEachField(d, ps, func(k []byte, ks, ke int) error {
								v := "" // the last of duplicate keys counts
								if d[ks] == '"' {
									v = string(unescape(nil, d[ks+1:ke-1]))
								}
								keys[string(k)] = string(k) != "input_audio" || d[ks] != 'n'
								switch string(k) {
								case "uuid":
									uuid = d[ks] != 'n'
								case "type":
									typ, typed = v, d[ks] != 'n'
									if !typed {
										typ = ""
									}
								case "text", "refusal", "thinking", "name":
									vals[string(k)], strs[string(k)], nulls[string(k)] = v, d[ks] == '"', d[ks] == 'n'
								}
								return nil
							})
							if !typed || uuid {
								// vLLM reads it by its keys, in this order.
								for _, mk := range [][2]string{{"image_url", "image"}, {"image_pil", "image"}, {"image_embeds", "image"},
									{"audio_embeds", "audio"}, {"prompt_embeds", ""}, {"audio_url", "audio"}, {"input_audio", "audio"}, {"video_url", "video"}} {
									if keys[mk[0]] {
										if mk[1] != "" {
											m.Parts = append(m.Parts, tokenizer.ContentPart{Type: mk[1]})
										}
										return nil
									}
								}
								if !keys["tool_reference"] {
									return nil
								}
								typ = "tool_reference"
							}
							key, keepNone, ptype := "", false, "text" // vLLM's TEXT_PART_TYPES, and tool_reference
							switch typ {
							case "image_url", "input_image", "image_pil", "image_embeds":
								m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "image"})
							case "audio_url", "input_audio", "audio_embeds":
								m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "audio"})
							case "video_url":
								m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "video"})
							case "text":
								key = "text"
							case "input_text", "output_text":
								key, keepNone = "text", true
							case "refusal":
								key = "refusal"
							case "thinking":
								key, keepNone = "thinking", true
							case "tool_reference":
								key, keepNone, ptype = "name", true, "tool_reference"
							}
							_, given := vals[key]
							switch {
							case key == "":
							case !given || nulls[key]:
								if keepNone {
									m.Parts = append(m.Parts, tokenizer.ContentPart{Type: ptype, NullText: true})
								}
							case strs[key]:
								m.Parts = append(m.Parts, tokenizer.ContentPart{Type: ptype, Text: vals[key]})
								if vals[key] != "" {
									texts = append(texts, vals[key])
								}
							}
						}
						return nil
					})
					start := len(a)
					a = append(a, strings.Join(texts, "\n")...)
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

// FuzzTransferEncodingFieldIsFoundAsAFieldName checks the raw-head scan
// for a Transfer-Encoding field against splitting the head into lines and
// comparing each line's name.
func FuzzTransferEncodingFieldIsFoundAsAFieldName(f *testing.F) {
	f.Add([]byte("Host: x\r\nTransfer-Encoding: identity\r\n\r\n"))
	f.Add([]byte("Host: x\r\nX-Transfer-Encoding: identity\r\n\r\n"))
	f.Add([]byte("transfer-encoding:identity"))
	f.Add([]byte("Host: transfer-encoding: x\r\n"))
	f.Add([]byte("TRANSFER-ENCODING"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		want := false
		for _, line := range bytes.Split(raw, []byte("\n")) {
			name, _, ok := bytes.Cut(line, []byte(":"))
			if ok && bytes.EqualFold(name, []byte("transfer-encoding")) {
				want = true
			}
		}
		if got := hasTransferEncoding(raw); got != want {
			t.Fatalf("hasTransferEncoding(%q) = %v, want %v", raw, got, want)
		}
	})
}
