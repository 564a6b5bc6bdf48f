package proxy

import "testing"

func FuzzReviewDecode(f *testing.F) {
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
			if rs.body.parse(data, kind) != nil {
				continue
			}
			rs.rewriteModel(data, "other")
			if kind == kindChat {
				decodeMessages(nil, data[rs.body.msgStart:rs.body.msgEnd])
			}
			rs.body.estimateTokens()
		}
	})
}
