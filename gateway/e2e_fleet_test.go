package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testsrv"
	"github.com/infera/infera/worker"
)

// startWorker runs `infera worker args...` in-process. The test's end
// drains it, after the router that used it stopped (a router started after
// it stops first): there is no router left to see DRAINING, nor a request
// of the test in flight, so unless args set them that drain neither waits
// for its propagation (1 s by default) nor for a grace period in place of
// an unknown in-flight count (5 s), and waits at most a second for what
// its engine still counts active (a hung engine's request, the KV blocks a
// vLLM prefill engine holds for a decode that never pulled them). A test
// that drains a worker itself, with a router watching, sets
// --drain-propagation (and --drain-timeout when it waits for a request).
func startWorker(t *testing.T, args ...string) *worker.Sidecar {
	t.Helper()
	for _, d := range [][2]string{{"--drain-propagation", "0s"}, {"--drain-grace", "0s"}, {"--drain-timeout", "1s"}} {
		if !slices.Contains(args, d[0]) {
			args = append(args, d[0], d[1])
		}
	}
	var c struct {
		Worker worker.Cmd `cmd:""`
	}
	p, err := kong.New(&c, kong.Name("infera"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(append([]string{"worker"}, args...)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.Worker.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Drain(ctx)
	})
	return s
}

func waitRoutable(t *testing.T, rt *Gateway, n int) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if len(rt.fleet.View().Routable) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("routable workers: %d, want %d", len(rt.fleet.View().Routable), n)
}

const e2eChat = `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"hello fleet"}]}`

// The routing doc's "running without a broker" recipe: etcd + http + zmq.
func TestE2EEtcdDiscoveryHTTP(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	_, e1 := startEngine(t, "--speedup", "50")
	startWorker(t, "--id", "w1", "--engine-url", e1, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "http", "--kv-event-transport", "zmq", "--lease-ttl", "2s")
	rt, r := startServe(t, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "http", "--kv-event-transport", "zmq")
	waitRoutable(t, rt, 1)
	if resp, b := doPost(t, r+"/v1/chat/completions", e2eChat); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	resp, err := http.Get(r + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("health %d", resp.StatusCode)
	}
}

// NATS request transport with etcd discovery; draining a worker during a
// long stream loses nothing: the stream completes, new requests go to the
// other worker, and the drain ends only after the stream did. The stream
// lasts about 3 s, past the drain's 1 s propagation wait: with a 36 ms
// stream (speedup 20, 60 tokens) the test passed with the drain's wait
// for requests in flight removed.
func TestE2ENATSTransportAndDrain(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	eng1, e1 := startEngine(t) // 12 ms a token: the long stream's 250 take 3 s
	eng2, e2 := startEngine(t, "--speedup", "20")
	common := []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", nsrv.URL, "--lease-ttl", "2s"}
	w1 := startWorker(t, append([]string{"--id", "w1", "--engine-url", e1, "--drain-timeout", "20s", "--drain-propagation", "1s"}, common...)...)
	startWorker(t, append([]string{"--id", "w2", "--engine-url", e2}, common...)...)
	rt, r := startServe(t, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", nsrv.URL, "--router-policy", "round-robin")
	waitRoutable(t, rt, 2)
	for i := 0; i < 4; i++ {
		if resp, b := doPost(t, r+"/v1/chat/completions", e2eChat); resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":3`) {
			t.Fatalf("nats request: %d %s", resp.StatusCode, b)
		}
	}
	if eng1.Stats().Completed == 0 || eng2.Stats().Completed == 0 {
		t.Fatalf("round-robin over NATS did not reach both engines")
	}

	// A long stream on w1, then drain w1 while it runs.
	before2 := eng2.Stats().Completed
	var streamBody string
	var streamEnd time.Time
	var wg sync.WaitGroup
	wg.Add(1)
	started := make(chan struct{})
	go func() {
		defer wg.Done()
		// Pin the stream to w1 through direct mode is not available here:
		// retry until eng1 serves it (round-robin alternates).
		for i := 0; i < 4; i++ {
			before := eng1.Stats().Submitted
			resp, err := http.Post(r+"/v1/chat/completions", "application/json", strings.NewReader(
				`{"model":"sim-model","stream":true,"max_tokens":250,"messages":[{"role":"user","content":"long"}]}`))
			if err != nil {
				t.Error(err)
				return
			}
			br := bufio.NewReader(resp.Body)
			br.ReadString('\n')
			if eng1.Stats().Submitted == before {
				resp.Body.Close()
				continue
			}
			close(started)
			var sb strings.Builder
			sb.WriteString("data:")
			for {
				line, err := br.ReadString('\n')
				sb.WriteString(line)
				if err != nil {
					break
				}
			}
			streamEnd = time.Now()
			resp.Body.Close()
			streamBody = sb.String()
			return
		}
		t.Error("stream never reached engine 1")
		close(started)
	}()
	<-started
	drained := make(chan error, 1)
	var drainEnd time.Time
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		err := w1.Drain(ctx)
		drainEnd = time.Now()
		drained <- err
	}()
	waitRoutable(t, rt, 1)
	for i := 0; i < 4; i++ {
		if resp, b := doPost(t, r+"/v1/chat/completions", e2eChat); resp.StatusCode != 200 {
			t.Fatalf("during drain: %d %s", resp.StatusCode, b)
		}
	}
	if got := eng2.Stats().Completed - before2; got < 4 {
		t.Fatalf("new requests did not go to the remaining worker (%d)", got)
	}
	wg.Wait()
	if !strings.HasSuffix(streamBody, "data: [DONE]\n\n") || strings.Contains(streamBody, `"error"`) {
		t.Fatalf("stream during drain was cut: %q", streamBody[max(0, len(streamBody)-200):])
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if drainEnd.Before(streamEnd) {
		t.Fatalf("the drain ended %v before the stream it should wait for", streamEnd.Sub(drainEnd).Round(time.Millisecond))
	}
}

