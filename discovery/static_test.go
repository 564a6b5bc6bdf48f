package discovery

import (
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// Every static sync (each config reload; every 5 s while any worker lacks
// models) re-asks /v1/models of every --workers entry without --worker-model.
// A worker that already learned its models keeps them through a transient
// /v1/models failure: it stays the same routable worker, with its breaker,
// load and KV index entries.
func TestStaticWorkerKeepsModelsThroughTransientModelsFailure(t *testing.T) {
	var calls atomic.Int64
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if calls.Add(1) > 1 {
			ctx.SetStatusCode(503) // one transient hiccup
			return
		}
		ctx.SetBodyString(`{"data":[{"id":"m"}]}`)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: 3})
	defer fl.Close()
	st := NewStatic(fl, []string{"a=http://" + ln.Addr().String()}, nil)
	st.Apply(config.Default())
	w1 := fl.Get("a")
	if w1 == nil || len(fl.View().ByModel["m"]) != 1 {
		t.Fatalf("setup: %v", w1)
	}
	st.Apply(config.Default()) // e.g. a config reload
	if w2 := fl.Get("a"); w2 != w1 || len(fl.View().ByModel["m"]) != 1 {
		t.Fatalf("worker replaced (same=%v) and routable for model m: %d", w2 == w1, len(fl.View().ByModel["m"]))
	}
}

func TestStaticRecordsMergeFlagsAndConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"workers":[{"id":"c","url":"http://127.0.0.1:3","models":["x"],"role":"prefill"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rs := StaticRecords([]string{"a=http://127.0.0.1:1", "127.0.0.1:2/"}, []string{"m"}, cfg)
	if len(rs) != 3 || rs[0].ID != "a" || rs[0].URL != "http://127.0.0.1:1" || rs[1].URL != "http://127.0.0.1:2" ||
		rs[1].Models[0] != "m" || rs[2].ID != "c" || rs[2].Role != "prefill" {
		t.Fatalf("%+v", rs)
	}
}

func TestStaticWorkerCarriesPDBootstrap(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"workers":[{"id":"p","url":"http://127.0.0.1:3","models":["x"],"role":"prefill",
		"bootstrap":{"pd_mode":"sglang","bootstrap_port":8998}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rs := StaticRecords(nil, nil, cfg)
	if len(rs) != 1 || string(rs[0].Bootstrap) != `{"pd_mode":"sglang","bootstrap_port":8998}` {
		t.Fatalf("%+v", rs)
	}
	if _, err := config.Parse([]byte(`{"workers":[{"url":"http://a","bootstrap":{"pd_mode":"x"}}]}`)); err == nil {
		t.Fatal("bad pd_mode accepted")
	}
}

// A --workers entry given as an OpenAI base URL (http://host:port/v1, as
// SDKs take it) had its models asked at /v1/v1/models: the worker never
// learned them and the router answered 503 no_workers for good. Its /v1 is
// the engine's root: the models are asked at /v1/models and the worker
// serves; a config file's worker alike.
func TestAStaticWorkerGivenAsAnOpenAIBaseURLLearnsItsModels(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/models" {
			ctx.SetStatusCode(404)
			return
		}
		ctx.SetBodyString(`{"data":[{"id":"m"}]}`)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	base := "http://" + ln.Addr().String()
	cfg, err := config.Parse([]byte(`{"workers":[{"id":"c","url":"` + base + `/v1/"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: 3})
	defer fl.Close()
	st := NewStatic(fl, []string{"a=" + base + "/v1"}, nil)
	st.Apply(cfg)
	for _, id := range []string{"a", "c"} {
		if w := fl.Get(id); w == nil || w.URL != base || len(w.Models) != 1 || w.Models[0] != "m" {
			t.Fatalf("worker %s: %+v", id, w)
		}
	}
}

// An engine restarted behind the same static URL with another model: its
// models are asked again (Run, every refresh), and the router serves the
// new one. Before, the models learned once were kept forever: requests for
// the new model were 404 and those for the old one went to an engine that
// no longer served it. A refresh naming the same models keeps the worker.
func TestAStaticWorkerRestartedWithAnotherModelIsAskedAgain(t *testing.T) {
	var model atomic.Value
	model.Store("old")
	var calls atomic.Int64
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		calls.Add(1)
		ctx.SetBodyString(`{"data":[{"id":"` + model.Load().(string) + `"}]}`)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: 3})
	defer fl.Close()
	st := NewStatic(fl, []string{"a=http://" + ln.Addr().String()}, nil)
	st.retry, st.refresh = 20*time.Millisecond, 50*time.Millisecond
	st.Apply(config.Default())
	w1 := fl.Get("a")
	if w1 == nil || len(fl.View().ByModel["old"]) != 1 {
		t.Fatalf("setup: %v", w1)
	}
	go st.Run(config.Default)
	defer st.Close()
	// Same answer: the same worker (breaker, load, KV entries kept).
	deadline := time.Now().Add(5 * time.Second)
	for n := calls.Load(); calls.Load() < n+2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if fl.Get("a") != w1 {
		t.Fatal("a refresh naming the same models replaced the worker")
	}
	model.Store("new")
	deadline = time.Now().Add(5 * time.Second)
	for len(fl.View().ByModel["new"]) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(fl.View().ByModel["new"]) != 1 || len(fl.View().ByModel["old"]) != 0 {
		t.Fatalf("after the engine changed its model the fleet serves %v", fl.View().Models)
	}
}

// Over NATS a worker's url is its sidecar's view of its engine (the same
// http://127.0.0.1:8000 on every host): two such workers are two engines.
// Over HTTP they are one, however the url is spelt.
func TestCheckSameEngineOnlyOverHTTP(t *testing.T) {
	cfg := &config.Config{Workers: []config.WorkerSpec{{ID: "a", URL: "http://127.0.0.1:8000"}, {ID: "b", URL: "http://127.0.0.1:8000/"}}}
	if err := CheckSameEngine(nil, cfg, "nats"); err != nil {
		t.Fatalf("nats: %v", err)
	}
	if err := CheckSameEngine(nil, cfg, "http"); err == nil || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("http: %v, want both ids named", err)
	}
	if err := CheckSameEngine([]string{"a=http://h:1", "b=https://h:1", "c=http://h:2"}, &config.Config{}, "http"); err != nil {
		t.Fatalf("three engines: %v", err)
	}
	if err := CheckSameEngine([]string{"a=H:80", "b=http://h"}, &config.Config{}, "http"); err == nil {
		t.Fatal("H:80 and http://h are one engine")
	}
}

// A static worker asked for its models records its engine's max_model_len
// (the largest its /v1/models lists, as vLLM's ModelCard gives it; 0
// without one), keeps it through a transient /v1/models failure, and
// learns a new one on a refresh without being replaced (its breaker, load
// and KV entries kept).
func TestAStaticWorkerLearnsItsEnginesMaxModelLen(t *testing.T) {
	var maxLen atomic.Int64
	maxLen.Store(4096)
	var fail atomic.Bool
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if fail.Load() {
			ctx.SetStatusCode(503)
			return
		}
		ctx.SetBodyString(`{"object":"list","data":[{"id":"m","object":"model","max_model_len":` + strconv.FormatInt(maxLen.Load(), 10) +
			`},{"id":"m-lora","object":"model","parent":"m","max_model_len":1024},{"id":"other","object":"model"}]}`)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	fl := fleet.NewFleet(fleet.BreakerConfig{Threshold: 3})
	defer fl.Close()
	st := NewStatic(fl, []string{"a=http://" + ln.Addr().String()}, nil)
	st.retry, st.refresh = 20*time.Millisecond, 50*time.Millisecond
	st.Apply(config.Default())
	w1 := fl.Get("a")
	if w1 == nil || w1.MaxModelLen() != 4096 {
		t.Fatalf("max_model_len %v, want 4096", w1)
	}
	fail.Store(true)
	st.Apply(config.Default()) // a reload while /v1/models fails
	if w := fl.Get("a"); w != w1 || w.MaxModelLen() != 4096 {
		t.Fatalf("after a failed ask: the same worker %v, max_model_len %d", w == w1, w.MaxModelLen())
	}
	fail.Store(false)
	maxLen.Store(32768) // restarted with a longer context
	go st.Run(config.Default)
	defer st.Close()
	deadline := time.Now().Add(5 * time.Second)
	for w1.MaxModelLen() != 32768 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w := fl.Get("a"); w != w1 || w.MaxModelLen() != 32768 {
		t.Fatalf("after a refresh: the same worker %v, max_model_len %d, want 32768", w == w1, w.MaxModelLen())
	}
	if got := parseModelList([]byte(`{"data":[{"id":"m"}]}`)); got.maxLen != 0 || len(got.ids) != 1 {
		t.Fatalf("a model list without max_model_len: %+v", got)
	}
}
