package engine

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"strconv"

	"encoding/json"

	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/jinja"
	"github.com/infera/infera/tokenizer"
)

// genRequest is what the engine needs from an OpenAI request.
type genRequest struct {
	chat         bool
	model        string
	stream       bool
	includeUsage bool
	// continuousUsage: usage in every chunk (continuous_usage_stats,
	// which vLLM honours only with include_usage).
	continuousUsage bool
	maxTokens       int // 0: not given

	// Chat answer shaping (answer.go): whether the request asks the model
	// to reason, and the tool call it would make.
	thinking bool
	tool     *toolPlan
	// format is the answer text a response_format json_schema asks for
	// (guided decoding), split into per-token pieces.
	format []string
}

type chatWire struct {
	Model    string          `json:"model"`
	Messages []messageWire   `json:"messages"`
	Tools    json.RawMessage `json:"tools"`
	// Documents and ChatTemplateKwargs reach the chat template as vLLM
	// passes them (tokenizer.ChatFields).
	Documents           json.RawMessage `json:"documents"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	Stream              streamFlag      `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	// The prompt's end, as vLLM renders it: the generation prompt unless
	// add_generation_prompt is false or the final message is continued.
	AddGenerationPrompt  *laxBool `json:"add_generation_prompt"`
	ContinueFinalMessage laxBool  `json:"continue_final_message"`
	// AddSpecialTokens: the rendered prompt is encoded between the
	// tokenizer's special tokens (vLLM: false by default for a chat).
	AddSpecialTokens *laxBool `json:"add_special_tokens"`

	// Read by answer shaping (answer.go).
	ToolChoice      json.RawMessage `json:"tool_choice"`
	ReasoningEffort *string         `json:"reasoning_effort"`
	ResponseFormat  json.RawMessage `json:"response_format"`
}

type completionWire struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	// AddSpecialTokens: false encodes the prompt without the tokenizer's
	// special tokens (vLLM: true by default for a completion).
	AddSpecialTokens *laxBool       `json:"add_special_tokens"`
	Stream           streamFlag     `json:"stream"`
	StreamOptions    *streamOptions `json:"stream_options"`
	MaxTokens        *int64         `json:"max_tokens"`
}

// streamOptions is a request's stream_options as vLLM's StreamOptions model
// reads it (vllm/entrypoints/openai/protocol.py): include_usage:
// Optional[bool] = True, so an empty object asks for the usage chunk and an
// explicit null (None) does not; continuous_usage_stats: Optional[bool] =
// False, honoured only with include_usage (serving_chat.py); keys matched
// exactly.
type streamOptions struct {
	IncludeUsage, ContinuousUsage bool
	// truthy: the object has a key (a non-empty dict, which vLLM's
	// validate_stream_options refuses without a stream).
	truthy bool
}

func (o *streamOptions) UnmarshalJSON(b []byte) error {
	inc, cont := optBool(true), optBool(false)
	if err := unmarshalExact(b, map[string]any{"include_usage": &inc, "continuous_usage_stats": &cont}); err != nil {
		return err
	}
	o.IncludeUsage, o.ContinuousUsage, o.truthy = bool(inc), bool(inc && cont), pyTruthy(b)
	return nil
}

// streamFlag is a request's stream: its value read as a laxBool, and the
// Python truthiness of its raw JSON value, which vLLM's "before"
// validators test (data.get("stream")).
type streamFlag struct{ on, truthy bool }

func (f *streamFlag) UnmarshalJSON(v []byte) error {
	var b laxBool
	if err := b.UnmarshalJSON(v); err != nil {
		return err
	}
	f.on, f.truthy = bool(b), pyTruthy(v)
	return nil
}

// checkStreamOptions refuses stream_options on a request that does not
// stream, as vLLM's validate_stream_options does: `if
// data.get("stream_options") and not data.get("stream")`, on the raw
// values (so {} passes, and so does "stream":"false").
func checkStreamOptions(stream streamFlag, opts *streamOptions) error {
	if opts != nil && opts.truthy && !stream.truthy {
		return badRequest("Stream options can only be defined when `stream=True`.")
	}
	return nil
}