// Every timeouts.* setting of the configuration center applies over both
// request transports alike, and a reload changes them: a hung engine gets
// the non-streaming total and the stream's first-packet deadline (504), a
// stream that goes quiet between tokens the idle deadline (which does not
// cut a slow first token: that wait is the first packet's), and a long
// stream the total cap (both end with an error event, then [DONE]).
func TestE2ETimeoutsApplyOverEveryTransport(t *testing.T) {
	eachTransport(t, testTimeoutsOver)
}

func testTimeoutsOver(t *testing.T, transport string, flags []string) {
	common := append(append([]string(nil), flags...), "--lease-ttl", "2s")
	_, hung := startEngine(t, "--model", "hang-model", "--fault", "hang")
	// 50x slower steps: about 0.6 s between two tokens.
	_, slow := startEngine(t, "--model", "slow-model", "--fault", "slow", "--fault-factor", "50")
	_, long := startEngine(t, "--model", "long-model")
	startWorker(t, append([]string{"--id", transport + "-hung", "--engine-url", hung, "--models", "hang-model"}, common...)...)
	startWorker(t, append([]string{"--id", transport + "-slow", "--engine-url", slow, "--models", "slow-model"}, common...)...)
	startWorker(t, append([]string{"--id", transport + "-long", "--engine-url", long, "--models", "long-model"}, common...)...)

	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, `{"timeouts":{"non_stream_total_s":0.3,"stream_first_packet_s":0.3}}`)
	rt, r := startServe(t, append(append([]string(nil), flags...),
		"--config", cfgPath, "--config-poll", "20ms", "--request-max-retries", "0")...)
	waitRoutable(t, rt, 3)
	reload := func(s string, applied func() bool) {
		t.Helper()
		writeConfig(t, cfgPath, s)
		waitConfig(t, rt, applied)
	}
	chat := func(model string, stream bool, maxTokens int) string {
		return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"timeouts"}]}`, model, stream, maxTokens)
	}

	// A hung engine: the non-streaming total, then the first packet.
	t0 := time.Now()
	resp, b := doPost(t, r+"/v1/chat/completions", chat("hang-model", false, 4))
	if el := time.Since(t0); resp.StatusCode != 504 || el > 2*time.Second {
		t.Fatalf("non-stream total: %d after %v: %s", resp.StatusCode, el, b)
	}
	// The request's own cap, not the worker's fault, over both transports
	// (over NATS it was a worker timeout: blamed, retried, breakers tripped).
	if !strings.Contains(string(b), "total time limit") {
		t.Fatalf("non-stream total over %s: %s", transport, b)
	}
	t0 = time.Now()
	resp, b = doPost(t, r+"/v1/chat/completions", chat("hang-model", true, 4))
	if el := time.Since(t0); resp.StatusCode != 504 || el > 2*time.Second {
		t.Fatalf("stream first packet: %d after %v: %s", resp.StatusCode, el, b)
	}

	// A stream that goes quiet between tokens: the idle deadline.
	reload(`{"timeouts":{"stream_first_packet_s":10,"stream_idle_s":0.25}}`, func() bool {
		return rt.store.Load().Timeouts.StreamIdleSeconds == 0.25
	})
	t0 = time.Now()
	resp, b = doPost(t, r+"/v1/chat/completions", chat("slow-model", true, 20))
	s := string(b)
	if el := time.Since(t0); resp.StatusCode != 200 || !strings.Contains(s, "timed out") ||
		!strings.HasSuffix(s, "data: [DONE]\n\n") || el > 8*time.Second {
		t.Fatalf("stream idle: %d after %v: %q", resp.StatusCode, el, s)
	}
	if strings.Count(s, `"delta"`) >= 20 {
		t.Fatalf("stream idle: the whole stream came through: %q", s)
	}

	// A long stream: the total cap.
	reload(`{"timeouts":{"stream_total_s":0.5}}`, func() bool {
		return rt.store.Load().Timeouts.StreamTotalSeconds == 0.5
	})
	t0 = time.Now()
	resp, b = doPost(t, r+"/v1/chat/completions", chat("long-model", true, 400))
	s = string(b)
	if el := time.Since(t0); resp.StatusCode != 200 || !strings.Contains(s, "timed out") ||
		!strings.HasSuffix(s, "data: [DONE]\n\n") || el > 3*time.Second {
		t.Fatalf("stream total: %d after %v: %q", resp.StatusCode, el, clip(s))
	}
	// Without the cap the same stream runs to its end.
	reload(`{"timeouts":{}}`, func() bool { return rt.store.Load().Timeouts.StreamTotalSeconds == 0 })
	resp, b = doPost(t, r+"/v1/chat/completions", chat("long-model", true, 40))
	if s := string(b); resp.StatusCode != 200 || strings.Contains(s, "timed out") || !strings.HasSuffix(s, "data: [DONE]\n\n") {
		t.Fatalf("uncapped stream: %d %q", resp.StatusCode, clip(s))
	}
}

// clip shortens a long answer for a failure message.
func clip(s string) string {
	if len(s) > 600 {
		return s[:300] + " ... " + s[len(s)-300:]
	}
	return s
}

// A client that leaves while its request waits for the first byte (here a
// 3 s prefill) has the engine request cancelled at once, over both
// transports, streaming or not: the engine aborts it instead of prefilling
// on for nobody. (TestE2EClientDisconnectStopsGeneration leaves mid-stream.)
func TestE2EClientGoneBeforeTheFirstByteCancelsTheEngine(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		common = append(common, "--lease-ttl", "2s")
		// The prefill outlasts the abort's bound below by far: on a
		// loaded machine the cancel took over 2 s once (it was 3 s and 2 s).
		eng, e := startEngine(t, "--prefill-base", "20s")
		startWorker(t, append([]string{"--id", transport + "-w", "--engine-url", e}, common...)...)
		rt, r := startServe(t, append([]string{"--request-max-retries", "0"}, common[:len(common)-2]...)...)
		waitRoutable(t, rt, 1)
		for i, stream := range []bool{false, true} {
			body := fmt.Sprintf(`{"model":"sim-model","stream":%v,"max_tokens":4,"messages":[{"role":"user","content":"gone %d"}]}`, stream, i)
			conn, err := net.Dial("tcp4", strings.TrimPrefix(r, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			for eng.Stats().Submitted != uint64(i+1) {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // the engine is prefilling; no byte has come back
			conn.Close()
			closed := time.Now()
			for eng.Stats().Aborted != uint64(i+1) {
				if time.Since(closed) > 10*time.Second {
					t.Fatalf("stream=%v: the engine was not told the client left: %+v", stream, eng.Stats())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if st := eng.Stats(); st.Completed != 0 {
				t.Fatalf("stream=%v: the engine finished a request nobody waits for: %+v", stream, st)
			}
		}
	})
}

// Engine failures are classified alike over both transports: a 500 is the
// worker's fault (retried on another worker, counted by its breaker until
// it opens), a 400 is the client's (relayed as it is, never retried, never
// counted), and a stream cut by the configured total cap is nobody's.
func TestE2EFailuresClassifyAlikeOverEveryTransport(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		_, failing := startEngine(t, "--model", "m", "--speedup", "50", "--fault", "error", "--fault-status", "500")
		good, ok := startEngine(t, "--model", "m", "--speedup", "50")
		refusing, bad := startEngine(t, "--model", "picky", "--speedup", "50", "--fault", "error", "--fault-status", "400")
		_, long := startEngine(t, "--model", "long")
		for id, url := range map[string]string{"failing": failing, "good": ok, "refusing": bad, "long": long} {
			startWorker(t, append([]string{"--id", transport + "-" + id, "--engine-url", url, "--lease-ttl", "2s"}, common...)...)
		}
		cfgPath := filepath.Join(t.TempDir(), "infera.json")
		writeConfig(t, cfgPath, `{"timeouts":{"stream_total_s":0.3}}`)
		rt, r := startServe(t, append([]string{"--router-policy", "round-robin", "--request-max-retries", "1",
			"--breaker-failure-threshold", "2", "--breaker-cooldown-s", "60", "--config", cfgPath}, common...)...)
		waitRoutable(t, rt, 4)
		chat := func(model string, stream bool, maxTokens int) string {
			return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"faults"}]}`, model, stream, maxTokens)
		}
		// 500s: every request still succeeds, on the good engine, and
		// the failing worker's breaker opens.
		for i := 0; i < 6; i++ {
			if resp, b := doPost(t, r+"/v1/chat/completions", chat("m", false, 2)); resp.StatusCode != 200 {
				t.Fatalf("request %d with a failing worker: %d %s", i, resp.StatusCode, b)
			}
		}
		if st := rt.fleet.Get(transport + "-failing").Breaker.State(); st != 2 {
			t.Fatalf("failing worker's breaker state %d, want 2 (open)", st)
		}
		if good.Stats().Completed != 6 {
			t.Fatalf("good engine completed %d, want 6", good.Stats().Completed)
		}
		// 400s: relayed, not retried, not the worker's fault.
		for i := 0; i < 4; i++ {
			resp, b := doPost(t, r+"/v1/chat/completions", chat("picky", false, 2))
			if resp.StatusCode != 400 || !strings.Contains(string(b), `"error"`) {
				t.Fatalf("refused request %d: %d %s", i, resp.StatusCode, b)
			}
		}
		if st := rt.fleet.Get(transport + "-refusing").Breaker.State(); st != 0 {
			t.Fatalf("a worker refusing bad requests has breaker state %d, want 0 (closed)", st)
		}
		if n := refusing.Stats().RequestsTotal; n != 4 {
			t.Fatalf("refusing engine saw %d requests, want 4 (a 400 is never retried)", n)
		}
		// The configured stream cap, three times over a threshold of 2:
		// the stream ends with the timeout event, the breaker stays closed.
		for i := 0; i < 3; i++ {
			resp, b := doPost(t, r+"/v1/chat/completions", chat("long", true, 400))
			if s := string(b); resp.StatusCode != 200 || !strings.Contains(s, "timed out") || !strings.HasSuffix(s, "data: [DONE]\n\n") {
				t.Fatalf("capped stream %d: %d %q", i, resp.StatusCode, clip(s))
			}
		}
		if st := rt.fleet.Get(transport + "-long").Breaker.State(); st != 0 {
			t.Fatalf("streams cut by the configured cap opened the breaker: state %d", st)
		}
	})
}

