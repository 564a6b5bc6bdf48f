package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// An import still uploading when the router shuts down is not committed
// after the last snapshot: Close gave requests in flight 5 s and then took
// the last snapshot while their connections stayed open, so an import
// read on past the grace landed after it (answered 200), and a restart
// from the snapshots lost it. Past the grace the connections are cut, and
// a change that reaches its commit after Close began is refused.
func TestAnImportStillUploadingAtShutdownIsNotCommittedAfterTheLastSnapshot(t *testing.T) {
	grace := shutdownGrace
	shutdownGrace = 300 * time.Millisecond
	t.Cleanup(func() { shutdownGrace = grace })
	dir := t.TempDir()
	store := config.NewStore("", nil)
	a, err := New(Options{Store: store, Addr: "127.0.0.1:0", Key: testKey, SnapshotDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	addr := a.Addr().String()
	do := func(method, path, body string) []byte {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("If-Match", "*")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, data)
		}
		return data
	}
	threshold := func(s *config.Store) int { return s.Load().PrefixCache.PendingRequestThreshold }
	do("PATCH", "/api/config/prefix_cache", `{"pending_request_threshold":7}`)
	export := do("GET", "/api/backup/export", "")
	do("PATCH", "/api/config/prefix_cache", `{"pending_request_threshold":9}`)

	// Half the import's body, then the router shuts down.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /api/backup/import HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", testKey, len(export))
	c.Write(export[:len(export)/2])
	time.Sleep(200 * time.Millisecond) // the import is reading its body
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	verAtClose := store.Version()

	// The rest of the body arrives after the last snapshot.
	c.Write(export[len(export)/2:])
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	answer, _ := io.ReadAll(c)
	time.Sleep(300 * time.Millisecond)
	if v, n := store.Version(), threshold(store); v != verAtClose || n != 9 {
		t.Fatalf("after Close: version %d (was %d), threshold %d (want 9): the import landed after the last snapshot; it was answered %.200q", v, verAtClose, n, answer)
	}
	// A change that reaches its commit after Close is refused.
	_, _, err = a.change(actor{Who: "test"}, "late", 0, func(doc map[string]any) error {
		doc["prefix_cache"] = map[string]any{"pending_request_threshold": json.Number("3")}
		return nil
	})
	if !errors.Is(err, errClosed) || threshold(store) != 9 {
		t.Fatalf("a change after Close: %v, threshold %d", err, threshold(store))
	}

	// A restart from the snapshots serves what the router served last.
	store2 := config.NewStore("", nil)
	a2, err := New(Options{Store: store2, Key: testKey, SnapshotDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if n := threshold(store2); n != threshold(store) {
		t.Fatalf("restored threshold %d, the router served %d", n, threshold(store))
	}
}

// An import whose commit the shutdown refuses (Close began while its
// pre-import snapshot was being written) deletes that snapshot, and the
// log said "another write landed before the import": it now says the
// router is shutting down.
func TestAnImportRefusedAtShutdownSaysSoInTheLog(t *testing.T) {
	logs := captureLogs(t)
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	if r := e.do("POST", "/api/users", `{"name":"a"}`); r.status != 201 {
		t.Fatalf("create a: %d %s", r.status, r.body)
	}
	exp := e.do("GET", "/api/backup/export", "")
	if r := e.do("DELETE", "/api/users/a", "", "If-Match", "*"); r.status != 204 {
		t.Fatalf("delete a: %d %s", r.status, r.body)
	}
	started, release := slowSnapshotWrites(t, e)
	defer release()
	imported := make(chan resp, 1)
	go func() { imported <- e.do("POST", "/api/backup/import", string(exp.body)) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the import wrote no snapshot")
	}
	closed := make(chan struct{})
	go func() { e.a.Close(); close(closed) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e.a.mu.Lock()
		c := e.a.closed
		e.a.mu.Unlock()
		if c {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not begin in 5 s")
		}
	}
	release()
	if r := <-imported; r.status != http.StatusServiceUnavailable {
		t.Fatalf("an import whose commit came after Close began: %d %s, want 503", r.status, r.body)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	got := logs.String()
	if !strings.Contains(got, "pre-import snapshot deleted") || !strings.Contains(got, "shutting down") || strings.Contains(got, "another write landed") {
		t.Fatalf("the log of an import refused at shutdown:\n%s", got)
	}
	if snaps := manualSnapshots(t, e, dir); len(snaps) != 0 {
		t.Fatalf("the refused import left %d manual snapshots: %+v", len(snaps), snaps)
	}
}
