// Package tokenizer turns prompts into token ids for KV-aware routing and for
// the simulated engine's KV cache.
//
// Two implementations share one interface: the Hugging Face byte-level BPE
// tokenizer with its Jinja chat template (loaded from a model directory), and
// Simple, a dependency-free fallback used when no tokenizer is configured.
// Router and engine must use the same one, or their block hashes disagree.
package tokenizer

import (
	"encoding/binary"
	"slices"
	"unsafe"
)

// Message is one chat message (OpenAI shape, content flattened to text).
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Name       string     `json:"name,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	// ReasoningContent is an assistant's reasoning, rendered by templates
	// that know it (Qwen3) as vLLM hands it to them: as both `reasoning`
	// and `reasoning_content`, on assistant messages only.
	ReasoningContent string `json:"reasoning_content,omitempty"`
	// HasReasoning marks a reasoning given empty: vLLM renders "" (a
	// string, which Qwen3's template takes over the content's think
	// block), unlike an absent one. A non-empty ReasoningContent is given.
	HasReasoning bool `json:"-"`
	// ContentArray marks a content given as an array of parts: Parts are
	// its parts as vLLM keeps them for a template that loops over the
	// content (the "openai" content format), and Content their texts as
	// vLLM joins them for one that does not (the non-empty texts joined by
	// "\n"). NoContent marks a content absent or null.
	ContentArray, NoContent bool          `json:"-"`
	Parts                   []ContentPart `json:"-"`
}

// ContentPart is one part of a message's content as vLLM hands it to a
// template in the "openai" content format: {"type": "text", "text": Text}
// for a text part (of any of vLLM's text part types: "text", "input_text",
// "output_text", "refusal", "thinking"), {"type": Type} for media
// ("image", "audio", "video"), and {"type": "tool_reference", "name":
// Text} for a reference to a deferred tool (Type "tool_reference").
type ContentPart struct {
	Type, Text string
	// NullText: the text is None (an "input_text", "output_text" or
	// "thinking" part whose text is null or absent, which vLLM keeps), or
	// the tool_reference's name is.
	NullText bool
}

// ToolCall is an assistant's function call.
type ToolCall struct {
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Tokenizer encodes text and renders chat conversations.
// Implementations are safe for concurrent use.
type Tokenizer interface {
	// Encode appends the token ids of text to dst. Special tokens written
	// literally in text are recognised.
	Encode(dst []uint32, text []byte) []uint32
	// RenderChat appends the prompt text of a chat conversation to dst.
	// tools is the raw JSON array of tool definitions, or nil. It must not
	// retain msgs or their strings after returning (callers reuse them).
	RenderChat(dst []byte, msgs []Message, tools []byte, addGenerationPrompt bool) ([]byte, error)
}

// ChatFields are the fields of a chat request that vLLM passes to the chat
// template besides its messages, as raw JSON (nil when absent).
type ChatFields struct {
	// Tools is the tools array.
	Tools []byte
	// Documents is the documents array (RAG templates read it).
	Documents []byte
	// Kwargs is chat_template_kwargs, a JSON object (or null): its keys
	// are template variables merged as vLLM merges them (HF.render): over
	// tools and the special tokens, under the request's own
	// add_generation_prompt, documents and reasoning_effort, for example
	// Qwen3's enable_thinking; a null or "auto" value is dropped.
	// apply_chat_template's own parameters (chat_template,
	// continue_final_message, ...) are not variables.
	Kwargs []byte
	// ReasoningEffort is the request's reasoning_effort ("" when absent or
	// null). vLLM passes it to the template as the reasoning_effort
	// variable, over chat_template_kwargs' (gpt-oss and Qwen3.8 read it),
	// and, unless chat_template_kwargs names enable_thinking, sets
	// enable_thinking to whether it is other than "none" (vLLM PR #43401:
	// ChatCompletionRequest.build_chat_params, merged with
	// renderers.merge_kwargs).
	ReasoningEffort string
}

// FieldsRenderer is a Tokenizer whose chat template reads ChatFields (HF;
// Simple renders tools only, as infera engine does).
type FieldsRenderer interface {
	RenderChatFields(dst []byte, msgs []Message, f ChatFields, addGenerationPrompt bool) ([]byte, error)
}

var _ FieldsRenderer = (*HF)(nil)

// RenderChatFields renders msgs with t, with f when t reads it
// (FieldsRenderer), else with f.Tools only.
func RenderChatFields(t Tokenizer, dst []byte, msgs []Message, f ChatFields, addGenerationPrompt bool) ([]byte, error) {
	if fr, ok := t.(FieldsRenderer); ok {
		return fr.RenderChatFields(dst, msgs, f, addGenerationPrompt)
	}
	return t.RenderChat(dst, msgs, f.Tools, addGenerationPrompt)
}

// PromptSpecials is a tokenizer that puts special tokens around a plain
// prompt's tokens, as the engine does for a completion's prompt (HF: a
// BOS before from its post-processor, an EOS after for a
// tokenizer_config.json with add_eos_token).
type PromptSpecials interface {
	PromptSpecialTokens() (prefix, suffix []uint32)
}

var _ PromptSpecials = (*HF)(nil)

// AppendPromptPrefix appends t's prompt prefix (PromptSpecials), if any.
func AppendPromptPrefix(t Tokenizer, dst []uint32) []uint32 {
	if p, ok := t.(PromptSpecials); ok {
		prefix, _ := p.PromptSpecialTokens()
		dst = append(dst, prefix...)
	}
	return dst
}

// AppendPromptSuffix appends t's prompt suffix (PromptSpecials), if any.
func AppendPromptSuffix(t Tokenizer, dst []uint32) []uint32 {
	if p, ok := t.(PromptSpecials); ok {
		_, suffix := p.PromptSpecialTokens()
		dst = append(dst, suffix...)
	}
	return dst
}

// EncodePrompt appends the token ids of a plain (not chat) prompt to dst:
// t's prompt prefix, if any, then text's ids, then t's prompt suffix, if
// any.
func EncodePrompt(t Tokenizer, dst []uint32, text []byte) []uint32 {
	return AppendPromptSuffix(t, t.Encode(AppendPromptPrefix(t, dst), text))
}

// Decoder is a tokenizer that can turn token ids back into text (both
// tokenizers here can).
type Decoder interface {
	// AppendDecode appends the text of ids to dst; ids the vocabulary does
	// not hold are skipped.
	AppendDecode(dst []byte, ids []uint32) []byte
}

var (
	_ Decoder = Simple{}
	_ Decoder = (*HF)(nil)
)

// Simple is the fallback tokenizer: every 4 bytes of text are one token whose
// id is those bytes read little-endian (a short tail is zero-padded). It is
// prefix-stable: texts sharing their first 4k bytes share their first k tokens.
type Simple struct{}

var _ Tokenizer = Simple{}

// Encode implements Tokenizer. On a little-endian machine a token's id
// is its 4 bytes as they lie in memory, so the text is copied into the ids
// at once: a 1 KB prompt took 4,000 instructions word by word (a 6th of
// what the kv-aware path adds to a request) and takes a memmove now.
func (Simple) Encode(dst []uint32, text []byte) []uint32 {
	if !littleEndian {
		return encodeWords(dst, text)
	}
	n := (len(text) + 3) / 4
	dst = slices.Grow(dst, n)
	ids := dst[len(dst) : len(dst)+n]
	if n > 0 {
		ids[n-1] = 0 // the zero padding of a short tail
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*n), text)
	}
	return dst[:len(dst)+n]
}

// littleEndian reports whether this machine stores a uint32's low byte
// first.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// encodeWords is Simple's encoding spelled out: each 4 bytes of text read
// little-endian, a short tail zero-padded.
func encodeWords(dst []uint32, text []byte) []uint32 {
	for len(text) >= 4 {
		dst = append(dst, binary.LittleEndian.Uint32(text))
		text = text[4:]
	}
	if len(text) > 0 {
		var b [4]byte
		copy(b[:], text)
		dst = append(dst, binary.LittleEndian.Uint32(b[:]))
	}
	return dst
}

// AppendDecode implements Decoder: each id's 4 bytes, the zero padding of
// a short tail dropped.
func (Simple) AppendDecode(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], id)
		n := 4
		for n > 0 && b[n-1] == 0 {
			n--
		}
		dst = append(dst, b[:n]...)
	}
	return dst
}

// RenderChat implements Tokenizer with a ChatML-like layout.
func (Simple) RenderChat(dst []byte, msgs []Message, tools []byte, addGenerationPrompt bool) ([]byte, error) {
	if len(tools) > 0 {
		dst = append(dst, "<|im_start|>tools\n"...)
		dst = append(dst, tools...)
		dst = append(dst, "<|im_end|>\n"...)
	}
	for i := range msgs {
		m := &msgs[i]
		dst = append(dst, "<|im_start|>"...)
		dst = append(dst, m.Role...)
		dst = append(dst, '\n')
		dst = append(dst, m.Content...)
		for j := range m.ToolCalls {
			dst = append(dst, "\n<tool_call>"...)
			dst = append(dst, m.ToolCalls[j].Function.Name...)
			dst = append(dst, ' ')
			dst = append(dst, m.ToolCalls[j].Function.Arguments...)
			dst = append(dst, "</tool_call>"...)
		}
		dst = append(dst, "<|im_end|>\n"...)
	}
	if addGenerationPrompt {
		dst = append(dst, "<|im_start|>assistant\n"...)
	}
	return dst, nil
}
