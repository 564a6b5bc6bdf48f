package tokenizer

import (
	"bytes"
	"unicode"
	"unsafe"
)

// ContinueFinalMessage cuts rendered, a chat prompt rendered without the
// generation prompt, right after the content of the conversation's final
// message (final), as Hugging Face's apply_chat_template does for
// continue_final_message: the template's end of turn after the content is
// dropped, so the model continues that message. vLLM and SGLang render a
// chat request with "continue_final_message": true so (the Anthropic
// conversion asks for it for an assistant prefill); router and engine must
// cut alike, or the prompt's tokens disagree at its end. A prompt that does
// not hold the content (the engine refuses that request) is returned
// whole. It allocates nothing.
func ContinueFinalMessage(rendered []byte, final string) []byte {
	content := unsafe.Slice(unsafe.StringData(final), len(final))
	trimmed := bytes.TrimFunc(content, pyspace)
	i := bytes.LastIndex(rendered, trimmed)
	if i < 0 {
		return rendered
	}
	// Where the content starts (its leading spacing trimmed) and, when the
	// template kept it whole from there, to its full length; else (the
	// template trimmed its trailing spacing) to its trimmed length.
	if n := len(bytes.TrimLeftFunc(content, pyspace)); i+n <= len(rendered) && string(rendered[i:i+n]) == final {
		return rendered[:i+n]
	}
	return rendered[:i+len(trimmed)]
}

// FinalContent returns the text of m, a conversation's final message, that
// ContinueFinalMessage cuts after, as transformers' apply_chat_template
// finds it: the content, or, when t renders contents as parts (vLLM's
// "openai" content format) and m's was given as an array, the text of its
// last text part ("" when it has none: the engine refuses the request).
func FinalContent(t Tokenizer, m *Message) string {
	if p, ok := t.(interface{ RendersContentParts() bool }); ok && p.RendersContentParts() && m.ContentArray {
		for i := len(m.Parts) - 1; i >= 0; i-- {
			if m.Parts[i].Type == "text" {
				return m.Parts[i].Text
			}
		}
		return ""
	}
	return m.Content
}

// pyspace is Python's str.isspace, which str.strip trims: Go's spaces and
// the separators U+001C..U+001F.
func pyspace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }
