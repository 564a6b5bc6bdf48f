package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/govern"
)

// The events a simulated engine sends, in each protocol. The engine's usage
// is 11 prompt tokens (4 of them cached) and 3 completion tokens; the
// requests ask for up to 1000, so their estimate is above 1000.
const (
	sseHead  = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	jsonHead = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"

	chatText  = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n"
	chatMore  = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}]}\n\n"
	chatStop  = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	chatUsage = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":14,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
	// The usage on the chunk with finish_reason, as OpenAI-compatible
	// engines other than vLLM and SGLang may send it.
	chatStopUsage = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":14,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
	// vLLM's continuous_usage_stats: the usage so far on every chunk.
	chatTextSoFar = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":12,\"completion_tokens\":1}}\n\n"
	chatMoreSoFar = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":13,\"completion_tokens\":2}}\n\n"
	sseDone       = "data: [DONE]\n\n"

	complText  = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"Hi\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n"
	complUsage = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":14,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"

	antStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":7,\"cache_read_input_tokens\":4,\"output_tokens\":0}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
	antMore  = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there\"}}\n\n"
	antDelta = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":3}}\n\n"
	antStop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

	respText = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_settle1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n"
	respDone = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_settle1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":11,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":3,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":14}}}\n\n"
)

// settleUsers is a user (alice) with a monthly token quota weighing every
// token 1, and a concurrency limit, whose counter tells when her request
// ended.
const settleUsers = `{
	"user_limit": {"templates": [{"name": "t", "default": true,
		"concurrency": {"enabled": true, "limit": 8},
		"quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
			"windows": [{"period": "month", "max_requests": 100000}]}}]},
	"users": [{"name": "alice", "keys": [%q]}]}`