// pyTruthy reports whether the JSON value v, decoded, is true in Python:
// not null, false, a zero number, an empty string, array or object.
func pyTruthy(v []byte) bool {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return false
	}
	switch v[0] {
	case 'n', 'f':
		return false
	case 't':
		return true
	case '"':
		return len(v) > 2
	case '[', '{':
		return len(bytes.TrimSpace(v[1:len(v)-1])) > 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return err != nil || f != 0
}

// optBool is a pydantic Optional[bool] read in lax mode: as laxBool, but an
// explicit null is None, which vLLM's code takes as false.
type optBool bool

func (b *optBool) UnmarshalJSON(v []byte) error {
	if isNull(v) {
		*b = false
		return nil
	}
	return (*laxBool)(b).UnmarshalJSON(v)
}

// laxBool is a request's bool read as vLLM's pydantic request models read
// one (lax mode, jsonscan.LaxBool): true, 1 and the strings "true", "yes",
// "on", "t", "y", "1" in any ASCII case are true; false, 0 and their
// counterparts false; null leaves the default; anything else is refused.
type laxBool bool

func (b *laxBool) UnmarshalJSON(v []byte) error {
	switch jsonscan.LaxBool(bytes.TrimSpace(v)) {
	case 't':
		*b = true
	case 'f':
		*b = false
	default:
		if !isNull(v) {
			return errors.New("input should be a valid boolean")
		}
	}
	return nil
}

type messageWire struct {
	Role             string               `json:"role"`
	Content          json.RawMessage      `json:"content"`
	Name             string               `json:"name"`
	ToolCallID       string               `json:"tool_call_id"`
	ToolCalls        []tokenizer.ToolCall `json:"tool_calls"`
	Reasoning        *string              `json:"reasoning"`
	ReasoningContent *string              `json:"reasoning_content"` // deprecated name: vLLM reads it when reasoning is absent
}

// UnmarshalJSON reads the request's keys exactly, as vLLM's pydantic
// request model and the router read them: encoding/json also matched
// "Chat_Template_Kwargs" or "Add_Generation_Prompt", which vLLM ignores.
func (w *chatWire) UnmarshalJSON(b []byte) error {
	*w = chatWire{}
	return unmarshalExact(b, map[string]any{
		"model": &w.Model, "messages": &w.Messages, "tools": &w.Tools, "documents": &w.Documents,
		"chat_template_kwargs": &w.ChatTemplateKwargs, "stream": &w.Stream, "stream_options": &w.StreamOptions,
		"max_tokens": &w.MaxTokens, "max_completion_tokens": &w.MaxCompletionTokens,
		"add_generation_prompt": &w.AddGenerationPrompt, "continue_final_message": &w.ContinueFinalMessage,
		"add_special_tokens": &w.AddSpecialTokens, "tool_choice": &w.ToolChoice,
		"reasoning_effort": &w.ReasoningEffort, "response_format": &w.ResponseFormat,
	})
}

// UnmarshalJSON reads the message's keys exactly, as vLLM's chat_utils
// (message.get("content"), ...) and the router read them.
func (m *messageWire) UnmarshalJSON(b []byte) error {
	*m = messageWire{}
	return unmarshalExact(b, map[string]any{
		"role": &m.Role, "content": &m.Content, "name": &m.Name, "tool_call_id": &m.ToolCallID,
		"tool_calls": &m.ToolCalls, "reasoning": &m.Reasoning, "reasoning_content": &m.ReasoningContent,
	})
}

// unmarshalExact decodes the JSON object b into fields, the destination of
// each key, matched exactly (encoding/json matches struct fields ignoring
// case); other keys are ignored. A key given twice counts its last copy.
func unmarshalExact(b []byte, fields map[string]any) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for k, dst := range fields {
		if v, ok := m[k]; ok {
			if err := json.Unmarshal(v, dst); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
	}
	return nil
}

