package classify

import (
	"net/http"
	"strings"
	"testing"
)

func BenchmarkParseAnswer(b *testing.B) {
	ans := []byte(`{"tier":"L2","score":0.61}`)
	b.ReportAllocs()
	for b.Loop() {
		if t, err := ParseAnswer(ans); err != nil || t != TierL2 {
			b.Fatal(t, err)
		}
	}
}

func BenchmarkAppendRequest(b *testing.B) {
	text := []byte(strings.Repeat("Explain the trade-off between latency and \"throughput\".\n", 200))
	model := []byte("auto")
	var dst []byte
	b.ReportAllocs()
	b.SetBytes(8192)
	for b.Loop() {
		dst = AppendRequest(dst[:0], model, text, 8192)
	}
}

// BenchmarkClassify is one classification over loopback against a
// minimal classifier (the round trip dominates).
func BenchmarkClassify(b *testing.B) {
	ln := listen(b)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"tier":"L1"}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	cfg := smartCfg("http://" + ln.Addr().String() + "/c")
	var c Client
	defer c.Close()
	text := []byte(strings.Repeat("hello world ", 100))
	b.ReportAllocs()
	for b.Loop() {
		if r := c.Classify(cfg, []byte("auto"), text); r.Outcome != OutcomeOK {
			b.Fatal(r)
		}
	}
}
