package main

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// R7: every syncStatic (each config reload; every 5 s while any worker lacks
// models) re-asks /v1/models of every --workers entry without --worker-model.
// One transient failure replaces a healthy, routable worker with a model-less
// one: it leaves routing, loses breaker/load state and its KV index entries.
func TestReviewSyncStaticDropsWorkerOnTransientModelsFailure(t *testing.T) {
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
	f := &config.Serve{Workers: []string{"a=http://" + ln.Addr().String()}}
	syncStatic(fl, f, config.Default())
	w1 := fl.Get("a")
	if w1 == nil || len(fl.View().ByModel["m"]) != 1 {
		t.Fatalf("setup: %v", w1)
	}
	syncStatic(fl, f, config.Default()) // e.g. a config reload
	if w2 := fl.Get("a"); w2 != w1 || len(fl.View().ByModel["m"]) != 1 {
		t.Fatalf("worker replaced (same=%v) and routable for model m: %d", w2 == w1, len(fl.View().ByModel["m"]))
	}
}
