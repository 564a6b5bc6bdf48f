package protocol

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// An engine that calls a function taking no arguments may send
// "arguments":"" (the Anthropic conversion already turns that into input
// {}). The OpenAI SDK's responses.parse and responses.stream JSON.parse the
// arguments of a strict tool's call: the Responses conversion sends "{}",
// as OpenAI does, streamed or not (the SDK threw on "").
func TestResponsesSDKParsesANoArgumentFunctionCall(t *testing.T) {
	node, err := exec.LookPath("node")
	dir := filepath.Join("..", "scripts", "sdk")
	if d := os.Getenv("INFERA_SDK_DIR"); d != "" {
		dir = d
	}
	if _, e := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil || e != nil {
		t.Skip("node or the SDKs are not installed; run make deps")
	}
	const whole = `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"now","arguments":""}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}`
	const stream = `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"now","arguments":""}}]},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n" +
		`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}` + "\n\ndata: [DONE]\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		opt := DefaultOptions()
		var m Meta
		if _, err := ResponsesToChat(nil, body, &opt, &m); err != nil {
			t.Errorf("ResponsesToChat: %v", err)
			w.WriteHeader(400)
			return
		}
		if !m.Stream {
			out, err := ChatToResponses(nil, []byte(whole), &m)
			if err != nil {
				t.Errorf("ChatToResponses: %v", err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(out)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		c := AcquireStreamConverter(&m)
		defer ReleaseStreamConverter(c)
		w.Write(c.Finish(c.Feed(nil, []byte(stream))))
	}))
	defer srv.Close()
	cmd := exec.Command(node, filepath.Join(dir, "noargs.mjs"))
	cmd.Env = append(os.Environ(), "INFERA_BASE_URL="+srv.URL, "INFERA_MODEL=m")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("noargs.mjs failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
