package proxy

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// vllmStreamOptions reads a chat body's stream_options as vLLM does
// (StreamOptions: include_usage defaults to true, null is false;
// continuous_usage_stats defaults to false; should_include_usage honours
// continuous usage only with include_usage): whether the engine sends a
// usage chunk, and the usage so far on every chunk with choices.
func vllmStreamOptions(t *testing.T, body string) (include, continuous bool) {
	t.Helper()
	var v struct {
		StreamOptions map[string]json.RawMessage `json:"stream_options"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Errorf("the engine got %q: %v", body, err)
		return false, false
	}
	if v.StreamOptions == nil {
		return false, false // absent or null
	}
	include = true
	if r, ok := v.StreamOptions["include_usage"]; ok {
		include = string(r) == "true"
	}
	return include, include && string(v.StreamOptions["continuous_usage_stats"]) == "true"
}

// A client that leaves a chat stream once it has read the finish_reason
// chunk, or whose write of that chunk fails, is charged the engine's
// usage whenever the router had read the engine's whole count: for every
// stream_options a client can send (include_usage absent, true, false or
// null; continuous_usage_stats absent, true or false; with
// protocol.force_stream_usage on or off) the router forwards
// include_usage: true, and continuous_usage_stats only where the engine
// would honour it for the client (with include_usage, or forced), and a
// vLLM-like engine then puts the usage so far on every chunk with choices
// (the finish_reason chunk's is the whole count of one sequence) and the
// usage chunk last. Left at the finish_reason chunk, the usage chunk that
// follows is read and charged; the finish_reason chunk's write failing,
// only that chunk was read: charged its usage when it had one (continuous
// usage), else the estimate. The router charged the estimate (above
// 1000 tokens) for the finish_reason chunk's usage when the client asked
// continuous_usage_stats.
func TestAClientLeavingAtTheFinishReasonChunkIsChargedTheEnginesUsage(t *testing.T) {
	const (
		chunk = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":%d,%s}]%s}\n\n"
		usage = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
	)
	soFar := func(cont bool, completion int) string {
		if !cont {
			return ""
		}
		return fmt.Sprintf(`,"usage":{"prompt_tokens":11,"total_tokens":%d,"completion_tokens":%d}`, 11+completion, completion)
	}
	for _, tc := range []struct {
		opts   string // the client's stream_options member, with its comma
		forced bool
		n      int
		cont   bool // the engine is asked for continuous usage
	}{
		{opts: ``},
		{opts: `"stream_options":{"include_usage":true},`},
		{opts: `"stream_options":{"include_usage":false},`},
		{opts: `"stream_options":{"include_usage":null},`},
		{opts: `"stream_options":{},`},
		{opts: `"stream_options":null,`},
		{opts: `"stream_options":{"continuous_usage_stats":false},`},
		{opts: `"stream_options":{"continuous_usage_stats":true},`, cont: true},
		{opts: `"stream_options":{"include_usage":true,"continuous_usage_stats":true},`, cont: true},
		{opts: `"stream_options":{"continuous_usage_stats":true,"include_usage":true},`, cont: true},
		{opts: `"stream_options":{"include_usage":false,"continuous_usage_stats":true},`},
		{opts: `"stream_options":{"include_usage":null,"continuous_usage_stats":true},`},
		{opts: ``, forced: true},
		{opts: `"stream_options":{"include_usage":false},`, forced: true},
		{opts: `"stream_options":{"include_usage":false,"continuous_usage_stats":true},`, forced: true, cont: true},
		{opts: `"stream_options":{"continuous_usage_stats":true,"include_usage":null},`, forced: true, cont: true},
		{opts: `"stream_options":{"include_usage":true,"continuous_usage_stats":true},`, n: 2, cont: true},
	} {
		for _, leave := range []string{"after the finish_reason chunk", "its write failed"} {
			if tc.n > 1 && leave != "its write failed" {
				continue
			}
			name := fmt.Sprintf("%s forced=%v n=%d, %s", tc.opts, tc.forced, max(tc.n, 1), leave)
			t.Run(name, func(t *testing.T) {
				n := max(tc.n, 1)
				body := `{"model":"m","max_tokens":1000,"stream":true,` + tc.opts + fmt.Sprintf(`"n":%d,`, n) + `"messages":[{"role":"user","content":"hello"}]}`
				gone := make(chan struct{})
				asked := make(chan [2]bool, 1)
				up := startRaw(t, func(_ int, req string, c net.Conn) {
					include, cont := vllmStreamOptions(t, req[strings.Index(req, "\r\n\r\n")+4:])
					asked <- [2]bool{include, cont}
					send := func(s string) error {
						_, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(s), s)
						return err
					}
					var head, finish string
					for i := range n {
						head += fmt.Sprintf(chunk, i, `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null`, soFar(cont, 0))
						head += fmt.Sprintf(chunk, i, `"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null`, soFar(cont, 2))
						finish += fmt.Sprintf(chunk, i, `"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null`, soFar(cont, 3))
					}
					rest := "data: [DONE]\n\n"
					if include {
						rest = fmt.Sprintf(usage, 11+3*n, 3*n) + rest
					}
					c.Write([]byte(sseHead))
					if leave == "its write failed" {
						send(head)
					} else {
						send(head + finish)
					}
					select {
					case <-gone:
					case <-time.After(5 * time.Second):
						return
					}
					if leave == "its write failed" {
						if send(finish) != nil {
							return
						}
						time.Sleep(200 * time.Millisecond) // the router fails the write before it reads more
					}
					send(rest)
					// No end of the body: the engine waits for the router to close.
				})
				proto := ``
				if tc.forced {
					proto = `"force_stream_usage": true`
				}
				sr := startSettleRouter(t, proto, up.url)

				c, err := net.Dial("tcp", strings.TrimPrefix(sr.r.url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
					sr.key, len(body), body)
				leaveAt := `"content":"Hi"`
				if leave == "after the finish_reason chunk" {
					leaveAt = `"finish_reason":"stop"`
				}
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				var got []byte
				buf := make([]byte, 64<<10)
				for strings.Count(string(got), leaveAt) < n {
					k, err := c.Read(buf)
					got = append(got, buf[:k]...)
					if err != nil {
						t.Fatalf("the client read %q before %v, without %q", got, err, leaveAt)
					}
				}
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				time.Sleep(50 * time.Millisecond) // the reset reached the router's socket
				close(gone)

				if a := <-asked; !a[0] || a[1] != tc.cont {
					t.Fatalf("the engine was asked for usage %v, continuous usage %v: want usage, continuous usage %v", a[0], a[1], tc.cont)
				}
				switch {
				case leave == "after the finish_reason chunk":
					sr.checkCached(t, endClientGone, true, 4) // the usage chunk's
				case tc.cont && n == 1:
					sr.checkCached(t, endClientGone, true, 0) // the finish_reason chunk's usage
				default:
					sr.checkCached(t, endClientGone, false, 0) // no whole count read
				}
			})
		}
	}
}