// Over NATS nothing slows the worker down when the router's client reads
// slowly, so the router bounds what it holds per stream; a client that
// pauses while a 32 MB stream arrives gets its stream cut (after about
// 8 MB buffered, plus what the sockets hold) with an error event saying it
// read too slowly, and the worker's breaker (threshold 1)
// stays closed: a slow client is never the worker's fault, over either
// transport (TestSlowClientIsNotBlamedOnWorker covers HTTP).
func TestE2ESlowClientOverNATSIsNotBlamedOnTheWorker(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	event := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 2048; i++ { // 32 MB
			if _, err := io.WriteString(w, event); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(ln)
	t.Cleanup(func() { up.Close() })
	common := transportFlags(etcd.Endpoint, nsrv.URL, "nats", "/infera/workers/")
	startWorker(t, append([]string{"--id", "big", "--engine-url", "http://" + ln.Addr().String(), "--models", "m", "--lease-ttl", "2s"}, common...)...)
	rt, r := startServe(t, append([]string{"--breaker-failure-threshold", "1", "--client-write-timeout", "20s"}, common...)...)
	waitRoutable(t, rt, 1)

	c, err := net.Dial("tcp4", strings.TrimPrefix(r, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"a long answer"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	head := make([]byte, 512)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(head)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the worker sends everything meanwhile
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	rest, _ := io.ReadAll(c)
	got := string(head[:n]) + string(rest)
	if !strings.Contains(got, "the client read it more slowly than the engine wrote it") || !strings.Contains(got, "data: [DONE]\n\n") {
		t.Fatalf("slow client: %d bytes, tail %q; want the stream cut as too slowly read", len(got), got[max(0, len(got)-300):])
	}
	if len(got) > 28<<20 {
		t.Fatalf("the router relayed %d bytes: it buffered nearly the whole answer", len(got))
	}
	if st := rt.fleet.Get("big").Breaker.State(); st != 0 {
		t.Fatalf("a slow client opened the worker's breaker: state %d", st)
	}
}

// The protocol front doors work alike over both transports: Anthropic's
// Messages API and OpenAI's Responses API, converted to chat completions
// for an engine that speaks only those, answered whole and streamed (the
// simulated engine always stops at the token limit: an incomplete
// response, as OpenAI reports one cut by max_output_tokens).
func TestE2EProtocolsOverEveryTransport(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		_, e := startEngine(t, "--speedup", "50")
		startWorker(t, append([]string{"--id", transport + "-w", "--engine-url", e, "--lease-ttl", "2s"}, common...)...)
		rt, r := startServe(t, common...)
		waitRoutable(t, rt, 1)
		for _, c := range []struct {
			path, body string
			want       []string
		}{
			{"/v1/messages", `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
				[]string{`"type":"message"`, `"input_tokens":`, `"output_tokens":4`}},
			{"/v1/messages", `{"model":"sim-model","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
				[]string{"event: message_start", "event: content_block_delta", `"output_tokens":4`, "event: message_stop"}},
			{"/v1/responses", `{"model":"sim-model","max_output_tokens":4,"input":"hi"}`,
				[]string{`"object":"response"`, `"status":"incomplete"`, `"reason":"max_output_tokens"`, `"output_tokens":4`}},
			{"/v1/responses", `{"model":"sim-model","max_output_tokens":4,"stream":true,"input":"hi"}`,
				[]string{"event: response.created", "event: response.output_text.delta", "event: response.incomplete", `"reason":"max_output_tokens"`}},
		} {
			resp, b := doPost(t, r+c.path, c.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, b)
			}
			for _, w := range c.want {
				if !strings.Contains(string(b), w) {
					t.Fatalf("%s %s: no %s in %s", c.path, c.body, w, clip(string(b)))
				}
			}
		}
	})
}

// overTransport returns the `infera serve` flags that put the router in
// front of the engines at urls over transport: static workers for http;
// for nats an etcd, a NATS server and one worker sidecar per engine (ids
// w0, w1, ...), started here and stopped with the test. Wait for
// waitRoutable(len(urls)) after starting the router.
func overTransport(t *testing.T, transport string, urls ...string) []string {
	t.Helper()
	if transport == "http" {
		return []string{"--workers", strings.Join(urls, ",")}
	}
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	common := transportFlags(etcd.Endpoint, nsrv.URL, "nats", "/infera/workers/")
	for i, u := range urls {
		startWorker(t, append([]string{"--id", fmt.Sprintf("w%d", i), "--engine-url", u, "--lease-ttl", "2s"}, common...)...)
	}
	return common
}

// transportFlags are the discovery and transport flags shared by a
// router and its worker sidecars: etcd discovery under prefix, requests
// over transport.
func transportFlags(etcdEndpoint, natsURL, transport, prefix string) []string {
	return []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcdEndpoint, "--etcd-prefix", prefix,
		"--request-transport", transport, "--kv-event-transport", "zmq", "--nats-url", natsURL}
}

