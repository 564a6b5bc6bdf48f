package bench

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"
)

func BenchmarkAppendBody(b *testing.B) {
	lc := DefaultLoadConfig()
	r := TraceRequest{InputLength: 8192, OutputLength: 128, HashIDs: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}
	var body, scratch []byte
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		body, scratch = lc.AppendBody(body[:0], scratch, &r, i)
	}
	b.SetBytes(int64(len(body)))
}

func sseStream(chunks int) []byte {
	var s strings.Builder
	s.WriteString("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	for range chunks {
		s.WriteString("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n")
	}
	s.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":64,\"total_tokens\":164,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\ndata: [DONE]\n\n")
	return []byte(s.String())
}

func TestReadSSE(t *testing.T) {
	c := &Client{keep: true}
	st := &sseState{br: bufio.NewReader(bytes.NewReader(sseStream(64)))}
	var res Result
	if err := c.readSSE(st, time.Now(), &res); err != nil {
		t.Fatal(err)
	}
	if res.OutputTokens != 64 || res.PromptTokens != 100 || res.CachedTokens != 48 || res.ITLCount != 63 {
		t.Fatalf("parsed %+v", res)
	}
	if len(c.TakeITLs()) != 63 {
		t.Fatal("ITLs not kept")
	}
	// No usage: tokens are counted from content chunks; empty role chunk is not a token.
	st.br.Reset(strings.NewReader("data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n"))
	res = Result{}
	if err := c.readSSE(st, time.Now(), &res); err != nil || res.OutputTokens != 2 {
		t.Fatalf("no-usage stream: %v %+v", err, res)
	}
	// An error event before any content is an error.
	st.br.Reset(strings.NewReader("data: {\"error\":{\"message\":\"boom\"}}\n\n"))
	res = Result{}
	if err := c.readSSE(st, time.Now(), &res); err == nil {
		t.Fatal("error event not reported")
	}
	// A stream cut by the gateway (tokens, then an error event) is an error
	// too, and a content chunk quoting "error": is not.
	st.br.Reset(strings.NewReader("data: {\"choices\":[{\"text\":\"say \\\"error\\\": no\"}]}\n\ndata: {\"error\":{\"message\":\"timed out\"}}\n\ndata: [DONE]\n\n"))
	res = Result{}
	err := c.readSSE(st, time.Now(), &res)
	if err == nil || !strings.Contains(err.Error(), "after 1 chunks") {
		t.Fatalf("mid-stream error event: %v", err)
	}
}

func BenchmarkReadSSE(b *testing.B) {
	stream := sseStream(256)
	c := &Client{}
	rd := bytes.NewReader(stream)
	st := &sseState{br: bufio.NewReaderSize(rd, 32<<10)}
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		rd.Reset(stream)
		st.br.Reset(rd)
		var res Result
		if err := c.readSSE(st, time.Now(), &res); err != nil {
			b.Fatal(err)
		}
	}
}
