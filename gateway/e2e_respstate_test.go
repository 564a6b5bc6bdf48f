package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// respCall sends one request to a router with the key (none when ""),
// and answers its status, body and the engine that answered.
func respCall(t *testing.T, r *child, method, path, body, key string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(method, r.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), resp.Header.Get("X-Infera-Engine-Id")
}

// respCreate creates a stored Response through r and answers its id.
func respCreate(t *testing.T, r *child, key string) string {
	t.Helper()
	code, body, _ := respCall(t, r, "POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":4}`, key)
	var v struct{ ID string }
	json.Unmarshal([]byte(body), &v)
	if code != 200 || !strings.HasPrefix(v.ID, "resp_") {
		t.Fatalf("create through %s: %d %s", r.url, code, body)
	}
	return v.ID
}

// A stored Response's record lives in Redis for
// protocol.responses_state_ttl_s after its create, and a reload of it
// applies to the records made after it. Before, it was a day whatever the
// configuration said (a constant).
func TestAStoredResponsesRecordLivesItsConfiguredTTL(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	conf := func(ttl int) string {
		return fmt.Sprintf(`{"protocol":{"responses_passthrough":true,"responses_state_ttl_s":%d}}`, ttl)
	}
	writeConfig(t, cfg, conf(3600))
	r := startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--config-poll", "20ms", "--state", rd.URL)
	pttl := func(id string) int {
		t.Helper()
		v, err := rd.Do("PTTL", "infera:resp:"+id)
		ms, _ := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("PTTL: %q %v", v, err)
		}
		return ms
	}
	if ms := pttl(respCreate(t, r, "")); ms > 3600_000 || ms < 3590_000 {
		t.Fatalf("the record's TTL: %d ms, want the hour configured", ms)
	}
	old := respCreate(t, r, "")
	writeConfig(t, cfg, conf(120))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ms := pttl(respCreate(t, r, ""))
		if ms <= 120_000 && ms > 110_000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the reload to 120 s a record's TTL is still %d ms", ms)
		}
	}
	if ms := pttl(old); ms < 3500_000 {
		t.Fatalf("a record made before the reload: %d ms left, want its hour", ms)
	}
}