// A client that leaves a stream once the engine's final usage was read
// (the usage chunk of a chat or completions stream, asked by the client or
// by the router; an Anthropic message_delta; a Responses
// response.completed; a converted stream's usage chunk) is charged that
// usage: the user's quota, the token metrics and the access log all get
// the engine's count, whether the client read the usage and left before
// the stream's end or the write of the usage (or of what follows it)
// failed. The router read the engine's count, complete, and charged the
// estimate (prompt + max_tokens) instead. A stream left before its final
// usage still keeps its estimate (docs/governance.md), also when vLLM's
// continuous_usage_stats put the usage so far on the chunks relayed (the
// usage on the finish_reason chunk of one sequence is its final count:
// TestAClientLeavingAtTheFinishReasonChunkIsChargedTheEnginesUsage); and
// so does a non-streamed answer, whose usage is settled once its usage
// object was read whole.
func TestAClientLeavingAfterTheFinalUsageIsChargedThatUsage(t *testing.T) {
	const (
		chatReq    = `{"model":"m","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
		antReq     = `{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
		respReq    = `{"model":"m","max_output_tokens":1000,"stream":true,"input":"hello"}`
		bigContent = 40 << 10 // a non-streamed answer longer than the relay's first read
	)
	long := strings.Repeat("x", bigContent)
	for _, tc := range []struct {
		name, path, body string
		proto            string // the protocol settings
		head             string
		before           string   // sent at once
		after            []string // sent once the client left, 200 ms apart (the router fails a write before it reads the next); then the engine waits for the router to close
		leaveAt          string   // the client leaves once it has read this
		settled          bool     // charged the engine's usage, else the estimate
	}{
		{"chat: the usage chunk read, left before [DONE]", "/v1/chat/completions", chatReq, ``, sseHead,
			chatText + chatStop + chatUsage, []string{sseDone}, `"completion_tokens":3`, true},
		{"chat: left, then the usage chunk's write failed", "/v1/chat/completions", chatReq, ``, sseHead,
			chatText + chatStop, []string{chatUsage, sseDone}, `"finish_reason":"stop"`, true},
		{"chat: the router's usage chunk removed, [DONE]'s write failed", "/v1/chat/completions",
			strings.Replace(chatReq, `"stream_options":{"include_usage":true},`, "", 1), ``, sseHead,
			chatText + chatStop, []string{chatUsage + sseDone}, `"finish_reason":"stop"`, true},
		{"chat: forced usage read, left before [DONE]", "/v1/chat/completions",
			strings.Replace(chatReq, `"stream_options":{"include_usage":true},`, "", 1), `"force_stream_usage": true`, sseHead,
			chatText + chatStop + chatUsage, []string{sseDone}, `"completion_tokens":3`, true},
		{"chat: left before the usage chunk", "/v1/chat/completions", chatReq, ``, sseHead,
			chatText, []string{chatMore, chatStop + chatUsage + sseDone}, `"content":"Hi"`, false},
		{"chat: continuous usage, left before the usage chunk", "/v1/chat/completions",
			strings.Replace(chatReq, `"include_usage":true`, `"include_usage":true,"continuous_usage_stats":true`, 1), ``, sseHead,
			chatTextSoFar, []string{chatMoreSoFar, chatStop + chatUsage + sseDone}, `"completion_tokens":1`, false},
		{"chat: the usage on the finish_reason chunk read, left before [DONE]", "/v1/chat/completions", chatReq, ``, sseHead,
			chatText + chatStopUsage, []string{sseDone}, `"completion_tokens":3`, true},
		{"chat: the router asked for usage, left, then the finish_reason chunk's write failed", "/v1/chat/completions",
			strings.Replace(chatReq, `"stream_options":{"include_usage":true},`, "", 1), ``, sseHead,
			chatText, []string{chatStopUsage, sseDone}, `"content":"Hi"`, true},
		{"chat: continuous usage, the finish_reason chunk's usage read, left before [DONE]", "/v1/chat/completions",
			strings.Replace(chatReq, `"include_usage":true`, `"include_usage":true,"continuous_usage_stats":true`, 1), ``, sseHead,
			chatTextSoFar + chatStopUsage, []string{sseDone}, `"completion_tokens":3`, true},
		{"completions: the usage chunk read, left before [DONE]", "/v1/completions",
			`{"model":"m","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"prompt":"hello"}`, ``, sseHead,
			complText + complUsage, []string{sseDone}, `"completion_tokens":3`, true},
		{"anthropic: message_delta read, left before message_stop", "/v1/messages", antReq,
			`"anthropic_passthrough": true`, sseHead,
			antStart + antDelta, []string{antStop}, `"output_tokens":3}`, true},
		{"anthropic: left, then message_delta's write failed", "/v1/messages", antReq,
			`"anthropic_passthrough": true`, sseHead,
			antStart, []string{antDelta, antStop}, `"text":"Hi"`, true},
		{"anthropic: left before message_delta", "/v1/messages", antReq,
			`"anthropic_passthrough": true`, sseHead,
			antStart, []string{antMore, antDelta + antStop}, `"text":"Hi"`, false},
		{"responses: left, then response.completed's write failed", "/v1/responses", respReq,
			`"responses_passthrough": true`, sseHead,
			respText, []string{respDone}, `"delta":"Hi"`, true},
		{"responses: left before response.completed", "/v1/responses", respReq,
			`"responses_passthrough": true`, sseHead,
			respText, []string{"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\" there\"}\n\n", respDone}, `"delta":"Hi"`, false},
		{"anthropic from a chat engine: message_delta's write failed", "/v1/messages", antReq, ``, sseHead,
			chatText + chatStop + chatUsage, []string{sseDone}, `"text_delta"`, true},
		{"responses from a chat engine: response.completed's write failed", "/v1/responses", respReq, ``, sseHead,
			chatText + chatStop + chatUsage, []string{sseDone}, `"response.output_text.delta"`, true},
		{"anthropic from a chat engine: left before the usage chunk", "/v1/messages", antReq, ``, sseHead,
			chatText, []string{chatMore, chatStop + chatUsage + sseDone}, `"text_delta"`, false},
		{"non-streamed: the usage read, the write of the answer's end failed", "/v1/chat/completions",
			`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`, ``, jsonHead,
			`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` + long + "#",
			[]string{`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"total_tokens":14,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}`},
			"#\r\n", true}, // the chunk's end: a chunk larger than the server's write buffer is written in two parts
		{"non-streamed: left before the usage", "/v1/chat/completions",
			`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`, ``, jsonHead,
			`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` + long + "#",
			[]string{long, `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"total_tokens":14,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}`},
			"#\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone := make(chan struct{})
			up := startRaw(t, func(n int, req string, c net.Conn) {
				chunk := func(s string) error {
					_, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(s), s)
					return err
				}
				c.Write([]byte(tc.head))
				chunk(tc.before)
				select {
				case <-gone:
				case <-time.After(5 * time.Second):
					return
				}
				for i, p := range tc.after {
					if i > 0 {
						time.Sleep(200 * time.Millisecond)
					}
					if chunk(p) != nil {
						return
					}
				}
				// No end of the body: the engine waits for the router to
				// close (startRaw reads the next request).
			})
			sr := startSettleRouter(t, tc.proto, up.url)

			// The client reads up to leaveAt and resets its connection.
			c, err := net.Dial("tcp", strings.TrimPrefix(sr.r.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				tc.path, sr.key, len(tc.body), tc.body)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			var got []byte
			buf := make([]byte, 64<<10)
			for !strings.Contains(string(got), tc.leaveAt) {
				n, err := c.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					t.Fatalf("the client read %q before %v, without %q", got, err, tc.leaveAt)
				}
			}
			if tc.settled && !strings.Contains(tc.before, "usage\":{\"prompt") && strings.Contains(string(got), `"completion_tokens":3`) {
				t.Fatalf("the client read the usage it should leave before: %q", got)
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			time.Sleep(50 * time.Millisecond) // the reset reached the router's socket
			close(gone)

			sr.check(t, endClientGone, tc.settled)
		})
	}
}

