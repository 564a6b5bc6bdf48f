package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/internal/testsrv"
	"github.com/infera/infera/worker"
)

// pdEngine is a simulated engine and the worker sidecar registering it.
type pdEngine struct {
	id  string
	srv *engine.Server
	url string
	w   *worker.Sidecar
}

// pdFleet is a router in front of engines registered in etcd by worker
// sidecars, as a PD deployment runs: each prefill engine advertises its
// KV server (bootstrap) in its record.
type pdFleet struct {
	t       *testing.T
	etcd    *testsrv.Etcd
	nats    string // broker URL when requests go over NATS
	cfgPath string
	rt      *Gateway
	url     string
	engines map[string]*pdEngine
}

// pdEngineArgs are the engines' common flags: fast simulated time.
var pdEngineArgs = []string{"--speedup", "50", "--pd-waiting-timeout", "15s", "--pd-bootstrap-timeout", "15s"}

func newPDFleet(t *testing.T, cfg string, serveArgs ...string) *pdFleet {
	t.Helper()
	return newPDFleetOn(t, "", cfg, serveArgs...)
}

// newPDFleetOn is newPDFleet with requests over the NATS broker natsURL
// (empty: HTTP).
func newPDFleetOn(t *testing.T, natsURL, cfg string, serveArgs ...string) *pdFleet {
	t.Helper()
	pf := &pdFleet{t: t, etcd: testsrv.StartEtcd(t), nats: natsURL, engines: map[string]*pdEngine{}}
	pf.cfgPath = filepath.Join(t.TempDir(), "infera.json")
	pf.writeConfig(cfg)
	transport := []string{"--request-transport", "http"}
	if natsURL != "" {
		transport = []string{"--request-transport", "nats", "--nats-url", natsURL}
	}
	args := append(append([]string{"--discovery-backend", "etcd", "--etcd-endpoint", pf.etcd.Endpoint,
		"--kv-event-transport", "zmq", "--config", pf.cfgPath, "--config-poll", "20ms"}, transport...), serveArgs...)
	pf.rt, pf.url = startServe(t, args...)
	return pf
}

func (pf *pdFleet) writeConfig(cfg string) {
	tmp := pf.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
		pf.t.Fatal(err)
	}
	if err := os.Rename(tmp, pf.cfgPath); err != nil {
		pf.t.Fatal(err)
	}
}