type contentPart struct {
	Type     string
	Text     *string
	Refusal  *string
	Thinking *string
	// Name is a tool_reference part's name.
	Name *string
	// byKeys is the modality of a part vLLM reads by its keys (no type,
	// or a non-null uuid): "image", "audio", "video", or "" for one that
	// renders no media part (prompt_embeds).
	byKeys   string
	readKeys bool
}

// untypedMedia are the keys by which vLLM reads a content part without a
// type (or with a non-null uuid), in the order it tries them
// (_parse_chat_message_content_mm_part in vllm/entrypoints/chat_utils.py),
// with their modality, as the router reads them (proxy.untypedMedia).
var untypedMedia = [...][2]string{{"image_url", "image"}, {"image_pil", "image"}, {"image_embeds", "image"},
	{"audio_embeds", "audio"}, {"prompt_embeds", ""}, {"audio_url", "audio"}, {"input_audio", "audio"}, {"video_url", "video"}}

// UnmarshalJSON reads the part's keys exactly as vLLM's chat_utils reads
// them (part.get("text"), ...): encoding/json would also take "Text" or
// "TYPE", which vLLM and the router ignore. A plain string is a text part
// (vLLM's "Handle plain text parts"); a part without a type, or with a
// non-null uuid, is read by its keys: the first media key it holds makes
// it a media part whatever its type and text say, else a tool_reference
// key makes it a tool_reference part (its name), and one holding neither
// is refused, as vLLM refuses it.
func (p *contentPart) UnmarshalJSON(b []byte) error {
	*p = contentPart{Type: "text"}
	if b = bytes.TrimSpace(b); len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &p.Text)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	typ, uuid := m["type"], m["uuid"]
	if isNull(typ) || !isNull(uuid) {
		for _, mk := range untypedMedia {
			if v, ok := m[mk[0]]; ok && (mk[0] != "input_audio" || !isNull(v)) {
				*p = contentPart{readKeys: true, byKeys: mk[1]}
				return nil
			}
		}
		if _, ok := m["tool_reference"]; ok {
			*p = contentPart{Type: "tool_reference"}
			return unmarshalExact(b, map[string]any{"name": &p.Name})
		}
		return errors.New("a content part without a type (or with a uuid) holds no media")
	}
	*p = contentPart{}
	fields := map[string]any{"type": &p.Type, "text": &p.Text, "refusal": &p.Refusal, "thinking": &p.Thinking}
	if t := ""; json.Unmarshal(typ, &t) == nil && t == "tool_reference" {
		fields["name"] = &p.Name
	}
	return unmarshalExact(b, fields)
}

// errBadRequest marks client errors (400).
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &badRequestError{msg: fmt.Sprintf(format, args...)}
}

