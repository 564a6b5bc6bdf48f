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

// An engine's tool call whose arguments are not JSON (a model that writes
// prose where the call's arguments go; vLLM's tool parsers stream it as it
// comes), or JSON followed by junk: the Anthropic SDK's messages.stream
// parses partial_json as it streams and threw on the first character no
// JSON continues with, losing the whole stream. Only the part that keeps
// the input a JSON object's prefix is sent: {} for prose (as a whole
// answer gives), the object for an object followed by junk.
func TestAnthropicSDKStreamsAToolCallWhoseArgumentsAreNotJSON(t *testing.T) {
	node, err := exec.LookPath("node")
	dir := filepath.Join("..", "scripts", "sdk")
	if d := os.Getenv("INFERA_SDK_DIR"); d != "" {
		dir = d
	}
	if _, e := os.Stat(filepath.Join(dir, "node_modules", "@anthropic-ai", "sdk")); err != nil || e != nil {
		t.Skip("node or the SDKs are not installed; run make deps")
	}
	chunk := func(delta string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
	}
	stream := func(args ...string) string {
		s := chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`)
		for _, a := range args {
			s += chunk(`{"tool_calls":[{"index":0,"function":{"arguments":` + a + `}}]}`)
		}
		return s + `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n" +
			`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}` + "\n\ndata: [DONE]\n\n"
	}
	for _, c := range []struct {
		name, stream, want string
	}{
		{"prose", stream(`"I will call it "`, `"with city=Paris"`), `{}`},
		{"object then junk", stream(`"{\"city\": \"Pa"`, `"ris\"} and then"`, `" some words"`), `{"city":"Paris"}`},
		{"an escaped quote split from its string", stream(`"{\"city\": \"say \\\""`, `"hi\\\"\"}"`), `{"city":"say \"hi\""}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				opt := DefaultOptions()
				var m Meta
				if _, err := AnthropicToChat(nil, body, &opt, &m); err != nil {
					t.Errorf("AnthropicToChat: %v", err)
					w.WriteHeader(400)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				sc := AcquireStreamConverter(&m)
				defer ReleaseStreamConverter(sc)
				w.Write(sc.Finish(sc.Feed(nil, []byte(c.stream))))
			}))
			defer srv.Close()
			cmd := exec.Command(node, filepath.Join(dir, "badargs.mjs"))
			cmd.Env = append(os.Environ(), "INFERA_BASE_URL="+srv.URL, "INFERA_MODEL=m", "INFERA_EXPECT_INPUT="+c.want)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("badargs.mjs failed: %v\n%s", err, out)
			}
			t.Logf("%s", out)
		})
	}
}
