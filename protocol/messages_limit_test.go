package protocol

import (
	"strings"
	"testing"
)

// ChatMessagesN decodes at most its limit of messages and weighs the rest
// from their encoded lengths.
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
	if want := 6 * (1 + len(`"hello"`)); rest != want {
		t.Fatalf("rest %d, want %d", rest, want)
	}
	all, _, rest, err := ChatMessagesN(nil, []byte(b.String()), &arena, 0)
	if err != nil || len(all) != 10 || rest != 0 {
		t.Fatalf("no limit: %d messages, rest %d, %v", len(all), rest, err)
	}
}
