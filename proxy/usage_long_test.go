package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/protocol"
)

// paddedUsage is a usage object of 1234 prompt tokens (89 cached) and 567
// completion tokens padded to about size bytes by a field of the engine's
// own between its prompt and its completion counts (a read that cuts it
// in the padding holds the first and not the second).
func paddedUsage(size int) string {
	head := `"usage": {"prompt_tokens": 1234, "prompt_tokens_details": {"cached_tokens": 89}, "metrics": {"trace": "`
	tail := `"}, "completion_tokens": 567, "total_tokens": 1801}`
	return head + strings.Repeat("x", max(size-len(head)-len(tail), 0)) + tail
}

// A usage object longer than the router's own carry (1 KiB), up to 8 KiB,
// cut by read boundaries anywhere (in two reads or three), is read whole:
// in a chat stream, a non-streamed body and a Responses stream it is
// settled with its numbers from its end on. Past 1 KiB from its key it
// was never read whole, so never settled: a stream cut after it kept its
// estimate. One cut more than 8 KiB after its key is not carried (the
// bound).
func TestAUsageObjectUpTo8KiBCutByReadsIsReadWhole(t *testing.T) {
	for _, size := range []int{1100, 3000, usageMax - 200} {
		long := paddedUsage(size)
		chat := []byte("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[]," + long + "}\n\ndata: [DONE]\n\n")
		body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` + long + `}`)
		resp := []byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"," +
			strings.Replace(strings.Replace(long, `"prompt_tokens"`, `"input_tokens"`, 1), `"completion_tokens"`, `"output_tokens"`, 1) + "}}\n\n")
		for _, c := range []struct {
			name string
			b    []byte
			sse  bool
			scan func(u *usage, p []byte)
		}{
			{"chat stream", chat, true, func(u *usage, p []byte) { u.scan(p) }},
			{"non-streamed body", body, false, func(u *usage, p []byte) { u.scan(p) }},
			{"responses stream", resp, true, func(u *usage, p []byte) { u.scanProtocol(p, protocol.Responses) }},
		} {
			t.Run(fmt.Sprintf("%s, %d bytes", c.name, len(long)), func(t *testing.T) {
				var from int // settled from here on: the object's end, or its line's
				if c.name == "chat stream" {
					from = strings.Index(string(c.b), long) + len(long)
				} else if c.name == "non-streamed body" {
					from = len(c.b) - 1
				} else {
					from = strings.Index(string(c.b), `"total_tokens": 1801}`) + len(`"total_tokens": 1801}`)
				}
				check := func(u *usage, read int, how string) {
					t.Helper()
					want := read >= from
					if got := u.settled(c.sse); got != want {
						t.Fatalf("%s: %d of %d bytes read (settled from %d on): settled %v, want %v", how, read, len(c.b), from, got, want)
					}
					if want && (u.prompt != 1234 || u.completion != 567 || u.cached != 89) {
						t.Fatalf("%s: settled with %d %d %d", how, u.prompt, u.completion, u.cached)
					}
				}
				step := 1
				if raceEnabled {
					step = 7
				}
				for i := 0; i <= len(c.b); i += step {
					u := usage{usageState: usageState{lines: c.sse, once: true, single: true}}
					c.scan(&u, c.b[:i])
					check(&u, i, fmt.Sprintf("cut at %d", i))
					c.scan(&u, c.b[i:])
					check(&u, len(c.b), fmt.Sprintf("cut at %d, then the rest", i))
					// Three reads: the second one ends 700 bytes on.
					j := min(i+700, len(c.b))
					u = usage{usageState: usageState{lines: c.sse, once: true, single: true}}
					c.scan(&u, c.b[:i])
					c.scan(&u, c.b[i:j])
					check(&u, j, fmt.Sprintf("cut at %d and %d", i, j))
					c.scan(&u, c.b[j:])
					check(&u, len(c.b), fmt.Sprintf("cut at %d and %d, then the rest", i, j))
				}
			})
		}
	}
	// Past the bound, an object cut more than 8 KiB after its key is not
	// read whole (nor settled with the numbers of its first part).
	long := paddedUsage(usageMax + 200)
	body := []byte(`{"id":"x","choices":[],` + long + `}`)
	cut := strings.Index(string(body), `"usage"`) + usageMax + 100
	var u usage
	u.scan(body[:cut])
	u.scan(body[cut:])
	if u.settled(false) {
		t.Fatalf("a %d-byte usage object cut %d bytes after its key was read whole", len(long), usageMax+100)
	}
}

// A usage object of a few KiB (an engine's own fields in it) that the
// engine's TCP segments cut is read whole: the stream broken after it is
// charged that usage, wherever the cut falls, with its padding in the
// first segment, the second, or both. Past 1 KiB from the usage key it
// was charged the estimate (above 1000 tokens).
func TestAPaddedFinalUsageCutByReadsIsChargedThatUsage(t *testing.T) {
	const chatReq = `{"model":"m","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
	pad := func(size int) string {
		head := `"usage": {"prompt_tokens": 11, "prompt_tokens_details": {"cached_tokens": 4}, "metrics": {"trace": "`
		tail := `"}, "completion_tokens": 3, "total_tokens": 14}`
		return head + strings.Repeat("y", size-len(head)-len(tail)) + tail
	}
	for _, size := range []int{2000, 6000} {
		long := pad(size)
		usageChunk := "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[]," + long + "}\n\n"
		at := strings.Index(usageChunk, `"usage"`)
		for _, cuts := range [][]int{{at + 40}, {at + size/2}, {at + size - 10}, {at + 500, at + size - 500}} {
			t.Run(fmt.Sprintf("%d bytes, cut %v bytes into it", size, offsets(cuts, at)), func(t *testing.T) {
				up := startRaw(t, func(n int, req string, c net.Conn) {
					sent := chatText + chatStop + usageChunk
					wire := fmt.Sprintf("%s%x\r\n%s\r\n", sseHead, len(sent), sent)
					base := len(wire) - len(sent) - 2 + len(chatText) + len(chatStop)
					c.(*net.TCPConn).SetNoDelay(true)
					from := 0
					for _, cut := range cuts {
						c.Write([]byte(wire[from : base+cut]))
						from = base + cut
						time.Sleep(50 * time.Millisecond) // the router reads this part alone
					}
					c.Write([]byte(wire[from:]))
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
				if resp.StatusCode != 200 || !strings.Contains(string(b), long) {
					t.Fatalf("want the whole usage relayed: %d %d bytes", resp.StatusCode, len(b))
				}
				sr.check(t, endUpstreamErr, true)
			})
		}
	}
}

func offsets(cuts []int, at int) []int {
	out := make([]int, len(cuts))
	for i, c := range cuts {
		out[i] = c - at
	}
	return out
}