// settleRouter is a router with a governor (settleUsers) and an access
// log, in front of one engine.
type settleRouter struct {
	r          *testRouter
	g          *govern.Governor
	key        string
	al         *AccessLog
	logPath    string
	p0, c0, k0 float64 // the token metrics at the start
}

func startSettleRouter(t *testing.T, proto, engine string) *settleRouter {
	t.Helper()
	key, hash := mintKey(t)
	cfg := govConfig(t, `{"protocol": {`+proto+`},`+fmt.Sprintf(settleUsers, hash)[1:])
	sr := &settleRouter{g: newGovernor(t, cfg), key: key, logPath: filepath.Join(t.TempDir(), "access.log")}
	var err error
	if sr.al, err = OpenAccessLog(sr.logPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sr.al.Close() })
	f := defaultFlags()
	f.RequestMaxRetries = 0
	sr.r = startRouterWith(t, f, cfg, func(o *Options) { o.Governor, o.AccessLog = sr.g, sr.al }, engine)
	sr.p0, sr.c0, sr.k0 = sr.tokens(t, "prompt"), sr.tokens(t, "completion"), sr.tokens(t, "cached")
	return sr
}

func (sr *settleRouter) tokens(t *testing.T, kind string) float64 {
	return metricFloat(t, sr.r.url, `infera_usage_tokens_total{kind="`+kind+`"}`)
}

// check waits for the end of the router's one request and checks how it
// was charged: the engine's usage (11 prompt with 4 cached, 3 completion)
// when settled, else its estimate (above 1000) and no usage, in the
// user's quota, the token metrics and the access log, whose line ends as
// end says.
func (sr *settleRouter) check(t *testing.T, end string, settled bool) {
	t.Helper()
	sr.checkCached(t, end, settled, 4)
}

// checkCached is check for an engine's usage with cached of its 11 prompt
// tokens cached (vLLM's usage so far, on chunks with choices, tells none).
func (sr *settleRouter) checkCached(t *testing.T, end string, settled bool, cached int) {
	t.Helper()
	g := sr.g
	waitUntil(t, "the request's end", func() bool {
		us := userStatus(t, g)
		return us.Active == 0 && len(us.Quota) == 1 && us.Quota[0].Requests == 1
	})
	charged := userStatus(t, g).Quota[0].Tokens
	dp, dc, dk := sr.tokens(t, "prompt")-sr.p0, sr.tokens(t, "completion")-sr.c0, sr.tokens(t, "cached")-sr.k0
	sr.r.srv.Shutdown()
	sr.al.Close()
	lines := readAccessLog(t, sr.logPath)
	if len(lines) != 1 {
		t.Fatalf("access log: %v", lines)
	}
	l := lines[0]
	if l["end"] != end {
		t.Errorf("access log end %v, want %s", l["end"], end)
	}
	if settled {
		if charged != 14 || dp != 11 || dc != 3 || dk != float64(cached) || l["prompt_tokens"] != 11.0 || l["completion_tokens"] != 3.0 || l["cached_tokens"] != float64(cached) {
			t.Fatalf("charged %v tokens to the user, counted %v prompt, %v completion, %v cached tokens in the metrics, logged %v: want the engine's usage (11 prompt with %d cached, 3 completion: 14)",
				charged, dp, dc, dk, l, cached)
		}
		return
	}
	if charged < 1000 || dp != 0 || dc != 0 || dk != 0 || l["prompt_tokens"] != nil {
		t.Fatalf("charged %v tokens to the user, counted %v prompt, %v completion, %v cached tokens in the metrics, logged %v: want the estimate (above 1000) and no usage",
			charged, dp, dc, dk, l)
	}
}

