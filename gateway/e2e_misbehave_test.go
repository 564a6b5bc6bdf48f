// End-to-end checks that a misbehaving engine is handled alike over HTTP
// and NATS: the same hand-written engine answers behind a static HTTP
// worker and behind a NATS worker sidecar.

package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
)

// rawEngine is an engine whose chat answers are written by hand on the
// hijacked connection; /health and /v1/models answer normally.
type rawEngine struct {
	url     string
	hits    atomic.Int32
	aborted atomic.Int32 // the router closed the connection while the engine held it
}

func startRawEngine(t *testing.T, model string, answer func(e *rawEngine, c net.Conn)) *rawEngine {
	t.Helper()
	e := &rawEngine{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, model)
		case "/v1/chat/completions":
			e.hits.Add(1)
			io.Copy(io.Discard, r.Body)
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			answer(e, c)
		default:
			io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// waitClosed blocks until the peer closes c (or 30 s), counting it as an abort.
func (e *rawEngine) waitClosed(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b := make([]byte, 512)
	for {
		if _, err := c.Read(b); err != nil {
			if !isTimeoutErr(err) {
				e.aborted.Add(1)
			}
			c.Close()
			return
		}
	}
}

func isTimeoutErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

const goodChunk = `data: {"id":"g","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"from the good engine"},"finish_reason":null}]}` + "\n\n"

func goodStream(e *rawEngine, c net.Conn) {
	io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+goodChunk+"data: [DONE]\n\n")
	c.Close()
}

const sseChunkedHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// misbehaveFleet starts a router over transport in front of the given
// engines (model "m"), with the given config file and extra flags.
func misbehaveFleet(t *testing.T, transport, etcd, natsURL, prefix, cfg string, extra []string, engines ...*rawEngine) (*Gateway, string) {
	t.Helper()
	var common []string
	if transport == "nats" {
		common = transportFlags(etcd, natsURL, "nats", prefix)
		for i, e := range engines {
			startWorker(t, append([]string{"--id", fmt.Sprintf("%s%d", strings.Trim(strings.ReplaceAll(prefix, "/", "-"), "-"), i),
				"--engine-url", e.url, "--models", "m", "--lease-ttl", "2s"}, common...)...)
		}
	} else {
		var urls []string
		for _, e := range engines {
			urls = append(urls, e.url)
		}
		common = []string{"--workers", strings.Join(urls, ","), "--worker-model", "m"}
	}
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, cfg)
	rt, r := startServe(t, append(append([]string{"--router-policy", "round-robin", "--config", cfgPath}, extra...), common...)...)
	waitRoutable(t, rt, len(engines))
	return rt, r
}

func workerOf(rt *Gateway, e *rawEngine) *fleet.Worker {
	for _, w := range rt.fleet.View().All {
		if strings.TrimRight(w.URL, "/") == strings.TrimRight(e.url, "/") {
			return w
		}
	}
	return nil
}

// waitLoadZero fails unless every worker's load counters return to zero.
func waitLoadZero(t *testing.T, rt *Gateway) {
	t.Helper()
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		bad := ""
		for _, w := range rt.fleet.View().All {
			l := w.Load
			if l.Requests.Load() != 0 || l.Tokens.Load() != 0 || l.PrefillTokens.Load() != 0 || l.Blocks.Load() != 0 || l.Pending.Load() != 0 {
				bad += fmt.Sprintf(" %s: req=%d tok=%d prefill=%d blocks=%d pending=%d", w.ID, l.Requests.Load(), l.Tokens.Load(),
					l.PrefillTokens.Load(), l.Blocks.Load(), l.Pending.Load())
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("load counters did not return to zero:%s", bad)
		}
	}
}

// postTimed posts body with a client timeout; err is non-nil on a hang.
func postTimed(url, body string, timeout time.Duration) (int, string, time.Duration, error) {
	c := &http.Client{Timeout: timeout}
	t0 := time.Now()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", time.Since(t0), err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), time.Since(t0), err
}

const rvStreamChat = `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"misbehave"}]}`

