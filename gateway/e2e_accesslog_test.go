package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// infera serve --access-log: a line per request in the file, and after a
// log rotator moved the file and sent SIGHUP, the next lines in a new file
// at the path; the process keeps serving.
func TestE2EAccessLogIsWrittenAndReopenedOnSIGHUP(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50")
	path := filepath.Join(t.TempDir(), "access.log")
	r := startChild(t, "serve", 0, "--workers", e1, "--access-log", path, "--api-key", "e2e-key")
	hdr := map[string]string{"Authorization": "Bearer e2e-key", "X-Request-Id": "first"}
	if resp, b := request(t, r.url+"/v1/chat/completions", chatJSON("sim-model", "hello", 2, false), hdr); resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "first" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
	waitUntil(t, "the first line", func() bool { b, _ := os.ReadFile(path); return strings.Contains(string(b), `"request_id":"first"`) })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	r.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, "a new file", func() bool { _, err := os.Stat(path); return err == nil })
	hdr["X-Request-Id"] = "second"
	if resp, _ := request(t, r.url+"/v1/chat/completions", chatJSON("sim-model", "hello", 2, true), hdr); resp.StatusCode != 200 {
		t.Fatalf("after SIGHUP: %d", resp.StatusCode)
	}
	r.stop() // the drain writes what is waiting
	for file, id := range map[string]string{path + ".1": "first", path: "second"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var line map[string]any
		if strings.Count(string(b), "\n") != 1 || json.Unmarshal(b, &line) != nil || line["request_id"] != id ||
			line["status"] != 200.0 || line["model"] != "sim-model" || line["completion_tokens"] != 2.0 {
			t.Fatalf("%s: %s", file, b)
		}
		if strings.Contains(string(b), "e2e-key") || strings.Contains(string(b), "hello") {
			t.Fatalf("%s holds the key or the prompt: %s", file, b)
		}
	}
}

// A stream, and a request still waiting for its whole answer, open when
// --shutdown-timeout runs out are cut, and each has its access-log line
// like every other request (the lines waiting are written before the
// process exits); the engine requests are cancelled.
func TestE2EARequestCutByTheDrainTimeoutIsInTheAccessLog(t *testing.T) {
	eng, e1 := startEngine(t, "--speedup", "1")
	path := filepath.Join(t.TempDir(), "access.log")
	r := startChild(t, "serve", 0, "--workers", e1, "--access-log", path, "--shutdown-timeout", "1s")
	send := func(id string, stream bool) {
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatJSON("sim-model", "hello", 100000, stream)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", id)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	go send("cut-stream-1", true)
	go send("cut-whole-1", false) // waits for its first byte: the liveness watchdog sees the cut
	waitUntil(t, "both requests in flight", func() bool { return eng.Stats().Active == 2 && eng.Stats().GeneratedTokens > 0 })
	start := time.Now()
	r.stop()
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("the router took %v to stop with --shutdown-timeout 1s", d)
	}
	b, _ := os.ReadFile(path)
	for _, id := range []string{"cut-stream-1", "cut-whole-1"} {
		if !strings.Contains(string(b), `"request_id":"`+id+`"`) {
			t.Fatalf("the cut request %s has no access-log line: %q\n%s", id, b, r.logText())
		}
	}
	waitUntil(t, "the engine requests cancelled", func() bool { return eng.Stats().Aborted == 2 && eng.Stats().Active == 0 })
}