func isNull(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

func maxTokensOf(v ...*int64) (int, error) {
	for _, p := range v {
		if p == nil {
			continue
		}
		if *p < 1 || *p > math.MaxInt32 {
			return 0, badRequest("max_tokens must be in [1, %d], got %d", math.MaxInt32, *p)
		}
		return int(*p), nil
	}
	return 0, nil
}

// parseChat decodes a chat completion request and appends its prompt tokens
// to dst. text is a scratch buffer for the rendered prompt.
// defaultKwargs returns tok's default chat_template_kwargs
// (--default-chat-template-kwargs), nil without.
func defaultKwargs(tok tokenizer.Tokenizer) *jinja.Object {
	if h, ok := tok.(*tokenizer.HF); ok {
		return h.DefaultKwargs()
	}
	return nil
}

func parseChat(body []byte, tok tokenizer.Tokenizer, dst []uint32, text []byte) (genRequest, []uint32, []byte, error) {
	var w chatWire
	if err := json.Unmarshal(body, &w); err != nil {
		return genRequest{}, dst, text, badRequest("cannot parse chat completion request: %s", err)
	}
	if len(w.Messages) == 0 {
		return genRequest{}, dst, text, badRequest("messages must be a non-empty array")
	}
	msgs := make([]tokenizer.Message, len(w.Messages))
	for i := range w.Messages {
		m := &w.Messages[i]
		if m.Role == "" {
			return genRequest{}, dst, text, badRequest("messages[%d].role is required", i)
		}
		msgs[i] = tokenizer.Message{
			Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID,
			ToolCalls: m.ToolCalls,
		}
		if err := flattenContent(&msgs[i], m.Content); err != nil {
			return genRequest{}, dst, text, badRequest("messages[%d].content: %s", i, err)
		}
		if r := cmp.Or(m.Reasoning, m.ReasoningContent); r != nil {
			msgs[i].ReasoningContent, msgs[i].HasReasoning = *r, true
		}
	}
	var tools []byte
	if !isNull(w.Tools) {
		tools = w.Tools
	}
	addGen := (w.AddGenerationPrompt == nil || bool(*w.AddGenerationPrompt)) && !bool(w.ContinueFinalMessage)
	f := tokenizer.ChatFields{Tools: tools}
	if !isNull(w.Documents) {
		f.Documents = w.Documents
	}
	if !isNull(w.ChatTemplateKwargs) {
		f.Kwargs = w.ChatTemplateKwargs
	}
	if w.ReasoningEffort != nil {
		switch e := *w.ReasoningEffort; e {
		case "none", "minimal", "low", "medium", "high", "xhigh", "max":
			f.ReasoningEffort = e
		}
	}
	text, err := tokenizer.RenderChatFields(tok, text[:0], msgs, f, addGen)
	if err != nil {
		return genRequest{}, dst, text, badRequest("cannot render chat prompt: %s", err)
	}
	if w.ContinueFinalMessage {
		text = tokenizer.ContinueFinalMessage(text, tokenizer.FinalContent(tok, &msgs[len(msgs)-1]))
	}
	if w.AddSpecialTokens != nil && *w.AddSpecialTokens {
		dst = tokenizer.EncodePrompt(tok, dst, text)
	} else {
		dst = tok.Encode(dst, text)
	}
	mt, err := maxTokensOf(w.MaxCompletionTokens, w.MaxTokens)
	if err != nil {
		return genRequest{}, dst, text, err
	}
	if err := checkStreamOptions(w.Stream, w.StreamOptions); err != nil {
		return genRequest{}, dst, text, err
	}
	g := genRequest{chat: true, model: w.Model, stream: w.Stream.on, maxTokens: mt,
		thinking: wantsThinking(&w, defaultKwargs(tok)), tool: chooseTool(&w), format: formatPieces(w.ResponseFormat)}
	if w.StreamOptions != nil {
		g.includeUsage, g.continuousUsage = w.StreamOptions.IncludeUsage, w.StreamOptions.ContinuousUsage
	}
	return g, dst, text, nil
}

// flattenContent sets m's content from raw (a string, null, or an array of
// parts) as the router sets it (proxy.decodeMessages): Content as vLLM
// flattens it for a template that takes content as a string (the non-empty
// texts of the text parts, of vLLM's text part types, joined by "\n"), and for an array
// its text parts (and media parts, as their modality) for a template that
// loops over the content.
func flattenContent(m *tokenizer.Message, raw json.RawMessage) error {
	if isNull(raw) {
		m.NoContent = true
		return nil
	}
	b := bytes.TrimSpace(raw)
	switch b[0] {
	case '"':
		return json.Unmarshal(b, &m.Content)
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var sb []byte
		n := 0
		m.ContentArray = true
		for _, p := range parts {
			if p.readKeys {
				if p.byKeys != "" {
					m.Parts = append(m.Parts, tokenizer.ContentPart{Type: p.byKeys})
				}
				continue
			}
			switch p.Type {
			case "image_url", "input_image", "image_pil", "image_embeds":
				m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "image"})
			case "audio_url", "input_audio", "audio_embeds":
				m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "audio"})
			case "video_url":
				m.Parts = append(m.Parts, tokenizer.ContentPart{Type: "video"})
			}
			// vLLM's text part types (chat_utils' TEXT_PART_TYPES), each
			// a text part; a null text drops a "text" or "refusal" part,
			// and the others only from the joined string.
			var text *string
			keepNone, ptype := false, "text"
			switch p.Type {
			case "text":
				text = p.Text
			case "input_text", "output_text":
				text, keepNone = p.Text, true
			case "refusal":
				text = p.Refusal
			case "thinking":
				text, keepNone = p.Thinking, true
			case "tool_reference":
				// Its name: a text for a template that takes a
				// string, a tool_reference part for one that loops.
				text, keepNone, ptype = p.Name, true, "tool_reference"
			default:
				continue
			}
			if text == nil {
				if keepNone {
					m.Parts = append(m.Parts, tokenizer.ContentPart{Type: ptype, NullText: true})
				}
				continue
			}
			m.Parts = append(m.Parts, tokenizer.ContentPart{Type: ptype, Text: *text})
			if *text == "" {
				continue
			}
			if n > 0 {
				sb = append(sb, '\n')
			}
			n++
			sb = append(sb, *text...)
		}
		m.Content = string(sb)
		return nil
	}
	return errors.New("must be a string or an array of content parts")
}