// eachTransport runs f once per request transport (http, then nats) as a
// subtest, with the discovery and transport flags of a fleet on etcd and
// NATS servers started once for the test; each subtest's workers live
// under a key prefix of their own.
func eachTransport(t *testing.T, f func(t *testing.T, transport string, common []string)) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) {
			f(t, transport, transportFlags(etcd.Endpoint, nsrv.URL, transport, "/infera-"+transport+"/workers/"))
		})
	}
}

// startWorkerChild runs `infera worker args...` as a child process, which
// the test may kill; the router's waitRoutable tells when it is up.
func startWorkerChild(t *testing.T, args ...string) *child {
	t.Helper()
	return launchChild(t, "worker", "", "worker.log", args)
}

// A worker sidecar killed (SIGKILL) while it holds a request sends nothing
// more over NATS, and no closed connection tells the router, as one would
// over HTTP. The router's probes of the worker's subscription find it gone
// and the request, not answered yet, goes to another worker: the client
// gets its answer seconds later, not at the 900 s NATS idle timeout.
func TestE2EAWorkerKilledMidRequestOverNATSFailsOver(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	hung := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			io.Copy(io.Discard, r.Body) // then a closed connection cancels r's context
			close(hung)
			<-r.Context().Done() // a prefill that never ends
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	}))
	t.Cleanup(slow.Close)
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodPost {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"from the survivor"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`)
	}))
	t.Cleanup(fast.Close)
	common := transportFlags(etcd.Endpoint, nsrv.URL, "nats", "/infera/workers/")
	doomed := startWorkerChild(t, append([]string{"--id", "doomed", "--engine-url", slow.URL, "--models", "m", "--lease-ttl", "2s"}, common...)...)
	rt, r := startServe(t, append([]string{"--router-policy", "round-robin"}, common...)...)
	waitRoutable(t, rt, 1)

	type answer struct {
		status int
		body   string
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		c := &http.Client{Timeout: 60 * time.Second}
		resp, err := c.Post(r+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			done <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{status: resp.StatusCode, body: string(b)}
	}()
	select {
	case <-hung:
	case <-time.After(20 * time.Second):
		t.Fatal("the request never reached the doomed worker's engine")
	}
	startWorker(t, append([]string{"--id", "survivor", "--engine-url", fast.URL, "--models", "m", "--lease-ttl", "2s"}, common...)...)
	waitRoutable(t, rt, 2)
	doomed.cmd.Process.Kill()
	start := time.Now()
	a := <-done
	if a.err != nil || a.status != 200 || !strings.Contains(a.body, "from the survivor") {
		t.Fatalf("after its worker was killed the request got %d %q (%v)", a.status, a.body, a.err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the request failed over %v after its worker was killed", d)
	}
	t.Logf("failed over %v after the kill", time.Since(start).Round(100*time.Millisecond))
}

// A non-streamed answer broken off after its head and part of its body,
// before anything reached the client, is an invalid response over both
// transports alike: tried on the other worker, then 502
// upstream_protocol_error (it was "the worker's response stream broke",
// not retried, though the client had seen nothing of it).
func TestE2EAnAnswerBrokenAfterItsHeadIsInvalidOverEveryTransport(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		var urls []string
		var tried atomic.Int32
		for i := 0; i < 2; i++ {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/v1/models":
					io.WriteString(w, `{"object":"list","data":[{"id":"cut","object":"model"}]}`)
				case "/v1/chat/completions":
					tried.Add(1)
					c, _, err := w.(http.Hijacker).Hijack()
					if err != nil {
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
					c.Close()
				default:
					io.WriteString(w, "ok")
				}
			}))
			t.Cleanup(srv.Close)
			urls = append(urls, srv.URL)
		}
		if transport == "nats" {
			for i, u := range urls {
				startWorker(t, append([]string{"--id", fmt.Sprintf("cut%d", i), "--engine-url", u, "--models", "cut", "--lease-ttl", "2s"}, common...)...)
			}
		} else {
			common = []string{"--workers", strings.Join(urls, ",")}
		}
		rt, r := startServe(t, append([]string{"--router-policy", "round-robin", "--request-max-retries", "1"}, common...)...)
		waitRoutable(t, rt, 2)
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"cut","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != 502 || !strings.Contains(string(b), "upstream_protocol_error") {
			t.Fatalf("over %s: %d %s", transport, resp.StatusCode, b)
		}
		if n := tried.Load(); n != 2 {
			t.Fatalf("over %s: %d engines tried, want 2", transport, n)
		}
	})
}

// An engine answer framed with a transfer coding other than chunked is not
// a usable HTTP/1.1 response: over HTTP and over NATS alike another worker
// is tried and the client gets 502 upstream_protocol_error. The worker
// reported it as a connection broken before a head, so over NATS the
// client got 503 no_workers_reachable.
func TestE2EAnUnknownTransferCodingIsAnInvalidResponseOverEveryTransport(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		var urls []string
		var tried atomic.Int32
		for i := 0; i < 2; i++ {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/v1/models":
					io.WriteString(w, `{"object":"list","data":[{"id":"te","object":"model"}]}`)
				case "/v1/chat/completions":
					tried.Add(1)
					c, _, err := w.(http.Hijacker).Hijack()
					if err != nil {
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n{\"id\":1}")
					c.Close()
				default:
					io.WriteString(w, "ok")
				}
			}))
			t.Cleanup(srv.Close)
			urls = append(urls, srv.URL)
		}
		if transport == "nats" {
			for i, u := range urls {
				startWorker(t, append([]string{"--id", fmt.Sprintf("te%d", i), "--engine-url", u, "--models", "te", "--lease-ttl", "2s"}, common...)...)
			}
		} else {
			common = []string{"--workers", strings.Join(urls, ",")}
		}
		rt, r := startServe(t, append([]string{"--router-policy", "round-robin", "--request-max-retries", "1"}, common...)...)
		waitRoutable(t, rt, 2)
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"te","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != 502 || !strings.Contains(string(b), "upstream_protocol_error") {
			t.Fatalf("over %s: %d %s", transport, resp.StatusCode, b)
		}
		if n := tried.Load(); n != 2 {
			t.Fatalf("over %s: %d engines tried, want 2", transport, n)
		}
	})
}

// A non-streamed answer larger than the worker's one-message reply (32
// KiB) reaches the client with the engine's Content-Length, over NATS as
// over HTTP: the worker dropped the header with the hop-by-hop ones, so
// the router, which frames the client's answer by it, relayed every such
// answer chunked.
func TestE2EALargeAnswerKeepsItsContentLengthOverEveryTransport(t *testing.T) {
	body := `{"id":"big","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", 100<<10) + `"},"finish_reason":"stop"}]}`
	eachTransport(t, func(t *testing.T, transport string, common []string) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/models":
				io.WriteString(w, `{"object":"list","data":[{"id":"big","object":"model"}]}`)
			case "/v1/chat/completions":
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				io.WriteString(w, body)
			default:
				io.WriteString(w, "ok")
			}
		}))
		t.Cleanup(srv.Close)
		if transport == "nats" {
			startWorker(t, append([]string{"--id", "big0", "--engine-url", srv.URL, "--models", "big", "--lease-ttl", "2s"}, common...)...)
		} else {
			common = []string{"--workers", srv.URL}
		}
		rt, r := startServe(t, common...)
		waitRoutable(t, rt, 1)
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"big","messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != 200 || string(b) != body {
			t.Fatalf("over %s: %d, %d bytes", transport, resp.StatusCode, len(b))
		}
		if resp.ContentLength != int64(len(body)) {
			t.Fatalf("over %s: Content-Length %d (Transfer-Encoding %q), want %d", transport, resp.ContentLength, resp.TransferEncoding, len(body))
		}
	})
}

// With --request-transport nats every request goes through the broker:
// while it is down /health is 503 "unavailable" (it said "ok", so a load
// balancer kept sending requests that could only fail), and "ok" again
// once the router has reconnected.
func TestE2EHealthIsUnavailableWhileTheRequestBrokerIsDown(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	common := transportFlags(etcd.Endpoint, nsrv.URL, "nats", "/infera/workers/")
	_, e1 := startEngine(t, "--speedup", "50")
	startWorker(t, append([]string{"--id", "w1", "--engine-url", e1, "--lease-ttl", "2s"}, common...)...)
	rt, r := startServe(t, common...)
	waitRoutable(t, rt, 1)
	health := func() (int, string) { return getHealth(t, r) }
	waitHealth := func(code int, status string) {
		t.Helper()
		var c int
		var b string
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if c, b = health(); c == code && strings.Contains(b, `"status":"`+status+`"`) {
				return
			}
		}
		t.Fatalf("health: %d %s, want %d %q", c, b, code, status)
	}
	waitHealth(200, "ok")
	nsrv.Stop()
	waitHealth(503, "unavailable")
	if _, b := health(); !strings.Contains(b, `"nats":{"ok":false`) {
		t.Fatalf("health does not name the broker: %s", b)
	}
	nsrv.Start()
	waitHealth(200, "ok")
	// The worker re-subscribes on its own reconnect, a moment apart.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, b := doPost(t, r+"/v1/chat/completions", e2eChat)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("after the broker came back: %d %s", resp.StatusCode, b)
		}
	}
}

// Static workers in the config file of a router with etcd discovery would
// be ignored without a word: the start is refused, as --workers is, and so
// is a reload that adds them.
func TestConfigWorkersAreRefusedWithEtcdDiscovery(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	path := filepath.Join(t.TempDir(), "infera.json")
	withWorkers := []byte(`{"workers":[{"id":"s","url":"http://127.0.0.1:1","models":["sim-model"]}]}`)
	os.WriteFile(path, withWorkers, 0o644)
	args := []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "http", "--kv-event-transport", "zmq", "--config", path, "--config-poll", "0"}
	if g, err := New(parseServe(t, args...)); err == nil {
		g.Close()
		t.Fatal("a config with static workers started with etcd discovery")
	} else if !strings.Contains(err.Error(), "workers") {
		t.Fatalf("the refusal does not name the workers: %v", err)
	}
	os.WriteFile(path, []byte(`{}`), 0o644)
	g, _ := startServe(t, args...)
	os.WriteFile(path, withWorkers, 0o644)
	_, err := g.Store().Reload()
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Path != "workers" {
		t.Fatalf("reload: %v, want refused at workers", err)
	}
}

// A router started while the broker is down starts (it exited, a crash
// loop for as long as the broker was away): /health says unavailable
// while the broker carrying the requests is missing, and it serves once
// the broker is back.
func TestE2ERouterStartsWhileTheBrokerIsDown(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	common := transportFlags(etcd.Endpoint, nsrv.URL, "nats", "/infera/workers/")
	_, e1 := startEngine(t, "--speedup", "50")
	startWorker(t, append([]string{"--id", "w1", "--engine-url", e1, "--lease-ttl", "2s"}, common...)...)
	nsrv.Stop()
	rt, r := startServe(t, common...)
	waitRoutable(t, rt, 1)
	health := func() (int, string) { return getHealth(t, r) }
	if c, b := health(); c != 503 || !strings.Contains(b, `"nats":{"ok":false`) {
		t.Fatalf("health with the broker down: %d %s", c, b)
	}
	if resp, b := doPost(t, r+"/v1/chat/completions", e2eChat); resp.StatusCode != 503 {
		t.Fatalf("a request with the broker down: %d %s", resp.StatusCode, b)
	}
	nsrv.Start()
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, b := doPost(t, r+"/v1/chat/completions", e2eChat)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("15 s after the broker came up: %d %s", resp.StatusCode, b)
		}
	}
	if c, b := health(); c != 200 {
		t.Fatalf("health with the broker up: %d %s", c, b)
	}
}

// getHealth returns the status and body of the router's /health.
func getHealth(t *testing.T, router string) (int, string) {
	t.Helper()
	resp, err := http.Get(router + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
