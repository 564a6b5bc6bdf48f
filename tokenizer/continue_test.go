package tokenizer

import "testing"

// ContinueFinalMessage cuts a rendered chat as Hugging Face's
// apply_chat_template does for continue_final_message: after the last
// occurrence of the final content (spacing trimmed), keeping the content's
// own trailing spacing when nothing but spacing follows it; a prompt
// without the content is left whole.
func TestContinueFinalMessageCutsAfterTheFinalContent(t *testing.T) {
	f := func(rendered, final, want string) {
		t.Helper()
		if got := string(ContinueFinalMessage([]byte(rendered), final)); got != want {
			t.Fatalf("ContinueFinalMessage(%q, %q) = %q, want %q", rendered, final, got, want)
		}
	}
	chat := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	f(chat+"Sure<|im_end|>\n", "Sure", chat+"Sure")
	f(chat+"Sure <|im_end|>\n", "Sure ", chat+"Sure ")    // the template kept the trailing spacing: kept
	f(chat+"Sure<|im_end|>\n", "Sure ", chat+"Sure")      // the template trimmed it: cut after the trimmed content
	f(chat+" Sure<|im_end|>\n", " Sure", chat+" Sure")    // leading spacing: cut after the trimmed content
	f(chat+"Sure\n", "Sure\n", chat+"Sure\n")             // a template that ends on the content keeps its spacing
	f(chat+"Sure\n\x1c", "Sure\n\x1c", chat+"Sure\n\x1c") // Python's str.strip trims U+001C too
	f("<|im_start|>user\nSure<|im_end|>\n<|im_start|>assistant\nSure<|im_end|>\n", "Sure",
		"<|im_start|>user\nSure<|im_end|>\n<|im_start|>assistant\nSure") // the last occurrence
	f(chat+"<|im_end|>\n", "", chat+"<|im_end|>\n") // an empty content: nothing to cut after
	f(chat+"Other<|im_end|>\n", "Sure", chat+"Other<|im_end|>\n")
}
