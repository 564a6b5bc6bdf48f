package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/govern"
)

// With continuous usage stats (usage on every chunk) through the real
// router and the simulated engine: the client gets the usage vLLM would
// send it for its stream_options, untouched; a client that did not ask gets
// none (the router asks the engine and removes only the usage chunk it
// added, continuous usage turned off with it); and whatever the engine put
// on the chunks, the router counts the stream's tokens once, in its token
// metrics and in the user's quota.
func TestE2EContinuousUsageIsRelayedAsAskedAndCountedOnce(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second) // the day's quota is read whole
	_, eng := startEngine(t, "--speedup", "50")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"timezone": "UTC", "templates": [{"name": "std", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 1000, "max_tokens": 1000000}]}}]},
		"users": [{"name": "cu-ann", "keys": [%q]}]}`, hash))
	ag := startAdminServe(t, "--workers", eng, "--config", cfg)

	quotaTokens := func() float64 {
		t.Helper()
		var st govern.UserStatus
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			r := ag.api("GET", "/api/users/cu-ann/usage", "")
			st = govern.UserStatus{}
			if r.status != 200 || json.Unmarshal(r.body, &st) != nil || len(st.Quota) != 1 {
				t.Fatalf("usage: %s", r)
			}
			if st.Active == 0 || time.Now().After(deadline) {
				return st.Quota[0].Tokens
			}
		}
	}
	stream := func(opts string) []string {
		t.Helper()
		body := `{"model":"sim-model","stream":true,"max_tokens":5` + opts + `,"messages":[{"role":"user","content":"count my tokens once"}]}`
		req, _ := http.NewRequest("POST", ag.router+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("%s: %d %s", opts, resp.StatusCode, b)
		}
		return strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n")
	}
	type usage struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
	}
	chunk := func(ev string) (choices int, u *usage) {
		var c struct {
			Choices []any  `json:"choices"`
			Usage   *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c); err != nil {
			t.Fatalf("chunk %q: %v", ev, err)
		}
		return len(c.Choices), c.Usage
	}

	// The engine's numbers, from the usage chunk the client asked for.
	q0 := quotaTokens()
	evs := stream(`,"stream_options":{"include_usage":true}`)
	_, want := chunk(evs[len(evs)-2])
	if want == nil || want.Prompt == 0 || want.Completion != 5 {
		t.Fatalf("no usage chunk: %q", evs)
	}
	perRequest := float64(want.Prompt + want.Completion)
	if d := quotaTokens() - q0; d != perRequest {
		t.Fatalf("the quota counted %v tokens, the engine reported %v", d, perRequest)
	}

	for _, tc := range []struct {
		opts        string
		final, each bool // the usage chunk, the usage so far on every other chunk
	}{
		{`,"stream_options":{"continuous_usage_stats":true}`, true, true},
		{`,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, true, true},
		{`,"stream_options":{}`, true, false},
		{``, false, false},
		{`,"stream_options":{"include_usage":false,"continuous_usage_stats":true}`, false, false},
	} {
		q0 := quotaTokens()
		p0 := metricF(t, ag.router, `infera_usage_tokens_total{kind="prompt"}`)
		c0 := metricF(t, ag.router, `infera_usage_tokens_total{kind="completion"}`)
		evs := stream(tc.opts)
		withUsage, finals := 0, 0
		for i, ev := range evs[:len(evs)-1] {
			n, u := chunk(ev)
			if u == nil {
				continue
			}
			if n == 0 {
				finals++
				if i != len(evs)-2 || *u != *want {
					t.Errorf("%s: usage chunk %d of %d: %s, want %+v", tc.opts, i, len(evs), ev, *want)
				}
				continue
			}
			withUsage++
			if u.Prompt != want.Prompt || u.Completion > want.Completion {
				t.Errorf("%s: a chunk's usage so far %s", tc.opts, ev)
			}
		}
		if (finals == 1) != tc.final || finals > 1 || (withUsage == len(evs)-2) != tc.each || (withUsage > 0) != tc.each {
			t.Errorf("%s: the client got %d usage chunks (vLLM sends it: %v) and %d chunks of %d with their usage so far (vLLM: %v)\n%q",
				tc.opts, finals, tc.final, withUsage, len(evs)-2, tc.each, evs)
		}
		if d := quotaTokens() - q0; d != perRequest {
			t.Errorf("%s: the quota counted %v tokens, the engine reported %v", tc.opts, d, perRequest)
		}
		dp := metricF(t, ag.router, `infera_usage_tokens_total{kind="prompt"}`) - p0
		dc := metricF(t, ag.router, `infera_usage_tokens_total{kind="completion"}`) - c0
		if int(dp) != want.Prompt || int(dc) != want.Completion {
			t.Errorf("%s: the router's token metrics counted %v prompt and %v completion tokens, the engine reported %+v", tc.opts, dp, dc, *want)
		}
	}
}

