package proxy

import (
	"testing"

	"github.com/infera/infera/tokenizer"
)

func FuzzDecodeMessages(f *testing.F) {
	for _, s := range []string{
		chatBody, streamBody,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x\ud83d\ude00"}],"tool_calls":[{"id":"1","function":{"name":"f","arguments":{"a":1}}}]}]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
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
				span := data[rs.parsed.msgStart:rs.parsed.msgEnd]
				msgs, err := decodeMessages(nil, span, &rs.arena)
				if err == nil {
					// Every decoded string lives in the arena, which never
					// outgrows the span: nothing was reallocated under them.
					if len(rs.arena) > len(span) {
						t.Fatalf("arena %d bytes > span %d", len(rs.arena), len(span))
					}
					// Rendering works on the decoded messages.
					tokenizer.Simple{}.RenderChat(nil, msgs, nil, true)
				}
			}
			rs.parsed.estimateTokens()
		}
	})
}
