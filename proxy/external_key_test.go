// The gateway's key to an external upstream never reaches the client, and
// a redirect from one is never relayed.

package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

const reKey = "sk-gateway-SECRET-0123456789"

// reSplitOnly routes everything to one external upstream (no failover, so
// its error answer is relayed, not stashed).
func reSplitOnly(addr string) *config.Config {
	return splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 0},
		config.Proxy{Name: "ext", Address: addr, APIKey: config.NewSecret(reKey), Weight: 1},
	)
}

// A streamed request answered 400/500 by the external upstream with a
// chunked error body in two writes: the whole error answer is read before
// its head is committed, so the key in the second write is scrubbed too
// (it was relayed unscrubbed after the first read).
func TestTheGatewaysKeyInALaterChunkOfAnErrorBodyIsScrubbed(t *testing.T) {
	for _, status := range []int{400, 500} {
		up := startRaw(t, func(n int, req string, c net.Conn) {
			c.Write([]byte("HTTP/1.1 " + strconv.Itoa(status) + " X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"))
			p1 := `{"error":{"message":"Incorrect API key provided: `
			c.Write([]byte(strconv.FormatInt(int64(len(p1)), 16) + "\r\n" + p1 + "\r\n"))
			time.Sleep(100 * time.Millisecond)
			p2 := reKey + `","type":"invalid_request_error"}}`
			c.Write([]byte(strconv.FormatInt(int64(len(p2)), 16) + "\r\n" + p2 + "\r\n0\r\n\r\n"))
		})
		r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
		body := `{"model":"gpt-4o","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
		for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
			if path == "/v1/responses" {
				body = `{"model":"gpt-4o","stream":true,"input":"hi"}`
			}
			resp, b := postWith(t, r.url+path, body, nil)
			if strings.Contains(b, reKey) {
				t.Errorf("%s status %d: the gateway's upstream key reached the client: %d %q", path, status, resp.StatusCode, b)
			}
		}
	}
}

// An error answer that echoes the key in a header (a debug echo of the
// request's Authorization) is relayed without that header.
func TestTheGatewaysKeyInAnErrorAnswersHeaderNeverReachesTheClient(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		body := `{"error":{"message":"rate limited"}}`
		c.Write([]byte("HTTP/1.1 429 Too Many Requests\r\nX-Echo-Authorization: Bearer " + reKey + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	})
	r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
	resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
	for k, vs := range resp.Header {
		for _, v := range vs {
			if strings.Contains(v, reKey) {
				t.Fatalf("the gateway's upstream key reached the client in header %s: %q (%d %s)", k, v, resp.StatusCode, b)
			}
		}
	}
}

// An external upstream answering a redirect (an http:// address an API
// redirects to https://, say) is an invalid response: the client gets an
// error in its protocol's shape, never the 3xx with the upstream's
// Location (which it used to get, as a success).
func TestARedirectFromAnExternalUpstreamIsAnInvalidResponse(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 308 Permanent Redirect\r\nLocation: https://api.provider.example/v1/chat/completions\r\nContent-Length: 0\r\n\r\n"))
	})
	r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", gptBody},
		{"/v1/messages", `{"model":"gpt-4o","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		resp, b := reNoRedirectPost(t, r.url+tc.path, tc.body)
		if resp.StatusCode < 400 || resp.Header.Get("Location") != "" {
			t.Errorf("%s: a redirect of the external upstream reached the client: %d Location %q body %.200q",
				tc.path, resp.StatusCode, resp.Header.Get("Location"), b)
		}
	}
}

func reNoRedirectPost(t *testing.T, url, body string) (*http.Response, string) {
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("%v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// An external upstream's error answer that echoes the gateway's key past
// the first 32 KiB read (or across its end) is scrubbed too (the answer
// is kept aside whole, up to 256 KiB, before it is relayed): the
// client can place the key there by padding whatever the upstream echoes
// (a long model name, say).
func TestTheGatewaysKeyPastTheFirstReadOfAnErrorBodyIsScrubbed(t *testing.T) {
	for _, off := range []int{relayBufSize - 10, relayBufSize + 1000} {
		body := `{"error":{"message":"` + strings.Repeat("x", off-len(`{"error":{"message":"`)) + reKey + `"}}`
		if strings.Index(body, reKey) != off {
			t.Fatalf("bad offset")
		}
		up := startRaw(t, func(n int, req string, c net.Conn) {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
		})
		r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
		for _, stream := range []string{"false", "true"} {
			req := `{"model":"gpt-4o","max_tokens":8,"stream":` + stream + `,"messages":[{"role":"user","content":"hi"}]}`
			for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
				resp, b := postWith(t, r.url+path, req, nil)
				if strings.Contains(b, reKey) || strings.Contains(b, reKey[:len(reKey)/2]) && strings.Contains(b, reKey[len(reKey)/2:]) && !strings.Contains(b, "***") {
					t.Errorf("key at body offset %d, %s stream=%s: the gateway's upstream key reached the client (%d, %d bytes)", off, path, stream, resp.StatusCode, len(b))
				}
			}
		}
	}
}

// An external upstream's error answer to a stream request is read whole
// before its head goes out; a stall in it is bounded (2 s once its first
// bytes came, as for any answer kept aside), never by
// stream_first_packet_s alone.
func TestAStalledExternalErrorBodyOfAStreamRequestIsBounded(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 500 X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"))
		p1 := `{"error":{"message":"partial`
		c.Write([]byte("1c\r\n" + p1 + "\r\n"))
		time.Sleep(8 * time.Second)
	})
	cfg := reSplitOnly(up.url)
	cfg.Timeouts.StreamIdleSeconds = 1
	cfg.Timeouts.StreamFirstPacketSeconds = 30
	r := startRouterWith(t, nil, cfg, nil)
	body := `{"model":"gpt-4o","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	start := time.Now()
	resp, b := postWith(t, r.url+"/v1/chat/completions", body, nil)
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("a stalled error body with stream_idle_s 1 held the client %v: %d %q", el, resp.StatusCode, b)
	}
}

// An external upstream's 4xx error answer that breaks before its end (cut
// short, or stalled past the 2 s an answer kept aside gets) cannot be
// relayed: the client gets 502 upstream_error, consistent with itself, as
// for a broken 5xx (it got the 4xx status with server_error wording).
func TestABrokenExternal4xxAnswerIsA502(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"error\":"))
	})
	r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		resp, b := postWith(t, r.url+path, `{"model":"gpt-4o","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if resp.StatusCode != 502 || !strings.Contains(b, "error") {
			t.Errorf("%s: a 400 cut short by the external upstream answered %d %q, want 502", path, resp.StatusCode, b)
		}
	}
}