// An engine whose connection breaks after its final usage (before
// data: [DONE] or message_stop) gave its complete count: the request is
// charged that usage, though the client gets the stream's error event and
// the worker is blamed. One that breaks before it keeps its estimate. The
// router took the first for the second.
func TestAStreamBrokenAfterItsFinalUsageIsChargedThatUsage(t *testing.T) {
	const (
		chatReq = `{"model":"m","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
		antReq  = `{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	)
	for _, tc := range []struct {
		name, path, body, proto, sent string
		settled                       bool
	}{
		{"chat, after its usage chunk", "/v1/chat/completions", chatReq, ``, chatText + chatStop + chatUsage, true},
		{"chat, before its usage chunk", "/v1/chat/completions", chatReq, ``, chatText + chatStop, false},
		{"anthropic, after message_delta", "/v1/messages", antReq, `"anthropic_passthrough": true`, antStart + antDelta, true},
		{"anthropic from a chat engine, after the usage chunk", "/v1/messages", antReq, ``, chatText + chatStop + chatUsage, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				fmt.Fprintf(c, "%s%x\r\n%s\r\n", sseHead, len(tc.sent), tc.sent)
				time.Sleep(50 * time.Millisecond)
				c.(*net.TCPConn).SetLinger(0)
				c.Close() // a reset before the stream's end
			})
			sr := startSettleRouter(t, tc.proto, up.url)
			before := midStreamErrors()
			req, _ := http.NewRequest("POST", sr.r.url+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+sr.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), "error") {
				t.Fatalf("want the stream's error event: %d %q", resp.StatusCode, b)
			}
			if midStreamErrors() == before {
				t.Fatal("the worker was not blamed for its broken stream")
			}
			sr.check(t, endUpstreamErr, tc.settled)
		})
	}
}

// An engine's final usage object longer than a short bound (every details
// field, spaced: over 450 bytes), cut in two by the TCP segments the
// engine sends, is read whole: the stream broken after it is charged that
// usage, with the engine's numbers, wherever the cut falls. Past 384
// bytes the router never read it whole and charged the estimate.
func TestALongFinalUsageCutByAReadIsChargedThatUsage(t *testing.T) {
	const chatReq = `{"model":"m","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
	long := `"usage": {"prompt_tokens": 11, "total_tokens": 14, "completion_tokens": 3, ` +
		`"prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0, "text_tokens": 7, "image_tokens": 0, "video_tokens": 0}, ` +
		`"completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0, "text_tokens": 3, "image_tokens": 0}, ` +
		`"server_tool_use": {"web_search_requests": 0}, "cost_details": {"upstream_inference_cost": null}, "num_cached_tokens": 4}`
	if len(long) < 450 {
		t.Fatalf("the usage object has %d bytes", len(long))
	}
	usageChunk := "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[]," + long + "}\n\n"
	at := strings.Index(usageChunk, `"usage"`)
	for _, cut := range []int{at + 3, at + 40, at + 200, at + 390, at + 430, at + len(long) - 1} {
		t.Run(fmt.Sprintf("cut %d bytes into the usage", cut-at), func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				sent := chatText + chatStop + usageChunk
				cutAt := len(chatText) + len(chatStop) + cut
				wire := fmt.Sprintf("%s%x\r\n%s\r\n", sseHead, len(sent), sent)
				split := len(wire) - len(sent) - 2 + cutAt
				c.(*net.TCPConn).SetNoDelay(true)
				c.Write([]byte(wire[:split]))
				time.Sleep(50 * time.Millisecond) // the router reads the first part alone
				c.Write([]byte(wire[split:]))
				time.Sleep(50 * time.Millisecond)
				c.(*net.TCPConn).SetLinger(0)
				c.Close() // a reset before data: [DONE]
			})
			sr := startSettleRouter(t, ``, up.url)
			req, _ := http.NewRequest("POST", sr.r.url+"/v1/chat/completions", strings.NewReader(chatReq))
			req.Header.Set("Authorization", "Bearer "+sr.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"num_cached_tokens": 4}`) {
				t.Fatalf("want the whole usage relayed: %d %q", resp.StatusCode, b)
			}
			sr.check(t, endUpstreamErr, true)
		})
	}
}
