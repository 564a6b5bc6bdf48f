package discovery

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// modelsServer serves /v1/models naming model while up is set, and
// otherwise holds each request without answering (a hung engine) until
// up is set (at the end of the test at the latest).
func modelsServer(t *testing.T, model string, up *atomic.Bool) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		for !up.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		ctx.SetBodyString(`{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	t.Cleanup(func() { up.Store(true) }) // first: let held requests end
	return "http://" + ln.Addr().String()
}

// A static worker that never answers (its SYNs dropped, a connection
// accepted and never answered, nothing listening) held the start for its
// whole ask, 3 s whatever --connect-timeout said, and only 16 were asked
// at once: 20 hung workers held it 6 s, and a live worker listed after
// them was asked only then. All are now asked at once and the start waits
// one ModelsTimeout at most: the live worker serves at once, the others
// join without models.
func TestStaticWorkersThatNeverAnswerHoldTheStartOneTimeoutAtMost(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	var workers []string
	for i := 0; i < 20; i++ {
		workers = append(workers, "hung"+string(rune('a'+i))+"=http://"+testsrv.Silent(t))
	}
	workers = append(workers, "syn=http://"+testsrv.SYNDropping(t), "closed=http://"+testsrv.Closed(t),
		"live="+modelsServer(t, "m", &up))
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	st := NewStatic(fl, workers, nil)
	defer st.Close()
	const bound = 3 * time.Second // the default ModelsTimeout, as `infera serve` runs it
	start := time.Now()
	st.Apply(config.Default())
	took := time.Since(start)
	if took > bound+time.Second { // the bound and slack for a loaded machine
		t.Fatalf("Apply took %v, bound %v", took.Round(time.Millisecond), bound)
	}
	if len(fl.View().ByModel["m"]) != 1 {
		t.Fatalf("the live worker does not serve m after Apply (took %v)", took.Round(time.Millisecond))
	}
	for _, id := range []string{"hunga", "hungt", "syn", "closed"} {
		if w := fl.Get(id); w == nil || len(w.Models) != 0 {
			t.Fatalf("%s: %v, want listed without models", id, w)
		}
	}
}

// The ask's dial is bounded by --connect-timeout (Static.ConnectTimeout):
// a host that drops SYNs costs that, not the whole ModelsTimeout.
func TestAStaticWorkerDroppingSYNsIsGivenUpAfterTheConnectTimeout(t *testing.T) {
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	st := NewStatic(fl, []string{"syn=http://" + testsrv.SYNDropping(t), "closed=http://" + testsrv.Closed(t)}, nil)
	defer st.Close()
	st.ConnectTimeout = 200 * time.Millisecond
	st.ModelsTimeout = 5 * time.Second
	start := time.Now()
	st.Apply(config.Default())
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Apply took %v with a 200ms connect timeout", took.Round(time.Millisecond))
	}
	if w := fl.Get("syn"); w == nil || len(w.Models) != 0 {
		t.Fatalf("syn: %v, want listed without models", w)
	}
}

// A worker that did not answer at start is asked again in the
// background (every 5 s; here shortened) and serves once it answers,
// while a hung worker beside it delays no round beyond its own
// ModelsTimeout.
func TestAStaticWorkerThatDidNotAnswerAtStartIsAskedAgainInTheBackground(t *testing.T) {
	var up atomic.Bool
	late := modelsServer(t, "m", &up)
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	st := NewStatic(fl, []string{"late=" + late, "hung=http://" + testsrv.Silent(t), "syn=http://" + testsrv.SYNDropping(t)}, nil)
	st.ConnectTimeout = 100 * time.Millisecond
	st.ModelsTimeout = 300 * time.Millisecond
	st.retry = 100 * time.Millisecond
	start := time.Now()
	st.Apply(config.Default())
	if took := time.Since(start); took > 300*time.Millisecond+time.Second {
		t.Fatalf("Apply took %v, bound 300ms", took.Round(time.Millisecond))
	}
	if w := fl.Get("late"); w == nil || len(w.Models) != 0 {
		t.Fatalf("late: %v, want listed without models while it hangs", w)
	}
	done := make(chan struct{})
	go func() { defer close(done); st.Run(config.Default) }()
	defer func() { st.Close(); <-done }()
	time.Sleep(500 * time.Millisecond) // rounds that find it hung
	up.Store(true)
	waitFor(t, 3*time.Second, "late serving m", func() bool { return len(fl.View().ByModel["m"]) == 1 })
}
