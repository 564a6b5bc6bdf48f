package proxy

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/infera/infera/config"
)

// postKey posts body to url with the API key.
func postKey(t *testing.T, url, key, body string) int {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// --log-level debug: every inference request logs a debug line when it
// ends (its worker, decision and status), and every retry one naming the
// worker that failed, how, and the next choice; never the key, the prompt,
// or more than 64 bytes of a client's model name. At the default level the
// router logs none of them, even to a handler that takes debug lines.
func TestDebugLevelLogsEachRequestsWorkerAndStatus(t *testing.T) {
	const key = "sk-debug-secret-0123456789"
	const prompt = "the-prompt-text-never-logged"
	body := `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":4}`
	longModel := strings.Repeat("x", 100)
	run := func(level string) string {
		logs := captureLogs(t)
		up := startUpstream(t, okHandler)
		f := defaultFlags()
		f.LogLevel, f.APIKey = level, key
		f.BreakerFailureThreshold = 0
		r := startRouter(t, f, nil, deadURL(t), up.url) // w0 refuses connections, w1 answers
		for i := 0; i < 4; i++ {
			if code := postKey(t, r.url+"/v1/chat/completions", key, body); code != 200 {
				t.Fatalf("%s: request %d: %d", level, i, code)
			}
		}
		if code := postKey(t, r.url+"/v1/chat/completions", key, `{"model":"`+longModel+`","messages":[{"role":"user","content":"x"}]}`); code != 404 {
			t.Fatalf("%s: unknown model: %d", level, code)
		}
		r.srv.Shutdown()
		return logs.String()
	}

	out := run("debug")
	for _, re := range []string{
		`level=DEBUG msg=request request_id=\w+ method=POST path=/v1/chat/completions status=200 duration=\S+ model=m worker=w1 layer=lb retries=0 end=complete`,
		`level=DEBUG msg=request request_id=\w+ method=POST path=/v1/chat/completions status=200 duration=\S+ model=m worker=w1 layer=lb retries=1 end=complete`,
		`level=DEBUG msg="request retried" request_id=\w+ failed_worker=w0 failure=upstream_unreachable next=w1 retry=1`,
		`level=DEBUG msg=request request_id=\w+ method=POST path=/v1/chat/completions status=404 duration=\S+ model=x{64}\.\.\. retries=0 end=complete error=model_not_found`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("debug level: no line matching %s in:\n%s", re, out)
		}
	}
	if strings.Contains(out, key) || strings.Contains(out, prompt) || strings.Contains(out, longModel) {
		t.Errorf("a debug line holds the key, the prompt or an unbounded model name:\n%s", out)
	}

	for _, level := range []string{"", "info"} {
		if out := run(level); strings.Contains(out, "msg=request") {
			t.Errorf("level %q: debug lines logged:\n%s", level, out)
		}
	}
}

// A PD pair's retry is logged with its leg and the pair that takes it
// over; the request's line names both workers.
func TestDebugLevelLogsAPDRetryWithItsLeg(t *testing.T) {
	logs := captureLogs(t)
	var pl, dl legLog
	var fail, ok atomic.Int32
	fail.Store(503)
	p0, p1 := startUpstream(t, vllmPrefill(&pl, "engine-p0", &fail)), startUpstream(t, vllmPrefill(&pl, "engine-p1", &ok))
	d0 := startUpstream(t, decodeEngine(&dl, "kv_transfer_params", &ok))
	f := defaultFlags()
	f.LogLevel = "debug"
	const boot = `{"pd_mode":"vllm","bootstrap_port":8998}`
	r := startPDRouter(t, f, pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" }),
		pdWorker("p0", p0.url, "prefill", boot), pdWorker("p1", p1.url, "prefill", boot), pdWorker("d0", d0.url, "decode", ""))
	r.fl.View().ByID([]byte("p1")).Acquire(1, 0, 1) // p0 first
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	r.fl.View().ByID([]byte("p1")).Release(1, 0, 1, false)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	r.srv.Shutdown()
	out := logs.String()
	for _, re := range []string{
		`level=DEBUG msg="request retried" request_id=\w+ leg=prefill failed_worker=p0 failure=upstream_error failed_status=503 next=p1\+d0 retry=1`,
		`level=DEBUG msg=request request_id=\w+ method=POST path=/v1/chat/completions status=200 duration=\S+ model=m worker=d0 prefill_worker=p1 layer=\w+ .*retries=1 end=complete`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no line matching %s in:\n%s", re, out)
		}
	}
}

// The split proxy's failover from the local fleet to an external entry is
// a retry: logged with the local worker that failed and the entry next.
func TestDebugLevelLogsASplitFailover(t *testing.T) {
	logs := captureLogs(t)
	ext := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "ext", Address: ext.url, Failover: true},
	)
	f := defaultFlags()
	f.LogLevel = "debug"
	r := startRouterWith(t, f, cfg, nil, deadURL(t))
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	r.srv.Shutdown()
	out := logs.String()
	for _, re := range []string{
		`level=DEBUG msg="request retried" request_id=\w+ failed_worker=w0 failure=upstream_unreachable next=split:ext retry=1`,
		`level=DEBUG msg=request request_id=\w+ method=POST path=/v1/chat/completions status=200 duration=\S+ model=m worker=split:ext retries=1 end=complete`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no line matching %s in:\n%s", re, out)
		}
	}
}
