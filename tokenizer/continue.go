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
	trimmed := bytes.TrimFunc(unsafe.Slice(unsafe.StringData(final), len(final)), pyspace)
	i := bytes.LastIndex(rendered, trimmed)
	if i < 0 {
		return rendered
	}
	n := len(trimmed)
	if bytes.Equal(bytes.TrimFunc(rendered[i:], pyspace), trimmed) {
		// Nothing but spacing after the content: the content's own
		// trailing spacing is kept (Hugging Face cuts at its full length).
		n = len(final)
	}
	return rendered[:min(i+n, len(rendered))]
}

// pyspace is Python's str.isspace, which str.strip trims: Go's spaces and
// the separators U+001C..U+001F.
func pyspace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }
