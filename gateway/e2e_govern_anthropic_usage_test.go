package gateway

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// An Anthropic Messages stream passed through to the engine and cut after
// its message_start (the engine died, or the client left) keeps its
// estimate charged to the user's token quota, as a chat stream without
// usage does: message_start's usage tells the input only (vLLM sends
// output_tokens 0 there), not what was generated. A whole stream is
// reconciled with its message_delta's usage.
func TestE2EGovernACutAnthropicStreamKeepsItsEstimate(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, whole := startEngine(t, "--native-protocols", "--speedup", "20")
	_, dies := startEngine(t, "--native-protocols", "--fault", "close-mid-stream", "--fault-after-tokens", "3", "--model", "dies")
	_, slow := startEngine(t, "--native-protocols", "--model", "slow") // real time: 50 tokens take about 0.6 s
	k, h := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"protocol": {"anthropic_passthrough": true},
		"user_limit": {"templates": [{"name": "t", "quota": {"enabled": true, "windows": [{"period": "month", "max_tokens": 100000000}]}}]},
		"users": [{"name": "ann", "keys": [%q], "template": "t"}]}`, h))
	r := startChild(t, "serve", 0, "--workers", "w="+whole+",d="+dies+",s="+slow, "--config", cfg, "--state", rd.URL).url
	milli := func() int {
		v, err := rd.Do("HGET", "infera:{u:ann}", "w3k")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(v)
		return n
	}
	// settled waits for the end of the request admitted after milli read
	// before (the user's charged tokens metric moves at the ticket's end;
	// the admission's pre-deduction is in Redis at once) and returns what
	// it charged, in milli-tokens, once Redis has it.
	metricTokens := func() float64 { return metricF(t, r, `infera_user_quota_tokens_total{user="ann"}`) }
	var mBefore float64
	settled := func(before int) int {
		t.Helper()
		m := metricTokens()
		for end := time.Now().Add(2 * time.Second); m == mBefore && time.Now().Before(end); m = metricTokens() {
			time.Sleep(20 * time.Millisecond) // unmoved for 2 s: it charged nothing
		}
		d := int(m-mBefore) * 1000
		mBefore = m
		waitUntil(t, "its end in Redis", func() bool { return milli()-before == d })
		return d
	}
	stream := func(model string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", r+"/v1/messages", strings.NewReader(
			`{"model":"`+model+`","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"tell me a story"}]}`))
		req.Header.Set("x-api-key", k)
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		return resp
	}

	// A whole stream: its message_delta's usage, not the estimate.
	before := milli()
	resp := stream("sim-model")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "message_delta") {
		t.Fatalf("no message_delta: %s", b)
	}
	ev := string(b[strings.LastIndex(string(b), "event: message_delta"):])
	var in, out int
	if _, err := fmt.Sscanf(ev[strings.Index(ev, `"input_tokens":`):], `"input_tokens":%d`, &in); err != nil {
		t.Fatalf("%v: %s", err, ev)
	}
	if _, err := fmt.Sscanf(ev[strings.Index(ev, `"output_tokens":`):], `"output_tokens":%d`, &out); err != nil {
		t.Fatalf("%v: %s", err, ev)
	}
	if used := settled(before); used != (in+out)*1000 {
		t.Fatalf("a whole stream of %d input and %d output tokens charged %d milli-tokens", in, out, used)
	}

	// The engine dies after 3 tokens: the estimate (prompt + 50) stays.
	before = milli()
	resp = stream("dies")
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := settled(before); got < 50000 {
		t.Fatalf("a stream cut by its engine after its message_start charged %d milli-tokens, want its estimate (at least the 50 output tokens it reserved)", got)
	}

	// The client leaves after a few events: the same.
	before = milli()
	resp = stream("slow")
	buf := make([]byte, 600)
	if _, err := io.ReadAtLeast(resp.Body, buf, len(buf)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := settled(before); got < 50000 {
		t.Fatalf("a stream its client left after its message_start charged %d milli-tokens, want its estimate", got)
	}
}