// A stream whose engine sends an SSE comment (a keep-alive) after its head
// and then nothing more, or nothing but keep-alives, has not sent its first
// packet: over HTTP the attempt fails at stream_first_packet_s and the
// request goes to the other worker. Over NATS the same engine must be
// treated alike (docs/router.md "Failover", "Timeouts").
func TestE2EStreamCommentThenStallIsAFirstPacketTimeoutOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	for _, mode := range []string{"stall", "keepalives"} {
		for _, transport := range []string{"http", "nats"} {
			t.Run(mode+"/"+transport, func(t *testing.T) {
				bad := startRawEngine(t, "m", func(e *rawEngine, c net.Conn) {
					io.WriteString(c, sseChunkedHead+chunk(": keep-alive\n\n"))
					if mode == "stall" {
						e.waitClosed(c)
						return
					}
					for i := 0; i < 150; i++ {
						time.Sleep(200 * time.Millisecond)
						if _, err := io.WriteString(c, chunk(": keep-alive\n\n")); err != nil {
							e.aborted.Add(1)
							c.Close()
							return
						}
					}
					c.Close()
				})
				good := startRawEngine(t, "m", goodStream)
				rt, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rv1-"+mode+"-"+transport+"/", `{"timeouts":{"stream_first_packet_s":0.5}}`,
					[]string{"--request-max-retries", "1"}, bad, good)
				for i := 0; i < 2; i++ {
					st, b, el, err := postTimed(r+"/v1/chat/completions", rvStreamChat, 8*time.Second)
					if err != nil || st != 200 || !strings.Contains(b, "from the good engine") || strings.Contains(b, `"error"`) || el > 4*time.Second {
						t.Fatalf("request %d over %s: %d after %v (%v): %q; want the good engine's stream within ~1 s (first packet 0.5 s, then a retry)",
							i, transport, st, el.Round(time.Millisecond), err, clip(b))
					}
				}
				if bad.hits.Load() == 0 {
					t.Fatal("the misbehaving engine was never tried")
				}
				for end := time.Now().Add(2 * time.Second); bad.aborted.Load() != bad.hits.Load(); time.Sleep(20 * time.Millisecond) {
					if time.Now().After(end) {
						t.Fatalf("the misbehaving engine's requests were not aborted: %d of %d", bad.aborted.Load(), bad.hits.Load())
					}
				}
				waitLoadZero(t, rt)
			})
		}
	}
}

// A close-delimited event stream (no Content-Length, no chunking; the body
// ends when the engine closes) that the engine closes after a keep-alive
// comment, before its first event, is how a crashed engine looks: over
// HTTP it is retried on another worker (TestACloseDelimitedStreamCutBeforeItsEndIsBroken).
// One cut after its first event, before data: [DONE], is broken: the
// client gets an error event and the worker is blamed. Over NATS the
// worker forwards the same engine's answer; the router must judge it alike.
func TestE2ECloseDelimitedStreamCutIsBrokenOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	const closeHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
	for _, transport := range []string{"http", "nats"} {
		t.Run("before-first-event/"+transport, func(t *testing.T) {
			bad := startRawEngine(t, "m", func(e *rawEngine, c net.Conn) {
				io.WriteString(c, closeHead+": keep-alive\n\n")
				c.Close()
			})
			good := startRawEngine(t, "m", goodStream)
			rt, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rv2a-"+transport+"/", `{}`,
				[]string{"--request-max-retries", "1"}, bad, good)
			for i := 0; i < 2; i++ {
				st, b, el, err := postTimed(r+"/v1/chat/completions", rvStreamChat, 8*time.Second)
				if err != nil || st != 200 || !strings.Contains(b, "from the good engine") {
					t.Fatalf("request %d over %s: %d after %v (%v): %q; want the good engine's stream (the crashed one retried)",
						i, transport, st, el.Round(time.Millisecond), err, clip(b))
				}
			}
			if bad.hits.Load() == 0 {
				t.Fatal("the misbehaving engine was never tried")
			}
			waitLoadZero(t, rt)
		})
		t.Run("after-first-event/"+transport, func(t *testing.T) {
			bad := startRawEngine(t, "m", func(e *rawEngine, c net.Conn) {
				io.WriteString(c, closeHead+goodChunk)
				c.Close()
			})
			rt, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rv2b-"+transport+"/", `{}`,
				[]string{"--request-max-retries", "1", "--breaker-failure-threshold", "1", "--breaker-cooldown-s", "60"}, bad)
			st, b, el, err := postTimed(r+"/v1/chat/completions", rvStreamChat, 8*time.Second)
			if err != nil || st != 200 || !strings.Contains(b, `"error"`) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
				t.Fatalf("over %s: %d after %v (%v): %q; want the stream ended with an error event and [DONE]", transport, st, el, err, clip(b))
			}
			if w := workerOf(rt, bad); w == nil || w.Breaker.State() != 2 {
				t.Fatalf("over %s: the worker whose stream broke was not blamed (breaker state %v)", transport, w.Breaker.State())
			}
			waitLoadZero(t, rt)
		})
	}
}

// Engines that answer something unusable before any response head: one
// that accepts the request and closes (a crash), one that answers bytes
// that are not HTTP. Each is retried on the other worker, and with every
// worker doing it the client gets the same error over both transports.
func TestE2EEnginesFailingBeforeAHeadClassifyAlikeOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	modes := map[string]func(e *rawEngine, c net.Conn){
		"closed":  func(e *rawEngine, c net.Conn) { c.Close() },
		"garbage": func(e *rawEngine, c net.Conn) { io.WriteString(c, "garbage garbage\r\n\r\n"); c.Close() },
		"cut-chunked": func(e *rawEngine, c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk(`{"id":`))
			c.Close()
		},
	}
	got := map[string]map[string]string{}
	for _, mode := range []string{"closed", "garbage", "cut-chunked"} {
		got[mode] = map[string]string{}
		for _, transport := range []string{"http", "nats"} {
			t.Run(mode+"/"+transport, func(t *testing.T) {
				a := startRawEngine(t, "m", modes[mode])
				b := startRawEngine(t, "m", modes[mode])
				rt, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rv3-"+mode+"-"+transport+"/", `{}`,
					[]string{"--request-max-retries", "1", "--breaker-failure-threshold", "1", "--breaker-cooldown-s", "60"}, a, b)
				st, body, el, err := postTimed(r+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`, 8*time.Second)
				if err != nil {
					t.Fatalf("%v after %v", err, el)
				}
				if a.hits.Load()+b.hits.Load() != 2 {
					t.Errorf("over %s: %d engine attempts, want 2", transport, a.hits.Load()+b.hits.Load())
				}
				code := ""
				if i := strings.Index(body, `"code":"`); i >= 0 {
					code = body[i+8:]
					code = code[:strings.IndexByte(code, '"')]
				}
				got[mode][transport] = fmt.Sprintf("%d %s", st, code)
				for _, e := range []*rawEngine{a, b} {
					if w := workerOf(rt, e); w == nil || w.Breaker.State() != 2 {
						t.Errorf("over %s: a worker whose engine failed was not blamed", transport)
					}
				}
				waitLoadZero(t, rt)
			})
		}
		if got[mode]["http"] != got[mode]["nats"] {
			t.Errorf("%s: over http the client got %q, over nats %q", mode, got[mode]["http"], got[mode]["nats"])
		}
	}
}

// A client that leaves while its stream is not committed yet (the engine
// sent its head and a keep-alive, then nothing) has the engine request
// aborted and every load counter returned, over both transports.
func TestE2EClientLeavingAnUncommittedStreamAbortsTheEngineOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) {
			bad := startRawEngine(t, "m", func(e *rawEngine, c net.Conn) {
				io.WriteString(c, sseChunkedHead+chunk(": keep-alive\n\n"))
				e.waitClosed(c)
			})
			rt, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rv4-"+transport+"/", `{}`, []string{"--request-max-retries", "0"}, bad)
			_, _, _, err := postTimed(r+"/v1/chat/completions", rvStreamChat, 700*time.Millisecond)
			if err == nil {
				t.Fatal("the uncommitted stream answered")
			}
			for end := time.Now().Add(3 * time.Second); bad.aborted.Load() != 1; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("over %s: the engine was not told the client left", transport)
				}
			}
			waitLoadZero(t, rt)
		})
	}
}

// An engine that answers an error (503, with a Content-Length) and then
// stalls part-way through its short body: over HTTP the router reads the
// error answer it may retry within stashRestWait (2 s) of its first bytes,
// then gives up on it and tries the other worker (docs/router.md
// "Failover"). Over NATS the same engine must not hold the request until
// non_stream_total_s and then fail it as nobody's fault.
func TestE2EAnErrorAnswerThatStallsIsRetriedOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) {
			bad := startRawEngine(t, "m", func(e *rawEngine, c net.Conn) {
				io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"error\":")
				e.waitClosed(c)
			})
			good := startRawEngine(t, "m", func(e *rawEngine, c net.Conn) {
				body := `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"from the good engine"},"finish_reason":"stop"}]}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
				c.Close()
			})
			rt, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rv5-"+transport+"/", `{"timeouts":{"non_stream_total_s":6}}`,
				[]string{"--request-max-retries", "1"}, bad, good)
			for i := 0; i < 2; i++ {
				st, b, el, err := postTimed(r+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`, 10*time.Second)
				if err != nil || st != 200 || !strings.Contains(b, "from the good engine") || el > 4*time.Second {
					t.Fatalf("request %d over %s: %d after %v (%v): %q; want the good engine's answer within ~2 s", i, transport, st, el.Round(time.Millisecond), err, clip(b))
				}
			}
			waitLoadZero(t, rt)
		})
	}
}

// An engine whose response head breaks off part-way (a status line and half
// a header, then a close) sent something that is not a usable HTTP
// response: over HTTP the client gets 502 upstream_protocol_error
// (docs/router.md), and over NATS too: the worker reports a head cut
// part-way as a protocol failure (it was a failure before a head, which
// fca34b6 counted as unreachable: 503 no_workers_reachable).
func TestE2EAHeadCutPartWayClassifiesAlikeOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	cut := func(e *rawEngine, c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: appl")
		c.Close()
	}
	got := map[string]string{}
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) {
			a := startRawEngine(t, "m", cut)
			b := startRawEngine(t, "m", cut)
			_, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rvd1-"+transport+"/", `{}`,
				[]string{"--request-max-retries", "1"}, a, b)
			st, body, el, err := postTimed(r+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`, 8*time.Second)
			if err != nil {
				t.Fatalf("%v after %v", err, el)
			}
			code := ""
			if i := strings.Index(body, `"code":"`); i >= 0 {
				code = body[i+8:]
				code = code[:strings.IndexByte(code, '"')]
			}
			got[transport] = fmt.Sprintf("%d %s", st, code)
		})
	}
	if got["http"] != got["nats"] {
		t.Errorf("a head cut part-way: over http the client got %q, over nats %q", got["http"], got["nats"])
	}
}

// A close-delimited event stream cut before its first event (a keep-alive,
// then the engine's close) is an invalid response: over HTTP the attempt is
// failProtocol, and with every worker doing it the client gets 502
// upstream_protocol_error. So over NATS: a failure after the head is never
// a worker that could not be reached (it was failConnect there, and the
// client got 503 no_workers_reachable).
func TestE2EACloseDelimitedStreamCutBeforeItsFirstEventClassifiesAlikeOverEveryTransport(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	const closeHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
	cut := func(e *rawEngine, c net.Conn) {
		io.WriteString(c, closeHead+": keep-alive\n\n")
		c.Close()
	}
	got := map[string]string{}
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) {
			a := startRawEngine(t, "m", cut)
			b := startRawEngine(t, "m", cut)
			_, r := misbehaveFleet(t, transport, etcd.Endpoint, nsrv.URL, "/rvd2-"+transport+"/", `{}`,
				[]string{"--request-max-retries", "1"}, a, b)
			st, body, el, err := postTimed(r+"/v1/chat/completions", rvStreamChat, 8*time.Second)
			if err != nil {
				t.Fatalf("%v after %v", err, el)
			}
			code := ""
			if i := strings.Index(body, `"code":"`); i >= 0 {
				code = body[i+8:]
				code = code[:strings.IndexByte(code, '"')]
			}
			got[transport] = fmt.Sprintf("%d %s", st, code)
		})
	}
	if got["http"] != got["nats"] {
		t.Errorf("a close-delimited stream cut before its first event: over http the client got %q, over nats %q", got["http"], got["nats"])
	}
}

