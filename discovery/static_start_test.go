package discovery

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// heldModelsServers starts n servers of /v1/models naming model while up
// is set; until then each accepts every request and holds it unanswered
// (a hung engine), counting it in asked[i]. They are shut down together
// when the test ends (one at a time took 100 ms each).
func heldModelsServers(t *testing.T, n int, model string, up *atomic.Bool) (urls []string, asked []atomic.Int64) {
	t.Helper()
	asked = make([]atomic.Int64, n)
	srvs := make([]*fasthttp.Server, n)
	for i := range n {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srvs[i] = &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			asked[i].Add(1)
			for !up.Load() {
				time.Sleep(10 * time.Millisecond)
			}
			ctx.SetBodyString(`{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`)
		}}
		go srvs[i].Serve(ln)
		urls = append(urls, "http://"+ln.Addr().String())
	}
	t.Cleanup(func() {
		up.Store(true) // let held requests end
		var wg sync.WaitGroup
		for _, srv := range srvs {
			wg.Add(1)
			go func() { defer wg.Done(); srv.Shutdown() }()
		}
		wg.Wait()
	})
	return urls, asked
}

// simEngine runs a simulated engine (infera engine) on a loopback port.
func simEngine(t *testing.T) string {
	t.Helper()
	var c struct {
		Engine engine.Cmd `cmd:""`
	}
	p, err := kong.New(&c, kong.Name("infera"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse([]string{"engine"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.Engine.Config()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID = "engine-" + ln.Addr().String()
	s, err := engine.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return "http://" + ln.Addr().String()
}

// 100 static workers whose engines accept the /v1/models ask and never
// answer, listed before three simulated engines that answer: every worker
// is asked before the start's deadline (one ModelsTimeout, 3 s), so the
// three serve from the start, and those that did not answer join without
// models and are asked again in the background, serving once they
// answer. Workers were asked 64 at a time, each ask given the whole
// deadline: the first 64 hung ones held every slot until it passed, and
// the 36 after them and the three engines were not asked before the
// start.
func TestEveryStaticWorkerIsAskedBeforeTheStartsDeadline(t *testing.T) {
	const hung = 100
	var up atomic.Bool
	urls, asked := heldModelsServers(t, hung, "late", &up)
	var workers []string
	for i, u := range urls {
		workers = append(workers, fmt.Sprintf("hung%d=%s", i, u))
	}
	for i := range 3 {
		workers = append(workers, fmt.Sprintf("sim%d=%s", i, simEngine(t)))
	}
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	st := NewStatic(fl, workers, nil)
	defer st.Close()
	const bound = StaticModelsTimeout // as `infera serve` runs it
	start := time.Now()
	st.Apply(config.Default())
	took := time.Since(start)
	if took > bound+time.Second { // the bound and slack for a loaded machine
		t.Fatalf("Apply took %v, bound %v", took.Round(time.Millisecond), bound)
	}
	if n := len(fl.View().ByModel["sim-model"]); n != 3 {
		t.Fatalf("%d of the 3 simulated engines listed after %d hung workers serve sim-model after Apply (took %v)", n, hung, took.Round(time.Millisecond))
	}
	time.Sleep(100 * time.Millisecond) // an ask sent at the deadline reaching its server
	var unasked []string
	for i := range asked {
		if asked[i].Load() == 0 {
			unasked = append(unasked, fmt.Sprint("hung", i))
		}
	}
	if len(unasked) > 0 {
		t.Fatalf("%d hung workers never asked before the start: %s", len(unasked), strings.Join(unasked, " "))
	}
	for i := range hung {
		if w := fl.Get(fmt.Sprint("hung", i)); w == nil || len(w.Models) != 0 {
			t.Fatalf("hung%d: %v, want listed without models", i, w)
		}
	}
	// They answer now: asked again in the background, they serve.
	up.Store(true)
	st.retry = 100 * time.Millisecond
	done := make(chan struct{})
	go func() { defer close(done); st.Run(config.Default) }()
	defer func() { st.Close(); <-done }()
	waitFor(t, 5*time.Second, "the hung workers serving once they answer", func() bool { return len(fl.View().ByModel["late"]) == hung })
}
