package discovery

import (
	"fmt"
	"io"
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

// hangingServers starts n TCP servers that accept every connection and
// never answer (engines that hang).
func hangingServers(t *testing.T, n int) (urls []string) {
	t.Helper()
	for range n {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					io.Copy(io.Discard, c) // until the asker gives up
				}()
			}
		}()
		urls = append(urls, "http://"+ln.Addr().String())
	}
	return urls
}

// countConns makes st's asks count the connections they hold open to
// the hosts of urls, and their most at once in peak. It counts on the
// asker's side, where a connection is closed before its ask ends: a
// server notices a close only when its reader is next scheduled, so on a
// loaded machine it counted an ask that had ended beside the one that
// took its slot (CI saw 71 at once against the bound of 64).
func countConns(st *Static, urls []string) (peak *atomic.Int64) {
	hosts := map[string]bool{}
	for _, u := range urls {
		hosts[strings.TrimPrefix(u, "http://")] = true
	}
	var open atomic.Int64
	peak = new(atomic.Int64)
	dial := st.client.DialTimeout
	st.client.DialTimeout = func(addr string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(addr, timeout)
		if err != nil || !hosts[addr] {
			return c, err
		}
		o := open.Add(1)
		for p := peak.Load(); o > p && !peak.CompareAndSwap(p, o); p = peak.Load() {
		}
		return &countedConn{Conn: c, open: &open}, nil
	}
	return peak
}

// countedConn takes itself off open when first closed.
type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// An engine listed before 320 that hang, and answering 503 at first (it
// is loading its model), is asked again on its own backoff in the
// background, not once per round of all the others: once it is ready it
// serves within its backoff's cap, 5 s, while the asks of those that hang
// run 48 at a time (64 at most of any). The asks were made in rounds,
// every worker without models, 64 at a time, each hanging one holding its
// slot a whole ModelsTimeout (2 s here, 3 s by default): a round took 12 s
// and the engine, asked first in each, waited for the next.
func TestAStaticWorkerThatComesUpIsAskedPromptlyWhileHundredsHang(t *testing.T) {
	const hung = 320
	var up atomic.Bool
	var asked atomic.Int64
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		asked.Add(1)
		if !up.Load() {
			ctx.SetStatusCode(503)
			return
		}
		ctx.SetBodyString(`{"object":"list","data":[{"id":"loaded","object":"model"}]}`)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	urls := hangingServers(t, hung)
	workers := []string{"loading=http://" + ln.Addr().String()}
	for i, u := range urls {
		workers = append(workers, fmt.Sprintf("hung%d=%s", i, u))
	}
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	st := NewStatic(fl, workers, nil)
	st.ModelsTimeout = 2 * time.Second
	st.retry = 100 * time.Millisecond
	peak := countConns(st, urls)
	st.Apply(config.Default())
	if w := fl.Get("loading"); w == nil || len(w.Models) != 0 {
		t.Fatalf("loading: %v, want listed without models while it answers 503", w)
	}
	atStart := asked.Load()
	done := make(chan struct{})
	go func() { defer close(done); st.Run(config.Default) }()
	defer func() { st.Close(); <-done }()
	waitFor(t, 5*time.Second, "the background's first ask of the loading engine", func() bool { return asked.Load() > atStart })
	time.Sleep(500 * time.Millisecond) // the start's last asks ended
	peak.Store(0)
	time.Sleep(2500 * time.Millisecond) // rounds, or backoffs, that find it loading
	up.Store(true)
	ready := time.Now()
	waitFor(t, 10*time.Second, "the loaded engine serving", func() bool { return len(fl.View().ByModel["loaded"]) == 1 })
	if took := time.Since(ready); took > 5*time.Second+500*time.Millisecond {
		t.Fatalf("the engine served %v after it was ready (asked %d times), want within its backoff's cap, 5 s", took.Round(time.Millisecond), asked.Load())
	}
	if p := peak.Load(); p > fetchParallel {
		t.Fatalf("%d asks of the hanging workers at once, bound %d", p, fetchParallel)
	}
	t.Logf("served %v after it was ready; %d asks of the hanging workers at once at most", time.Since(ready).Round(time.Millisecond), peak.Load())
}
