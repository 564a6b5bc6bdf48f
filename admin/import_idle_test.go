package admin

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// shortIdle shortens importIdleTimeout for one test.
func shortIdle(t *testing.T, d time.Duration) {
	old := importIdleTimeout
	importIdleTimeout = d
	t.Cleanup(func() { importIdleTimeout = old })
}

// sendHead opens a connection to addr and sends an import's head
// announcing a body of length bytes, then the first bytes of it.
func sendHead(t *testing.T, addr string, length int64, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "POST /api/backup/import HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", testKey, length, first); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitImporting waits (at most 5 s) until an import holds a's slot.
func waitImporting(t *testing.T, a *Admin) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(a.importing) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no import took the slot in 5 s")
		}
	}
}

// Imports run one at a time, from before their body is read, and an
// import's body had the whole transfer timeout (10 minutes) to arrive: a
// client holding the key that announced a body and sent nothing (or a
// byte a minute) held the slot for 10 minutes, and every other import and
// dry run waited behind it. An import's body is now cut with a 408 once
// no byte arrived for importIdleTimeout (60 s; 500 ms here), and the
// import waiting behind it runs right away.
func TestASilentImportIsA408AfterTheIdleBoundAndTheNextImportRuns(t *testing.T) {
	shortDeadlines(t, 20*time.Second, 20*time.Second)
	shortIdle(t, 500*time.Millisecond)
	a, addr := listening(t)
	next, err := config.Parse([]byte(`{"session_affinity":{"ttl_s":78}}`))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := a.seal.encodeSnapshot(next, 1, kindExport, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	silent := sendHead(t, addr, 1000, `{"format"`)
	waitImporting(t, a)
	start := time.Now()

	type answer struct {
		status int
		body   []byte
		err    error
		at     time.Time
	}
	second := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://"+addr+"/api/backup/import", bytes.NewReader(snap))
		req.Header.Set("Authorization", "Bearer "+testKey)
		res, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
		if err != nil {
			second <- answer{err: err, at: time.Now()}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		second <- answer{status: res.StatusCode, body: b, at: time.Now()}
	}()

	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(silent), nil)
	if err != nil {
		t.Fatalf("a silent import (idle bound 500 ms, transfer timeout 20 s): no answer in 10 s: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	cut := time.Since(start)
	if res.StatusCode != http.StatusRequestTimeout || !bytes.Contains(b, []byte("did not arrive in time")) {
		t.Fatalf("a silent import: %d %s", res.StatusCode, b)
	}
	if cut > 5*time.Second {
		t.Fatalf("a silent import held the slot %v (idle bound 500 ms)", cut)
	}

	select {
	case got := <-second:
		if got.err != nil || got.status != http.StatusOK {
			t.Fatalf("the import waiting behind the silent one: %d %s %v", got.status, got.body, got.err)
		}
		if after := got.at.Sub(start) - cut; after > 5*time.Second {
			t.Fatalf("the import waiting behind the silent one finished %v after it was cut", after)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the import waiting behind the silent one did not finish in 15 s")
	}
	if got := a.store.Load().SessionAffinity.TTLSeconds; got != 78 {
		t.Fatalf("ttl_s %v after the second import, want 78", got)
	}
}
