package gateway

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