// reload writes cfg and waits until the router runs it.
func (pf *pdFleet) reload(cfg string) {
	pf.t.Helper()
	old := pf.rt.Store().Load()
	pf.writeConfig(cfg)
	for i := 0; pf.rt.Store().Load() == old; i++ {
		if i > 300 {
			pf.t.Fatal("config reload never applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// add starts an engine with role (mixed, prefill or decode) and connector
// mode, and registers it as worker id.
func (pf *pdFleet) add(id, role, mode string, extra ...string) *pdEngine {
	t := pf.t
	t.Helper()
	args := append([]string{"--id", id, "--role", role}, pdEngineArgs...)
	if role != "mixed" {
		args = append(args, "--pd-mode", mode)
	}
	if role == "prefill" {
		args = append(args, "--bootstrap-port", "0")
	}
	srv, url := startEngine(t, append(args, extra...)...)
	wargs := []string{"--id", id, "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", pf.etcd.Endpoint,
		"--kv-event-transport", "zmq", "--lease-ttl", "2s", "--role", role, "--drain-propagation", "100ms"}
	if pf.nats != "" {
		wargs = append(wargs, "--request-transport", "nats", "--nats-url", pf.nats)
	} else {
		wargs = append(wargs, "--request-transport", "http")
	}
	if b := srv.BootstrapInfo(); b != nil {
		wargs = append(wargs, "--bootstrap", string(b))
	}
	e := &pdEngine{id: id, srv: srv, url: url, w: startWorker(t, wargs...)}
	pf.engines[id] = e
	return e
}

// pdAnswer is one response: status, the legs' workers (decision headers),
// the text and usage.
type pdAnswer struct {
	status          int
	decode, prefill string
	body            string
	completion      int
}

// ask sends a chat request (streamed or not) with optional headers.
func (pf *pdFleet) ask(stream bool, maxTokens int, content string, hdr ...string) pdAnswer {
	t := pf.t
	t.Helper()
	body := fmt.Sprintf(`{"model":"sim-model","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, stream, maxTokens, content)
	if stream {
		body = strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	}
	req, _ := http.NewRequest("POST", pf.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := pdAnswer{status: resp.StatusCode, decode: resp.Header.Get("X-Infera-Worker"), prefill: resp.Header.Get("X-Infera-Prefill-Worker")}
	if !stream {
		b, _ := io.ReadAll(resp.Body)
		a.body = string(b)
		var cr chatResp
		if json.Unmarshal(b, &cr) == nil {
			a.completion = cr.Usage.CompletionTokens
		}
		return a
	}
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		sb.WriteString(line + "\n")
		if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"usage"`) {
			var cr chatResp
			if json.Unmarshal([]byte(data), &cr) == nil && cr.Usage.CompletionTokens > 0 {
				a.completion = cr.Usage.CompletionTokens
			}
		}
	}
	a.body = sb.String()
	return a
}

// ok asserts a complete answer of n tokens.
func (a pdAnswer) ok(t *testing.T, n int) {
	t.Helper()
	if a.status != 200 || a.completion != n || strings.Contains(a.body, `"error"`) {
		t.Fatalf("answer %d from %s/%s, %d tokens (want %d): %.2000s", a.status, a.prefill, a.decode, a.completion, n, a.body)
	}
}

func (pf *pdFleet) transfers(id string) uint64 { return pf.engines[id].srv.Stats().Transfers }

// SGLang (push) on real engines: 2 prefill and 3 decode engines. Pairing
// by aligned index keeps each prefill worker with its decode workers
// (p0: d0, d2; p1: d1); independent pairing (hot-reloaded) pairs freely;
// the decode policy spreads the decode legs; every transfer happens.
func TestE2EPDSGLangPairingAndDecodePolicy(t *testing.T) {
	const cfg = `{"debug":{"decision_header":true},"pd":{"mode":"sglang","decode_policy":"round-robin","sglang_independent_pairing":%v}}`
	pf := newPDFleet(t, fmt.Sprintf(cfg, false), "--router-policy", "least-requests")
	for _, id := range []string{"p0", "p1"} {
		pf.add(id, "prefill", "sglang")
	}
	for _, id := range []string{"d0", "d1", "d2"} {
		pf.add(id, "decode", "sglang")
	}
	waitRoutable(t, pf.rt, 5)
	group := map[string]string{"d0": "p0", "d2": "p0", "d1": "p1"}
	decodes := map[string]int{}
	for i := 0; i < 12; i++ {
		a := pf.ask(i%2 == 0, 5, fmt.Sprintf("aligned %d", i))
		a.ok(t, 5)
		if group[a.decode] != a.prefill {
			t.Fatalf("aligned pairing served %s with %s", a.prefill, a.decode)
		}
		decodes[a.decode]++
	}
	if len(decodes) != 3 {
		t.Fatalf("decode legs %v: want all three decode workers", decodes)
	}
	pf.reload(fmt.Sprintf(cfg, true))
	cross := 0
	decodes = map[string]int{}
	for i := 0; i < 12; i++ {
		a := pf.ask(i%2 == 1, 4, fmt.Sprintf("independent %d", i))
		a.ok(t, 4)
		if group[a.decode] != a.prefill {
			cross++
		}
		decodes[a.decode]++
	}
	if cross == 0 {
		t.Fatal("independent pairing never paired across the alignment")
	}
	if decodes["d0"] != 4 || decodes["d1"] != 4 || decodes["d2"] != 4 {
		t.Fatalf("round-robin decode policy spread %v, want 4 each", decodes)
	}
	var pre, dec uint64
	for _, id := range []string{"p0", "p1"} {
		pre += pf.transfers(id)
	}
	for _, id := range []string{"d0", "d1", "d2"} {
		dec += pf.transfers(id)
	}
	if pre != 24 || dec != 24 {
		t.Fatalf("transfers: prefill engines %d, decode engines %d, want 24 each", pre, dec)
	}
}

// vLLM (pull) on real engines: the prefill engine answers
// kv_transfer_params, a decode engine reads the blocks and generates;
// nothing stays held; the decode policy (least-requests) uses both.
func TestE2EPDvLLM(t *testing.T) {
	pf := newPDFleet(t, `{"debug":{"decision_header":true},"pd":{"mode":"vllm"}}`)
	pf.add("p0", "prefill", "vllm")
	pf.add("d0", "decode", "vllm")
	pf.add("d1", "decode", "vllm")
	waitRoutable(t, pf.rt, 3)
	var wg sync.WaitGroup
	answers := make([]pdAnswer, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = pf.ask(i%2 == 0, 20, fmt.Sprintf("pull %d: %s", i, strings.Repeat("words ", 40)))
		}()
	}
	wg.Wait()
	used := map[string]bool{}
	for _, a := range answers {
		a.ok(t, 20)
		if a.prefill != "p0" {
			t.Fatalf("prefill worker %q", a.prefill)
		}
		used[a.decode] = true
	}
	if !used["d0"] || !used["d1"] {
		t.Fatalf("decode workers used %v", used)
	}
	// The engines settle their counters as the legs end, which may be
	// just after the client has its answer.
	var st engine.Stats
	settled := func() bool {
		st = pf.engines["p0"].srv.Stats()
		return st.Transfers == 8 && st.PDHeldRequests == 0 && pf.transfers("d0")+pf.transfers("d1") == 8
	}
	for deadline := time.Now().Add(5 * time.Second); !settled() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !settled() {
		t.Fatalf("prefill engine: %d transfers, %d still held; decode transfers %d", st.Transfers, st.PDHeldRequests, pf.transfers("d0")+pf.transfers("d1"))
	}
	// The mode comes from the prefill record when pd.mode is empty.
	pf.reload(`{"debug":{"decision_header":true}}`)
	pf.ask(false, 3, "mode from the record").ok(t, 3)
	noLoad(t, pf.rt)
}

// noLoad waits until every lease of every leg has ended.
func noLoad(t *testing.T, rt *Gateway) {
	t.Helper()
	for i := 0; i < 1000; i++ { // 10 s: a loaded machine ends legs late
		busy := false
		for _, w := range rt.fleet.View().All {
			busy = busy || w.Load.Requests.Load() != 0 || w.Load.Tokens.Load() != 0
		}
		if !busy {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("leases still held after the requests ended")
}

// Router mode direct: x-worker-instance-id names the decode worker and
// x-prefill-instance-id the prefill worker (against the alignment: the
// headers win); either alone leaves the other leg to the policy.
func TestE2EPDDirectModeHeaders(t *testing.T) {
	pf := newPDFleet(t, `{"debug":{"decision_header":true},"pd":{"mode":"sglang"}}`, "--router-mode", "direct")
	pf.add("p0", "prefill", "sglang")
	pf.add("p1", "prefill", "sglang")
	pf.add("d0", "decode", "sglang")
	pf.add("d1", "decode", "sglang")
	waitRoutable(t, pf.rt, 4)
	a := pf.ask(true, 3, "both", "x-worker-instance-id", "d0", "x-prefill-instance-id", "p1")
	a.ok(t, 3)
	if a.decode != "d0" || a.prefill != "p1" {
		t.Fatalf("both headers: %s/%s", a.prefill, a.decode)
	}
	for i := 0; i < 4; i++ {
		a = pf.ask(false, 3, "decode only", "x-worker-instance-id", "d1")
		a.ok(t, 3)
		if a.decode != "d1" || a.prefill != "p1" { // p1 is d1's aligned prefill
			t.Fatalf("decode header: %s/%s", a.prefill, a.decode)
		}
		a = pf.ask(false, 3, "prefill only", "x-prefill-instance-id", "p0")
		a.ok(t, 3)
		if a.prefill != "p0" || a.decode != "d0" {
			t.Fatalf("prefill header: %s/%s", a.prefill, a.decode)
		}
	}
	a = pf.ask(false, 3, "unknown ids fall back", "x-worker-instance-id", "nope", "x-prefill-instance-id", "d0")
	a.ok(t, 3)
	if a.prefill == "" || a.decode == "" {
		t.Fatalf("fallback: %s/%s", a.prefill, a.decode)
	}
}

// Failover of each leg on real engines, for both connectors: a prefill
// engine that fails (500) and a decode engine that fails (500) never reach
// the client; the breaker blames the failing workers only; a prefill
// engine that hangs is cut by pd.prefill_timeout_s.
func TestE2EPDFailoverOfEachLeg(t *testing.T) {
	for _, mode := range []string{"sglang", "vllm"} {
		t.Run(mode, func(t *testing.T) {
			cfg := fmt.Sprintf(`{"debug":{"decision_header":true},"pd":{"mode":%q,"prefill_timeout_s":1%s}}`, mode,
				map[string]string{"sglang": `,"sglang_independent_pairing":true`}[mode])
			pf := newPDFleet(t, cfg, "--router-policy", "round-robin", "--breaker-failure-threshold", "2")
			pf.add("p-bad", "prefill", mode, "--fault", "error")
			pf.add("p-good", "prefill", mode)
			pf.add("d-bad", "decode", mode, "--fault", "error")
			pf.add("d-good", "decode", mode)
			waitRoutable(t, pf.rt, 4)
			for i := 0; i < 8; i++ {
				a := pf.ask(i%2 == 0, 4, fmt.Sprintf("failover %d", i))
				a.ok(t, 4)
				if a.prefill != "p-good" || a.decode != "d-good" {
					t.Fatalf("served by %s/%s", a.prefill, a.decode)
				}
			}
			v := pf.rt.fleet.View()
			for id, open := range map[string]bool{"p-bad": true, "d-bad": true, "p-good": false, "d-good": false} {
				if w := v.ByID([]byte(id)); (w.Breaker.Trips() > 0) != open {
					t.Fatalf("%s: breaker trips %d", id, w.Breaker.Trips())
				}
			}
			if n := pf.engines["p-good"].srv.Stats().Transfers; n != 8 {
				t.Fatalf("good prefill transfers %d", n)
			}
			noLoad(t, pf.rt)
		})
	}
	// A hanging prefill engine: the prefill leg times out after
	// pd.prefill_timeout_s and goes to the other prefill worker.
	pf := newPDFleet(t, `{"debug":{"decision_header":true},"pd":{"mode":"vllm","prefill_timeout_s":0.5}}`,
		"--router-policy", "least-requests")
	pf.add("p-hang", "prefill", "vllm", "--fault", "hang")
	pf.add("p-ok", "prefill", "vllm")
	pf.add("d0", "decode", "vllm")
	waitRoutable(t, pf.rt, 3)
	pf.rt.fleet.Get("p-ok").Acquire(1, 0, 1) // the hanging prefill goes first
	start := time.Now()
	a := pf.ask(true, 3, "hang")
	pf.rt.fleet.Get("p-ok").Release(1, 0, 1, false)
	a.ok(t, 3)
	if took := time.Since(start); a.prefill != "p-ok" || took < 400*time.Millisecond || took > 5*time.Second {
		t.Fatalf("served by %s after %v", a.prefill, took)
	}
}

// A mixed fleet that gains a prefill and a decode worker at runtime
// (discovery adds them) serves the next requests by the pair, without a
// restart; when the pair leaves, the mixed worker serves again.
func TestE2EMixedFleetGainsPDPairAtRuntime(t *testing.T) {
	pf := newPDFleet(t, `{"debug":{"decision_header":true},"pd":{"mode":"vllm"}}`)
	mx := pf.add("mx", "mixed", "")
	waitRoutable(t, pf.rt, 1)
	for i := 0; i < 3; i++ {
		a := pf.ask(i%2 == 0, 3, "mixed")
		a.ok(t, 3)
		if a.decode != "mx" || a.prefill != "" {
			t.Fatalf("mixed fleet: %s/%s", a.prefill, a.decode)
		}
	}
	pf.add("p0", "prefill", "vllm")
	dw := pf.add("d0", "decode", "vllm").w
	waitRoutable(t, pf.rt, 3)
	before := mx.srv.Stats().Completed
	for i := 0; i < 4; i++ {
		a := pf.ask(i%2 == 0, 3, "pd")
		a.ok(t, 3)
		if a.decode != "d0" || a.prefill != "p0" {
			t.Fatalf("after the pair joined: %s/%s", a.prefill, a.decode)
		}
	}
	if mx.srv.Stats().Completed != before {
		t.Fatal("the mixed engine still served requests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dw.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	waitRoutable(t, pf.rt, 2)
	a := pf.ask(false, 3, "mixed again")
	a.ok(t, 3)
	if a.decode != "mx" || a.prefill != "" {
		t.Fatalf("after the decode worker left: %s/%s", a.prefill, a.decode)
	}
}

// Both connectors over the NATS request transport: the legs go through the
// broker like any request (one dispatch path, any transport).
func TestE2EPDOverNATS(t *testing.T) {
	nsrv := testsrv.StartNATS(t)
	for _, mode := range []string{"sglang", "vllm"} {
		t.Run(mode, func(t *testing.T) {
			pf := newPDFleetOn(t, nsrv.URL, fmt.Sprintf(`{"debug":{"decision_header":true},"pd":{"mode":%q}}`, mode))
			pf.add("p0", "prefill", mode)
			pf.add("d0", "decode", mode)
			waitRoutable(t, pf.rt, 2)
			for i := 0; i < 4; i++ {
				a := pf.ask(i%2 == 0, 6, fmt.Sprintf("nats %d", i))
				a.ok(t, 6)
				if a.prefill != "p0" || a.decode != "d0" {
					t.Fatalf("served by %s/%s", a.prefill, a.decode)
				}
			}
			if n := pf.transfers("p0"); n != 4 {
				t.Fatalf("transfers %d", n)
			}
			noLoad(t, pf.rt)
		})
	}
}