// A stream that breaks before its end is accounted alike whether or not
// its client asked for continuous usage stats: the estimate stays charged
// to the user (docs/governance.md: no usage came) and no tokens reach the
// router's token metrics. The usage on the chunks before the break is the
// usage so far, not the request's: the router took the last one it saw as
// the request's usage and reconciled the quota with it (the prompt and the
// 3 tokens relayed, for a request of up to 40), so asking for continuous
// usage made a broken stream cheaper, and its metrics counted a part.
func TestE2EABrokenStreamIsAccountedAlikeWithContinuousUsage(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second)
	es, eng := startEngine(t, "--speedup", "50")
	if err := es.SetFault(engine.Fault{Mode: engine.FaultCloseMidStream, AfterTokens: 3}); err != nil {
		t.Fatal(err)
	}
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"timezone": "UTC", "templates": [{"name": "std", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 1000, "max_tokens": 1000000}]}}]},
		"users": [{"name": "cut-ann", "keys": [%q]}]}`, hash))
	ag := startAdminServe(t, "--workers", eng, "--config", cfg)
	quotaTokens := func() float64 {
		t.Helper()
		var st govern.UserStatus
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			r := ag.api("GET", "/api/users/cut-ann/usage", "")
			st = govern.UserStatus{}
			if r.status != 200 || json.Unmarshal(r.body, &st) != nil || len(st.Quota) != 1 {
				t.Fatalf("usage: %s", r)
			}
			if st.Active == 0 || time.Now().After(deadline) {
				return st.Quota[0].Tokens
			}
		}
	}
	charged := map[string]float64{}
	for _, opts := range []string{``, `,"stream_options":{"include_usage":true}`, `,"stream_options":{"continuous_usage_stats":true}`} {
		q0 := quotaTokens()
		p0 := metricF(t, ag.router, `infera_usage_tokens_total{kind="prompt"}`)
		c0 := metricF(t, ag.router, `infera_usage_tokens_total{kind="completion"}`)
		body := `{"model":"sim-model","stream":true,"max_tokens":40` + opts + `,"messages":[{"role":"user","content":"a stream that breaks"}]}`
		req, _ := http.NewRequest("POST", ag.router+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"error"`) || strings.Contains(string(b), `"choices":[],"usage"`) {
			t.Fatalf("%s: want a stream broken after 3 tokens: %d %s", opts, resp.StatusCode, b)
		}
		charged[opts] = quotaTokens() - q0
		dp := metricF(t, ag.router, `infera_usage_tokens_total{kind="prompt"}`) - p0
		dc := metricF(t, ag.router, `infera_usage_tokens_total{kind="completion"}`) - c0
		if dp != 0 || dc != 0 {
			t.Errorf("%s: the router's token metrics counted %v prompt and %v completion tokens of a stream that gave no usage", opts, dp, dc)
		}
	}
	if charged[``] < 40 || charged[`,"stream_options":{"continuous_usage_stats":true}`] != charged[``] || charged[`,"stream_options":{"include_usage":true}`] != charged[``] {
		t.Errorf("broken streams of one request charged %v: the estimate (with 40 output tokens) for each", charged)
	}
}
