package bench

import (
	"strings"
	"testing"
	"time"
)

func TestFixedBackendAndHammer(t *testing.T) {
	be, err := StartFixedBackend("sim-model", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	for _, stream := range []bool{false, true} {
		body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
		if stream {
			body = []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		}
		r, err := hammer(be.URL, body, stream, 4, 200*time.Millisecond, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if r.Requests == 0 || r.Errors != 0 || r.RPS <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
			t.Fatalf("stream=%v: %+v", stream, r)
		}
		if stream && r.TTFTP50 <= 0 {
			t.Fatalf("stream TTFT not measured: %+v", r)
		}
	}
	rep := &ProxyReport{Paths: []ProxyPathResult{{Name: "direct", RPS: 100, P50: 1, P99: 2}, {Name: "infera", RPS: 80, P50: 1.5, P99: 3}}}
	var b strings.Builder
	if err := WriteProxyTable(&b, rep); err != nil || !strings.Contains(b.String(), "0.80") {
		t.Fatalf("table: %v\n%s", err, b.String())
	}
}