// An engine answer the router's HTTP client refuses (ambiguous framing,
// an obsolete folded header, a control byte in a header, two different
// Content-Lengths, or equal ones spelt apart, 5 and 05, which net/http
// refused and the router took: 503 no_workers_reachable over NATS, 200
// over HTTP; or an interim 103 with such framing headers, which net/http
// refused too) is refused over NATS too, with the same error class,
// and an odd answer it takes (an interim 102, a bare-LF head, a 204 or 304
// carrying bytes, a header whose name is no token, which the router drops)
// reaches the client alike over NATS: the worker judges its engine's heads
// by the router's rules (internal/h1). Chunked framing net/http refuses
// (a bare LF in it, a space before a chunk size, a trailer that is no
// header line, chunk extensions past its allowance) the router refuses
// too: it relayed such answers as 200; a folded trailer line, which
// net/http takes, it took as invalid. net/http, which
// the worker reads its engine with, took Content-Length beside chunked
// framing (200 and the body over NATS, 502 over HTTP) and an HTTP/1.0
// answer marked chunked (200 with the raw chunk framing as the body).
func TestE2EAMalformedAnswerIsJudgedAlikeOverEveryTransport(t *testing.T) {
	const ok = `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
	cl := fmt.Sprintf("Content-Length: %d\r\n", len(ok))
	const ct = "Content-Type: application/json\r\n"
	answers := map[string]string{
		"cl-and-chunked":        "HTTP/1.1 200 OK\r\n" + ct + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(ok) + "0\r\n\r\n",
		"http10-chunked":        "HTTP/1.0 200 OK\r\n" + ct + "Transfer-Encoding: chunked\r\n\r\n" + chunk(ok) + "0\r\n\r\n",
		"obs-fold":              "HTTP/1.1 200 OK\r\n" + ct + "X-A: a\r\n b\r\n" + cl + "\r\n" + ok,
		"two-lengths":           "HTTP/1.1 200 OK\r\n" + ct + cl + fmt.Sprintf("Content-Length: %d\r\n", len(ok)+1) + "\r\n" + ok,
		"nul-in-header":         "HTTP/1.1 200 OK\r\n" + ct + "X-A: a\x00b\r\n" + cl + "\r\n" + ok,
		"101":                   "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
		"102-then-200":          "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\n" + ct + cl + "\r\n" + ok,
		"bare-lf":               "HTTP/1.1 200 OK\n" + strings.ReplaceAll(ct+cl, "\r\n", "\n") + "\n" + ok,
		"204-with-a-body":       "HTTP/1.1 204 No Content\r\n" + ct + "\r\n" + ok,
		"304-with-a-body":       "HTTP/1.1 304 Not Modified\r\n" + ct + cl + "\r\n" + ok,
		"chunk-bare-lf":         "HTTP/1.1 200 OK\r\n" + ct + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\n%s\n0\n\n", len(ok), ok),
		"chunk-size-sp":         "HTTP/1.1 200 OK\r\n" + ct + "Transfer-Encoding: chunked\r\n\r\n" + " " + chunk(ok) + "0\r\n\r\n",
		"trailer-junk":          "HTTP/1.1 200 OK\r\n" + ct + "Transfer-Encoding: chunked\r\n\r\n" + chunk(ok) + "0\r\nnot a header\r\n\r\n",
		"ext-overhead":          "HTTP/1.1 200 OK\r\n" + ct + "Transfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("x", 2000)+"\r\n{\r\n", 10) + "0\r\n\r\n",
		"trailer-fold":          "HTTP/1.1 200 OK\r\n" + ct + "Transfer-Encoding: chunked\r\n\r\n" + chunk(ok) + "0\r\nX-T: a\r\n b\r\n\r\n",
		"no-token-name":         "HTTP/1.1 102 Processing\r\nX(B): c\r\n\r\nHTTP/1.1 200 OK: fine\r\n" + ct + "X@A: b\r\n" + cl + "\r\n" + ok,
		"interim-no-token-name": "HTTP/1.1 103 Early Hints\r\nX(B): c\r\n\r\nHTTP/1.1 200 OK\r\n" + ct + cl + "\r\n" + ok,
		"interim-two-lengths":   "HTTP/1.1 103 Early Hints\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nHTTP/1.1 200 OK\r\n" + ct + cl + "\r\n" + ok,
		"interim-gzip":          "HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: gzip\r\n\r\nHTTP/1.1 200 OK\r\n" + ct + cl + "\r\n" + ok,
		"lengths-spelt-apart":   "HTTP/1.1 200 OK\r\n" + ct + cl + fmt.Sprintf("Content-Length: 0%d\r\n", len(ok)) + "\r\n" + ok,
	}
	refused := map[string]bool{"cl-and-chunked": true, "http10-chunked": true, "obs-fold": true, "two-lengths": true, "nul-in-header": true, "101": true,
		"chunk-bare-lf": true, "chunk-size-sp": true, "trailer-junk": true, "ext-overhead": true, "lengths-spelt-apart": true,
		"interim-two-lengths": true, "interim-gzip": true}
	var names []string
	for k := range answers {
		names = append(names, k)
	}
	got := map[string]map[string]string{"http": {}, "nats": {}}
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/models":
				io.WriteString(w, `{"object":"list","data":[{"id":"mal","object":"model"}]}`)
			case "/v1/chat/completions":
				b, _ := io.ReadAll(r.Body)
				answer := ""
				for name, a := range answers {
					if strings.Contains(string(b), `"content":"`+name+`"`) {
						answer = a
					}
				}
				c, _, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				io.WriteString(c, answer)
				c.Close()
			default:
				io.WriteString(w, "ok")
			}
		}))
		t.Cleanup(srv.Close)
		if transport == "nats" {
			startWorker(t, append([]string{"--id", "mal0", "--engine-url", srv.URL, "--models", "mal", "--lease-ttl", "2s"}, common...)...)
		} else {
			common = []string{"--workers", srv.URL}
		}
		rt, r := startServe(t, append([]string{"--request-max-retries", "0"}, common...)...)
		waitRoutable(t, rt, 1)
		for _, name := range names {
			st, body, el, err := postTimed(r+"/v1/chat/completions", `{"model":"mal","max_tokens":2,"messages":[{"role":"user","content":"`+name+`"}]}`, 8*time.Second)
			if err != nil {
				t.Fatalf("%s: %v after %v", name, err, el)
			}
			res := fmt.Sprintf("%d %s", st, body)
			if i := strings.Index(body, `"code":"`); i >= 0 && st >= 400 {
				code := body[i+8:]
				res = fmt.Sprintf("%d %s", st, code[:strings.IndexByte(code, '"')])
			}
			got[transport][name] = res
			if refused[name] && res != "502 upstream_protocol_error" {
				t.Errorf("%s over %s: %s, want 502 upstream_protocol_error", name, transport, res)
			}
		}
	})
	for _, name := range names {
		if got["http"][name] != got["nats"][name] {
			t.Errorf("%s: over http the client got %q, over nats %q", name, got["http"][name], got["nats"][name])
		}
	}
}

