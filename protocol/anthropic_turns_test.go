package protocol

import "testing"

// The Messages API combines consecutive turns of one role into one turn;
// the converter writes each such run as one turn holding all its blocks,
// in order. Chat templates that want roles to alternate (Mistral's,
// Gemma's, Gemma 3's with images) refuse the turns apart, and chat wants
// tool messages right after the assistant message whose calls they answer.
// The tests compare the exact bytes written.

// turnsCase converts a Messages body whose messages array is msgs and
// compares the chat body byte for byte with wantMsgs (its messages array)
// and tail (the fields after max_tokens); count_tokens must render the
// same messages.
func turnsCase(t *testing.T, name, msgs, wantMsgs, tail string) {
	t.Helper()
	opt := DefaultOptions()
	var m Meta
	body := `{"model":"m","max_tokens":1,"messages":[` + msgs + `]}`
	got, err := AnthropicToChat(nil, []byte(body), &opt, &m)
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	want := `{"model":"m","messages":[` + wantMsgs + `],"max_tokens":1` + tail + `}`
	if string(got) != want {
		t.Errorf("%s:\n got %s\nwant %s", name, got, want)
	}
	// count_tokens renders the same prompt
	got, err = AnthropicCountTokensToChat(nil, []byte(body), &opt, &m)
	if want := `{"model":"m","messages":[` + wantMsgs + `]` + tail + `}`; err != nil || string(got) != want {
		t.Errorf("%s (count_tokens): %v\n got %s\nwant %s", name, err, got, want)
	}
}

func TestConsecutiveUserTurnsWithImagesBecomeOneMessage(t *testing.T) {
	f := func(name, msgs, want string) {
		t.Helper()
		turnsCase(t, name, msgs, want, "")
	}
	f("a text turn, then an image turn",
		`{"role":"user","content":"look at these"},
		{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"text","text":"and this one"}]}`,
		`{"role":"user","content":[{"type":"text","text":"look at these"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"and this one"}]}`)
	f("an image turn, then text turns (a string and text blocks)",
		`{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://e.x/a.png"}}]},
		{"role":"user","content":"what is it?"},
		{"role":"user","content":[{"type":"text","text":"be"},{"type":"text","text":"brief"}]}`,
		`{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://e.x/a.png"}},{"type":"text","text":"what is it?"},{"type":"text","text":"be"},{"type":"text","text":"brief"}]}`)
	f("images in both turns, a text document, escapes kept",
		`{"role":"user","content":[{"type":"text","text":"a\"b\n"},{"type":"image","source":{"type":"url","url":"u1"}}]},
		{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}},{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/"}}]}`,
		`{"role":"user","content":[{"type":"text","text":"a\"b\n"},{"type":"image_url","image_url":{"url":"u1"}},{"type":"text","text":"doc"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/"}}]}`)
	f("the later turns of a conversation",
		`{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},
		{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}}]},{"role":"user","content":"describe"}`,
		`{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"describe"}]}`)
	f("a long run parted by system messages moved to the front",
		`{"role":"user","content":"1"},{"role":"user","content":"2"},{"role":"system","content":"s1"},{"role":"user","content":"3"},
		{"role":"user","content":[{"type":"text","text":"4"}]},{"role":"system","content":"s2"},{"role":"user","content":"5"},
		{"role":"system","content":"s3"},{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u6"}}]},{"role":"user","content":"7"}`,
		`{"role":"system","content":"s1s2s3"},{"role":"user","content":[{"type":"text","text":"1"},{"type":"text","text":"2"},{"type":"text","text":"3"},{"type":"text","text":"4"},{"type":"text","text":"5"},{"type":"image_url","image_url":{"url":"u6"}},{"type":"text","text":"7"}]}`)
	f("an empty turn adds nothing",
		`{"role":"user","content":[]},{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}}]},{"role":"user","content":[]}`,
		`{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}`)
}

// Tool results become tool messages written first, in their order, so
// they follow the assistant's calls; the other blocks of the run, images
// returned inside tool results included, make one user message after them.
// Anthropic refuses text before the tool results of a turn (400); the
// converter moves it after them, as it does inside one turn.
func TestUserTurnsNextToToolResultsWriteToolMessagesFirst(t *testing.T) {
	f := func(name, msgs, want string) {
		t.Helper()
		turnsCase(t, name, msgs, want, "")
	}
	call := `{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]}`
	callOut := `{"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}}]}`
	f("a text turn before the tool results moves after them",
		call+`,{"role":"user","content":"c"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]},{"role":"user","content":"d"}`,
		callOut+`,{"role":"tool","tool_call_id":"t1","content":"r"},{"role":"user","content":"c\nd"}`)
	f("results over two turns, then text and images",
		`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}},{"type":"tool_use","id":"t2","name":"g","input":{"a":1}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r1"},{"type":"image","source":{"type":"url","url":"u1"}}]}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"r2"},{"type":"text","text":"both"}]},
		{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u2"}}]}`,
		`{"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"t2","type":"function","function":{"name":"g","arguments":"{\"a\":1}"}}]},`+
			`{"role":"tool","tool_call_id":"t1","content":"r1"},{"role":"tool","tool_call_id":"t2","content":"r2"},`+
			`{"role":"user","content":[{"type":"image_url","image_url":{"url":"u1"}},{"type":"text","text":"both"},{"type":"image_url","image_url":{"url":"u2"}}]}`)
	f("tool results only: tool messages, no user message",
		call+`,{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]},{"role":"user","content":[]}`,
		callOut+`,{"role":"tool","tool_call_id":"t1","content":"r"}`)
}

// An assistant run is one assistant message: its texts joined with '\n'
// as content, its thinking as reasoning_content, and all its tool_use
// blocks as tool_calls, so the tool messages that answer them follow it.
func TestConsecutiveAssistantTurnsWithToolCallsBecomeOneMessage(t *testing.T) {
	turnsCase(t, "text, a call, thinking and a call",
		`{"role":"user","content":"weather in Paris and Rome?"},
		{"role":"assistant","content":"checking"},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"w","input":{"city":"Paris"}}]},
		{"role":"assistant","content":[{"type":"thinking","thinking":"Rome too","signature":"s"},{"type":"text","text":"and"},{"type":"tool_use","id":"t2","name":"w","input":{"city":"Rome"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sun"},{"type":"tool_result","tool_use_id":"t2","content":"rain"}]}`,
		`{"role":"user","content":"weather in Paris and Rome?"},`+
			`{"role":"assistant","content":"checking\nand","reasoning_content":"Rome too","tool_calls":[{"id":"t1","type":"function","function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}},{"id":"t2","type":"function","function":{"name":"w","arguments":"{\"city\":\"Rome\"}"}}]},`+
			`{"role":"tool","tool_call_id":"t1","content":"sun"},{"role":"tool","tool_call_id":"t2","content":"rain"}`, "")
	turnsCase(t, "a final run is one message to continue",
		`{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"}]},{"role":"assistant","content":"Sure"}`,
		`{"role":"user","content":"x"},{"role":"assistant","content":"Sure","reasoning_content":"t"}`,
		`,"add_generation_prompt":false,"continue_final_message":true`)
}