// An external API's (or engine's) headers that speak for its own origin
// never reach the client, who would take them as the router's: a
// load balancer's Set-Cookie (Cloudflare's __cf_bm in front of OpenAI), a
// Strict-Transport-Security with includeSubDomains, an Alt-Svc. Both were
// relayed, over plain and streamed answers and error answers alike.
func TestAnUpstreamsOriginHeadersNeverReachTheClient(t *testing.T) {
	hdrs := "Set-Cookie: __cf_bm=upstream; path=/; domain=.provider.example\r\nStrict-Transport-Security: max-age=31536000; includeSubDomains\r\nAlt-Svc: h3=\":443\"\r\n"
	for _, status := range []string{"200 OK", "429 Too Many Requests"} {
		up := startRaw(t, func(n int, req string, c net.Conn) {
			body := `{"id":"x","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
			c.Write([]byte("HTTP/1.1 " + status + "\r\n" + hdrs + "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
		})
		r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
		resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
		for _, k := range []string{"Set-Cookie", "Strict-Transport-Security", "Alt-Svc"} {
			if v := resp.Header.Get(k); v != "" {
				t.Errorf("%s: the upstream's %s reached the client: %q (%d %.80q)", status, k, v, resp.StatusCode, b)
			}
		}
	}
}

// An external upstream's error answer with a Content-Encoding (a gzip body
// the gateway never asked for) cannot be scrubbed of the gateway's key,
// and a kept-aside answer is relayed without its Content-Encoding: it is
// not relayed. The client used to get the compressed bytes as
// "application/json" with no Content-Encoding (an unreadable answer), and
// gunzipping them gave it the gateway's key.
func TestAContentEncodedErrorAnswerOfAnExternalUpstreamIsNotRelayed(t *testing.T) {
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte(`{"error":{"message":"Incorrect API key provided: Bearer ` + reKey + `","type":"invalid_request_error"}}`))
	zw.Close()
	gz := zb.String()
	for _, status := range []int{400, 500} {
		up := startRaw(t, func(n int, req string, c net.Conn) {
			c.Write([]byte("HTTP/1.1 " + strconv.Itoa(status) + " X\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: " +
				strconv.Itoa(len(gz)) + "\r\n\r\n" + gz))
		})
		r := startRouterWith(t, nil, reSplitOnly(up.url), nil)
		for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
			body := gptBody
			if path == "/v1/messages" {
				body = `{"model":"gpt-4o","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
			}
			resp, b := postWith(t, r.url+path, body, nil)
			plain := b
			if zr, err := gzip.NewReader(strings.NewReader(b)); err == nil {
				d, _ := io.ReadAll(zr)
				plain = string(d)
			}
			if strings.Contains(plain, reKey) {
				t.Errorf("%s status %d: the gateway's upstream key reached the client in a compressed body", path, status)
			}
			if !json.Valid([]byte(b)) || !strings.Contains(b, `"error"`) {
				t.Errorf("%s status %d: the client got no readable error answer: %d Content-Encoding %q %q",
					path, status, resp.StatusCode, resp.Header.Get("Content-Encoding"), b)
			}
		}
	}
}