// reuseClosingEngine answers model "m" on keep-alive connections, and
// closes a connection when a second chat request comes on it, after
// reading it: an engine closing an idle keep-alive connection just as it
// is reused, which a loaded machine hits at random (the engine of
// TestE2EAMalformedAnswerIsJudgedAlikeOverEveryTransport closes after each
// answer, and the next request could find the connection pooled still).
func startReuseClosingEngine(t *testing.T) (url string, chats *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	chats = new(atomic.Int32)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				served := false
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					body := "ok"
					switch req.URL.Path {
					case "/v1/models":
						body = `{"object":"list","data":[{"id":"m","object":"model"}]}`
					case "/v1/chat/completions":
						chats.Add(1)
						if served {
							return
						}
						served = true
						body = `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
					}
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), chats
}

// An engine that closes a reused keep-alive connection as a request comes
// on it answers that request on a fresh connection over either transport:
// the HTTP transport sent it again; over NATS the worker failed it as an
// engine it could not reach, and the client of a one-worker fleet got 503
// no_workers_reachable (at random on a loaded machine, where the engine
// closed the connection after its answer and the worker's client had not
// seen it yet).
func TestE2EAReusedEngineConnectionClosedUnderARequestIsAnsweredAlikeOverEveryTransport(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		url, chats := startReuseClosingEngine(t)
		if transport == "nats" {
			startWorker(t, append([]string{"--id", "reuse0", "--engine-url", url, "--models", "m", "--lease-ttl", "2s"}, common...)...)
		} else {
			common = []string{"--workers", url, "--worker-model", "m"}
		}
		rt, r := startServe(t, append([]string{"--request-max-retries", "0"}, common...)...)
		waitRoutable(t, rt, 1)
		for i := 0; i < 3; i++ {
			st, body, el, err := postTimed(r+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`, 8*time.Second)
			if err != nil {
				t.Fatalf("request %d: %v after %v", i, err, el)
			}
			if st != 200 {
				t.Fatalf("request %d over %s: %d %s", i, transport, st, body)
			}
		}
		// Each request after the first came on a reused connection, which
		// the engine closed: it read it twice.
		if n := chats.Load(); n != 5 {
			t.Errorf("the engine read %d chat requests, want 5", n)
		}
	})
}
