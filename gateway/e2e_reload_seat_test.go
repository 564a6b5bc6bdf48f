package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A request queued for a seat keeps its place while reloads replace its
// worker's record with the same engine (another model list): it is
// served when the seat frees. It left the queue at each reload, picked
// again, and after the third one was answered 503 no_workers, the worker
// routable all along.
func TestAQueuedRequestOutlivesReloadsThatReplaceItsWorker(t *testing.T) {
	_, eA := startEngine(t, "--speedup", "1", "--model", "sim-model,alt-model")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	cfg := func(models string) string {
		return fmt.Sprintf(`{"workers":[{"id":"a","url":%q,"models":[%s]}],
			"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_timeout_ms":20000}}`, eA, models)
	}
	if err := os.WriteFile(cfgPath, []byte(cfg(`"sim-model"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	checkAQueuedRequestOutlivesReloads(t, cfgPath, []string{cfg(`"sim-model","alt-model"`), cfg(`"sim-model"`), cfg(`"alt-model","sim-model"`), cfg(`"sim-model"`)})
}

// doPostNoFatal is doPost for a goroutine other than the test's: a
// transport error is status 0.
func doPostNoFatal(url, body string) (int, string) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// A request queued for a seat whose worker reloads move to another engine
// and back, again and again, picks again after each and keeps waiting: it
// is served when the seat frees. After the third move it was answered 503
// no_workers, a worker routable all along.
func TestAQueuedRequestOutlivesReloadsThatMoveItsWorker(t *testing.T) {
	_, eA := startEngine(t, "--speedup", "1")
	_, eB := startEngine(t, "--speedup", "1")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	cfg := func(url string) string {
		return fmt.Sprintf(`{"workers":[{"id":"a","url":%q,"models":["sim-model"]}],
			"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_timeout_ms":20000}}`, url)
	}
	if err := os.WriteFile(cfgPath, []byte(cfg(eA)), 0o644); err != nil {
		t.Fatal(err)
	}
	checkAQueuedRequestOutlivesReloads(t, cfgPath, []string{cfg(eB), cfg(eA), cfg(eB), cfg(eA)})
}

// Requests that find every seat taken while reloads switch the seat
// limit off and on are served: none is refused. One whose gate saw every
// candidate full just before a reload lifted the limit got 429
// concurrency_overall with an empty message (the marker of "wait for a
// seat" reached the client once the seats no longer queued).
func TestRequestsThatFindTheSeatsFullAreServedWhileReloadsLiftTheLimit(t *testing.T) {
	_, eA := startEngine(t, "--speedup", "20")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	cfg := func(rl string) string {
		return fmt.Sprintf(`{"workers":[{"id":"a","url":%q,"models":["sim-model"]}]%s}`, eA, rl)
	}
	limited := cfg(`,"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_timeout_ms":20000}`)
	if err := os.WriteFile(cfgPath, []byte(limited), 0o644); err != nil {
		t.Fatal(err)
	}
	rt, r := startServe(t, "--config", cfgPath, "--config-poll", "0", "--router-policy", "round-robin")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c := limited
			if i%2 == 1 {
				c = cfg(``)
			}
			os.WriteFile(cfgPath, []byte(c), 0o644)
			rt.store.ReloadAsked()
		}
	}()
	ok, fails := loadClients(t, r, 16, 3*time.Second, "sim-model")
	close(stop)
	<-done
	t.Logf("%d served", ok)
	for _, f := range fails {
		t.Errorf("refused: %s", f)
	}
}

// loadClients runs n clients against router for d, alternating streamed
// and whole chat completions; it returns the failures (bounded list).
func loadClients(t *testing.T, router string, n int, d time.Duration, model string) (ok int64, fails []string) {
	return loadClientsKey(t, router, n, d, model, "", nil)
}

func loadClientsKey(t *testing.T, router string, n int, d time.Duration, model, key string, allowed map[int]bool) (ok int64, fails []string) {
	t.Helper()
	var mu sync.Mutex
	var okN atomic.Int64
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; time.Now().Before(deadline) && j < 2000; j++ {
				stream := (i+j)%2 == 0
				s := ""
				if stream {
					s = `"stream":true,`
				}
				body := fmt.Sprintf(`{"model":%q,%s"max_tokens":%d,"messages":[{"role":"user","content":"client %d request %d"}]}`, model, s, 4+j%12, i, j)
				req, _ := http.NewRequest("POST", router+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				req.Header.Set("X-Session-Id", fmt.Sprintf("session-%d", i%8))
				resp, err := cl.Do(req)
				var fail string
				if err != nil {
					fail = err.Error()
				} else {
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch {
					case err != nil:
						fail = fmt.Sprintf("%d read: %v: %q", resp.StatusCode, err, b)
					case allowed[resp.StatusCode]:
						continue
					case resp.StatusCode != 200:
						fail = fmt.Sprintf("%d %q", resp.StatusCode, b)
					case stream && (!bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) || bytes.Contains(b, []byte(`"error"`))):
						fail = fmt.Sprintf("stream %q", b)
					}
				}
				if fail != "" {
					mu.Lock()
					if len(fails) < 20 {
						fails = append(fails, fmt.Sprintf("stream=%v: %s", stream, fail))
					}
					mu.Unlock()
					continue
				}
				okN.Add(1)
			}
		}(i)
	}
	wg.Wait()
	return okN.Load(), fails
}

// checkAQueuedRequestOutlivesReloads starts a router on cfgPath (one
// worker, one seat that queues), holds the seat with a stream, queues a
// second request behind it, writes and reloads each of reloads in turn,
// and checks that the queued request waits through them all and is then
// served.
func checkAQueuedRequestOutlivesReloads(t *testing.T, cfgPath string, reloads []string) {
	t.Helper()
	rt, r := startServe(t, "--config", cfgPath, "--config-poll", "0")
	long := make(chan int, 1)
	go func() {
		st, _ := doPostNoFatal(r+"/v1/chat/completions", `{"model":"sim-model","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hold the seat"}]}`)
		long <- st
	}()
	waitUntil(t, "the seat taken", func() bool { return metric(t, r, `infera_rate_limit_seats{counter="overall"}`) == "1" })
	type answer struct {
		status int
		body   string
	}
	queued := make(chan answer, 1)
	go func() {
		st, b := doPostNoFatal(r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"wait for it"}]}`)
		queued <- answer{st, b}
	}()
	time.Sleep(150 * time.Millisecond)
	for i, c := range reloads {
		if err := os.WriteFile(cfgPath, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
		if changed, err := rt.store.ReloadAsked(); !changed || err != nil {
			t.Fatalf("reload %d: %v %v", i, changed, err)
		}
		time.Sleep(100 * time.Millisecond)
		select {
		case a := <-queued:
			t.Fatalf("the queued request was answered after reload %d, the seat still held: %d %s", i, a.status, a.body)
		default:
		}
	}
	select {
	case a := <-queued:
		if a.status != 200 {
			t.Fatalf("the queued request: %d %s", a.status, a.body)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the queued request was never answered")
	}
	if st := <-long; st != 200 {
		t.Fatalf("the stream holding the seat: %d", st)
	}
}
