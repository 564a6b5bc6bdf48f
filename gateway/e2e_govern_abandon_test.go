package gateway

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infera/infera/internal/testsrv"
)

// Over the NATS request transport, with the simulated engine: a client
// that leaves a non-streamed request while the engine generates its answer
// (its first byte is its last) keeps the request counted against its RPM
// and quota and is charged its prompt, not the 500 tokens of max_tokens.
// Refunded entirely, as it was, such a client could send at any rate and
// leave before each answer, its limits never reached.
func TestE2EGovernAClientLeavingOverNATSKeepsItsCountsAndPaysItsPrompt(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	eng, e := startEngine(t) // 12 ms a token: 500 take 6 s
	common := []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", nsrv.URL, "--lease-ttl", "2s"}
	startWorker(t, append([]string{"--id", "w1", "--engine-url", e}, common...)...)
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"user_limit": {"templates": [{"name": "t", "default": true,
		"rate": {"enabled": true, "rpm": 1},
		"quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
			"windows": [{"period": "day", "max_requests": 100}]}}]},
		"users": [{"name": "nats-leaver", "keys": [%q]}]}`, hash))
	rt, r := startServe(t, append(common[:len(common)-2:len(common)-2], "--config", cfg)...)
	waitRoutable(t, rt, 1)
	body := chatJSON("sim-model", strings.Repeat("tell me a long story ", 40), 500, false)
	c, err := net.Dial("tcp4", strings.TrimPrefix(r, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	waitUntil(t, "the engine generating the request", func() bool { return eng.Stats().Submitted == 1 })
	c.Close()
	waitUntil(t, "the engine's request aborted", func() bool { return eng.Stats().Aborted == 1 })
	series := `infera_user_quota_tokens_total{user="nats-leaver"}`
	waitUntil(t, "the abandoned request charged", func() bool { return metricF(t, r, series) > 0 })
	if v := metricF(t, r, series); v >= 500 {
		t.Fatalf("charged %v tokens: more than the prompt's estimate", v)
	}
	govPost(t, r, key, body).want(t, 429, "rate_limit_rpm")
	if s := eng.Stats(); s.Submitted != 1 || s.Completed != 0 {
		t.Fatalf("the engine took %d requests and completed %d; want 1 and 0", s.Submitted, s.Completed)
	}
}
