package admin

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that closes its connection in the middle of a body (an import,
// a config write, a user creation) has left: the write was answered 500
// and logged as an ERROR ("admin request failed err=\"unexpected EOF\""),
// as if the router had failed. It is now a 400 that says the body ended
// early (to a client that is likely gone), logged at INFO, and the router
// goes on serving.
func TestABodyEndedByTheClientIsNoServerError(t *testing.T) {
	logs := captureLogs(t)
	a, addr := listening(t)
	for _, tc := range []struct{ method, path string }{
		{"POST", "/api/backup/import"},
		{"PATCH", "/api/config/session_affinity"},
		{"PUT", "/api/config"},
		{"POST", "/api/users"},
	} {
		before := len(logs.String())
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nIf-Match: *\r\nContent-Length: 1000\r\n\r\n{\"ttl_s\":1", tc.method, tc.path, testKey)
		time.Sleep(50 * time.Millisecond) // the handler is reading the body
		c.Close()
		var got string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got = logs.String()[before:]
			if strings.Contains(got, "admin request") {
				break
			}
		}
		if strings.Contains(got, "level=ERROR") || !strings.Contains(got, "level=INFO") || !strings.Contains(got, "body ended early") {
			t.Fatalf("%s %s: the client closed the connection 10 bytes into a 1000-byte body; the log says:\n%s", tc.method, tc.path, got)
		}
	}
	if _, v := a.store.Current(); v != 1 {
		t.Fatalf("version %d, want 1: a write whose body ended early changed the config", v)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/api/version", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the listener after the cut bodies: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the listener after the cut bodies: %d", res.StatusCode)
	}
}