// parseCompletion decodes a completion request and appends its prompt tokens
// to dst.
func parseCompletion(body []byte, tok tokenizer.Tokenizer, dst []uint32) (genRequest, []uint32, error) {
	var w completionWire
	if err := json.Unmarshal(body, &w); err != nil {
		return genRequest{}, dst, badRequest("cannot parse completion request: %s", err)
	}
	if isNull(w.Prompt) {
		return genRequest{}, dst, badRequest("prompt is required")
	}
	special := w.AddSpecialTokens == nil || bool(*w.AddSpecialTokens)
	dst, err := promptTokens(dst, w.Prompt, tok, special, 0)
	if err != nil {
		return genRequest{}, dst, err
	}
	mt, err := maxTokensOf(w.MaxTokens)
	if err != nil {
		return genRequest{}, dst, err
	}
	if err := checkStreamOptions(w.Stream, w.StreamOptions); err != nil {
		return genRequest{}, dst, err
	}
	g := genRequest{model: w.Model, stream: w.Stream.on, maxTokens: mt}
	if w.StreamOptions != nil {
		g.includeUsage, g.continuousUsage = w.StreamOptions.IncludeUsage, w.StreamOptions.ContinuousUsage
	}
	return g, dst, nil
}

// promptTokens handles "text", ["text"], [1,2,3] and [[1,2,3]]. A batch of
// several prompts is refused: the engine serves one sequence per request
// (answering the first alone, with 200, dropped the others silently).
func promptTokens(dst []uint32, raw json.RawMessage, tok tokenizer.Tokenizer, special bool, depth int) ([]uint32, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return dst, badRequest("prompt is required")
	}
	switch b[0] {
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return dst, badRequest("cannot parse prompt: %s", err)
		}
		if !special {
			return tok.Encode(dst, []byte(s)), nil
		}
		return tokenizer.EncodePrompt(tok, dst, []byte(s)), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(b, &items); err != nil {
			return dst, badRequest("cannot parse prompt: %s", err)
		}
		if len(items) == 0 {
			return dst, badRequest("prompt must not be empty")
		}
		first := bytes.TrimSpace(items[0])
		if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			if depth > 0 {
				return dst, badRequest("prompt nests too deeply")
			}
			if len(items) > 1 {
				return dst, badRequest("%d prompts in one request: infera engine serves one prompt per request (batched prompts are not modelled)", len(items))
			}
			return promptTokens(dst, first, tok, special, depth+1)
		}
		for i, it := range items {
			var v int64
			if err := json.Unmarshal(it, &v); err != nil {
				return dst, badRequest("prompt[%d] must be a token id: %s", i, err)
			}
			if v < 0 || v > math.MaxUint32 {
				return dst, badRequest("prompt[%d] token id %d out of range", i, v)
			}
			dst = append(dst, uint32(v))
		}
		return dst, nil
	}
	return dst, badRequest("prompt must be a string, an array of strings or an array of token ids")
}
