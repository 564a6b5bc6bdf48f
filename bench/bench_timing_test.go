package bench

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
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

// A stream that ends (EOF) without data: [DONE] was cut: summaries file it
// under stream-error. readSSE used to accept it once a token had arrived,
// so a cut request counted as OK with a shortened E2E and its partial
// token count.
func TestReadSSECutStreamIsAnError(t *testing.T) {
	c := &Client{}
	tok := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n"
	f := func(stream string) {
		t.Helper()
		st := &sseState{br: bufio.NewReader(strings.NewReader(stream))}
		var res Result
		err := c.readSSE(st, time.Now(), &res)
		if err == nil || !strings.Contains(err.Error(), "without data: [DONE]") {
			t.Fatalf("a stream cut after %d tokens is not reported as cut: %v", res.OutputTokens, err)
		}
	}
	f(tok + tok)
	f("")
	// Usage without [DONE] is cut too: [DONE] ends every OpenAI stream.
	f(tok + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n")
}

// End to end through Client.Do: an upstream that sends two tokens of a
// 32-token answer and ends its chunked stream without [DONE] or usage
// used to count as a successful request.
func TestClientDoCountsCutStreamAsStreamError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 2 {
			w.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n"))
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	cl, err := NewClient(srv.URL, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	cl.Do("/v1/chat/completions", []byte(`{"max_tokens":32,"stream":true}`), true, &res)
	s := Summarize("x", []Result{res}, nil, time.Second, SLO{}, 1)
	t.Logf("status %d err %q output tokens %d; summary ok %d errors %v", res.Status, res.Err, res.OutputTokens, s.OK, s.ErrorsByStatus)
	if res.OK() || s.ErrorsByStatus["stream-error"] != 1 {
		t.Fatalf("a stream cut after 2 of 32 tokens (no [DONE]): ok %v, errors %v", res.OK(), s.ErrorsByStatus)
	}
}

// JSON may put whitespace after its colons (Python's json.dumps does, as
// OpenAI-compatible servers built on it send): the client must read the
// tokens and usage of such answers as it reads compact ones. It used to
// match "content":" and "usage":{ byte for byte, and so counted every
// streamed answer as an error and every whole one as one token.
func TestClientDoReadsJSONWithWhitespace(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		usage := `"usage": {"prompt_tokens": 100, "completion_tokens": 3, "total_tokens": 103, "prompt_tokens_details": {"cached_tokens": 48}}`
		if r.URL.RawQuery != "stream" {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"choices": [{"index": 0, "message": {"role": "assistant", "content": "a b c"}, "finish_reason": "length"}], ` + usage + `}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"content\": \"\"}}]}\n\n"))
		for range 3 {
			w.Write([]byte("data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"tok \"}, \"finish_reason\": null}]}\n\n"))
			w.(http.Flusher).Flush()
		}
		w.Write([]byte("data: {\"choices\": [], " + usage + "}\n\ndata: [DONE]\n\n"))
	}))
	defer srv.Close()
	cl, err := NewClient(srv.URL, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{true, false} {
		path := "/v1/chat/completions"
		if stream {
			path += "?stream"
		}
		var res Result
		cl.Do(path, []byte(`{"max_tokens":3}`), stream, &res)
		if !res.OK() || res.OutputTokens != 3 || res.PromptTokens != 100 || res.CachedTokens != 48 {
			t.Fatalf("stream %v: ok %v (%q), %d output, %d prompt, %d cached tokens; want 3, 100, 48", stream, res.OK(), res.Err, res.OutputTokens, res.PromptTokens, res.CachedTokens)
		}
		if stream && res.ITLCount != 2 {
			t.Fatalf("3 streamed tokens must give 2 inter-token gaps, got %d", res.ITLCount)
		}
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

// An answer read whole must be an answer: a 200 carrying an error object
// (`infera engine` with an error fault of status 200; a gateway that wraps
// its errors so) or a page that is not JSON counted as a success with one
// output token, while the same error in a stream counted as a stream-error.
func TestClientDoCountsA200ErrorBodyAsAnError(t *testing.T) {
	for _, body := range []string{
		`{"error":{"message":"engine error","type":"server_error","param":null,"code":null}}`,
		`<html><body>hello</body></html>`,
		``,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(body))
		}))
		cl, err := NewClient(srv.URL, 4, false)
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		cl.Do("/v1/chat/completions", []byte(`{"max_tokens":3}`), false, &res)
		srv.Close()
		s := Summarize("x", []Result{res}, nil, time.Second, SLO{}, 1)
		if res.OK() || s.Errors != 1 {
			t.Fatalf("200 with body %q: ok %v, errors %v", body, res.OK(), s.ErrorsByStatus)
		}
	}
}
