package protocol

import (
	"strings"
	"testing"
)

// ChatMessagesN decodes at most its limit of messages and weighs the rest
// as the decoded ones are measured (one per message plus the decoded
// text): escapes, quotes and image data do not count (they made
// count_tokens overcount long conversations up to 14 times).
func TestChatMessagesNDecodesAtMostItsLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"messages":[`)
	for i := 0; i < 10; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"hello"}`)
	}
	b.WriteString(`]}`)
	var arena []byte
	msgs, _, rest, err := ChatMessagesN(nil, []byte(b.String()), &arena, 4)
	if err != nil || len(msgs) != 4 || msgs[3].Content != "hello" {
		t.Fatalf("%d messages, %v", len(msgs), err)
	}
	if want := 6 * (1 + len("hello")); rest != want {
		t.Fatalf("rest %d, want %d", rest, want)
	}
	// Escaped text, parts with an image, tool call arguments.
	odd := `{"messages":[{"role":"user","content":"x"},` +
		`{"role":"user","content":"\u4e2d\u6587"},` +
		`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 1000) + `"}},{"type":"text","text":"ab"},{"type":"text","text":"cd"}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}]}`
	_, _, rest, err = ChatMessagesN(nil, []byte(odd), &arena, 1)
	if want := (1 + len("中文")) + (1 + len("ab\ncd")) + (1 + len(`{"a":1}`)); err != nil || rest != want {
		t.Fatalf("rest %d, want %d (%v)", rest, want, err)
	}
	all, _, rest, err := ChatMessagesN(nil, []byte(b.String()), &arena, 0)
	if err != nil || len(all) != 10 || rest != 0 {
		t.Fatalf("no limit: %d messages, rest %d, %v", len(all), rest, err)
	}
}

// A message's reasoning is decoded as vLLM reads it: reasoning when given
// (not null), else the deprecated reasoning_content; an empty one is given.
// count_tokens and the engine's native protocols decoded reasoning_content
// alone.
func TestChatMessagesReadReasoningAsVLLMDoes(t *testing.T) {
	for _, c := range []struct {
		fields string
		want   string
		has    bool
	}{
		{`"reasoning":"R1"`, "R1", true},
		{`"reasoning":"R1","reasoning_content":"R2"`, "R1", true},
		{`"reasoning_content":"R2","reasoning":"R1"`, "R1", true},
		{`"reasoning":null,"reasoning_content":"R2"`, "R2", true},
		{`"reasoning_content":""`, "", true},
		{`"reasoning_content":null`, "", false},
		{`"reasoning":5`, "", false},
	} {
		var arena []byte
		msgs, _, err := ChatMessages(nil, []byte(`{"messages":[{"role":"assistant","content":"x",`+c.fields+`}]}`), &arena)
		if err != nil || len(msgs) != 1 {
			t.Fatalf("%s: %v %d", c.fields, err, len(msgs))
		}
		if m := msgs[0]; m.ReasoningContent != c.want || m.HasReasoning != c.has {
			t.Errorf("%s: reasoning %q given %v, want %q %v", c.fields, m.ReasoningContent, m.HasReasoning, c.want, c.has)
		}
	}
}