// An engine that puts the usage so far on every chunk although the
// router asked no continuous usage (vLLM started with
// --enable-force-include-usage: should_include_usage returns (True, True)
// in vLLM's serve utils) sends, on every chunk still generating, a count
// of the answer so far. A client that leaves in the middle is charged the
// estimate (no whole count was read), and one that stays to the end its
// usage chunk's count. The first chunk's usage was taken as the final
// count: the client that left was charged the count of the last chunk the
// router read (16 tokens) for a generation that went on; and when each
// chunk came in a read of its own, its line beginning the read, the first
// chunk's usage was still taken as final.
func TestAnEngineSendingUsageOnEveryChunkUnaskedIsNotChargedItsFirstCount(t *testing.T) {
	const (
		chunk = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,%s}],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":%d,\"completion_tokens\":%d}}\n\n"
		usage = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":14,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n"
	)
	for _, tc := range []struct{ stay, apart bool }{{false, false}, {false, true}, {true, false}} {
		stay := tc.stay
		t.Run(fmt.Sprintf("client stays %v, chunks read apart %v", stay, tc.apart), func(t *testing.T) {
			gone := make(chan struct{})
			up := startRaw(t, func(_ int, req string, c net.Conn) {
				send := func(s string) error {
					_, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(s), s)
					return err
				}
				c.Write([]byte(sseHead))
				// Each chunk on its own write, as an engine flushes them;
				// apart, far enough apart that the router reads each alone
				// (a read that begins with the chunk's line).
				send(fmt.Sprintf(chunk, `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null`, 11, 0))
				if tc.apart {
					time.Sleep(100 * time.Millisecond)
				}
				send(fmt.Sprintf(chunk, `"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null`, 13, 2))
				if !stay {
					// Once the client left, one more chunk still generating:
					// the router fails its write and ends the request.
					select {
					case <-gone:
					case <-time.After(5 * time.Second):
						return
					}
					send(fmt.Sprintf(chunk, `"delta":{"content":" there"},"logprobs":null,"finish_reason":null`, 16, 5))
					time.Sleep(200 * time.Millisecond)
					return
				}
				send(fmt.Sprintf(chunk, `"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null`, 14, 3))
				send(usage)
				send("")
			})
			sr := startSettleRouter(t, ``, up.url)
			body := `{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
			c, err := net.Dial("tcp", strings.TrimPrefix(sr.r.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				sr.key, len(body), body)
			leaveAt := `"content":"Hi"`
			if stay {
				leaveAt = "[DONE]"
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			var got []byte
			buf := make([]byte, 64<<10)
			for !strings.Contains(string(got), leaveAt) {
				k, err := c.Read(buf)
				got = append(got, buf[:k]...)
				if err != nil {
					t.Fatalf("the client read %q before %v, without %q", got, err, leaveAt)
				}
			}
			if stay {
				sr.checkCached(t, endComplete, true, 0)
				c.Close()
				return
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			time.Sleep(50 * time.Millisecond) // the reset reached the router's socket
			close(gone)
			sr.checkCached(t, endClientGone, false, 0)
		})
	}
}
