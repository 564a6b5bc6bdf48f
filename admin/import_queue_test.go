package admin

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// snapshotOf is an export of a config whose session_affinity.ttl_s is ttl.
func snapshotOf(t *testing.T, a *Admin, ttl int) []byte {
	t.Helper()
	c, err := config.Parse([]byte(fmt.Sprintf(`{"session_affinity":{"ttl_s":%d}}`, ttl)))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := a.seal.encodeSnapshot(c, 1, kindExport, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// importAnswer reads the answer to an import sent on c.
func importAnswer(t *testing.T, c net.Conn, within time.Duration) (int, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to an import in %v: %v", within, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// waitLog waits (at most within) until the log holds s.
func waitLog(logs *logBuffer, s string, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(logs.String(), s) {
			return true
		}
	}
	return false
}

// An import waiting for the import slot noticed its client had left only
// when the request's context ended, which net/http does not do while the
// body is unread: a client that sent its import and closed the connection
// (curl given up, a console tab closed) stayed queued, and once the slot
// was free its import ran all the same (its whole body was in the socket)
// ahead of the ones still waiting, for nobody. A queued import now checks
// its client's socket every peerCheckEvery and gives up once it closed.
func TestAQueuedImportWhoseClientLeftNeverRuns(t *testing.T) {
	logs := captureLogs(t)
	shortDeadlines(t, 20*time.Second, 20*time.Second)
	a, addr := listening(t)
	snapA, snapB, snapC := snapshotOf(t, a, 44), snapshotOf(t, a, 55), snapshotOf(t, a, 66)

	// A holds the slot: its body arrives slowly.
	ca := sendHead(t, addr, int64(len(snapA)), string(snapA[:10]))
	waitImporting(t, a)

	// B sends its whole import and leaves while it is queued.
	cb := sendHead(t, addr, int64(len(snapB)), string(snapB))
	bAddr := cb.LocalAddr().String()
	time.Sleep(300 * time.Millisecond)
	cb.Close()
	gaveUp := waitLog(logs, "while it waited", 3*time.Second)

	// C is queued behind; then A's body arrives.
	cc := sendHead(t, addr, int64(len(snapC)), string(snapC))
	time.Sleep(300 * time.Millisecond)
	if _, err := ca.Write(snapA[10:]); err != nil {
		t.Fatal(err)
	}
	if status, body := importAnswer(t, ca, 10*time.Second); status != http.StatusOK {
		t.Fatalf("import A: %d %s", status, body)
	}
	aDone := time.Now()
	if status, body := importAnswer(t, cc, 10*time.Second); status != http.StatusOK {
		t.Fatalf("import C: %d %s", status, body)
	}
	if d := time.Since(aDone); d > 2*time.Second {
		t.Fatalf("import C finished %v after A", d)
	}
	for _, e := range a.audit.list(100) {
		if e.Remote == bAddr {
			t.Fatalf("import B, whose client left while it was queued, ran: %+v (gave up in the log: %v)", e, gaveUp)
		}
		for _, ch := range e.Changes {
			if ch.New == "55" {
				t.Fatalf("import B's value was applied: %+v", e)
			}
		}
	}
	if !gaveUp {
		t.Fatal("no log line says import B gave up")
	}
	if got := a.store.Load().SessionAffinity.TTLSeconds; got != 66 {
		t.Fatalf("ttl_s %v after the imports, want C's 66", got)
	}
}

// Imports waiting for the slot run in their order of arrival: a
// legitimate import is not starved by ones that arrive after it. The wait
// that watches the client (takeImportSlot) stays one blocking select, so
// it keeps the channel's first-in, first-out queue of senders.
func TestQueuedImportsRunInTheirOrderOfArrival(t *testing.T) {
	shortDeadlines(t, 20*time.Second, 20*time.Second)
	a, addr := listening(t)
	snapA := snapshotOf(t, a, 40)
	ca := sendHead(t, addr, int64(len(snapA)), string(snapA[:10]))
	waitImporting(t, a)
	var queued []net.Conn
	for _, ttl := range []int{51, 52, 53, 54} {
		snap := snapshotOf(t, a, ttl)
		queued = append(queued, sendHead(t, addr, int64(len(snap)), string(snap)))
		time.Sleep(150 * time.Millisecond) // queued before the next one comes
	}
	if _, err := ca.Write(snapA[10:]); err != nil {
		t.Fatal(err)
	}
	if status, body := importAnswer(t, ca, 10*time.Second); status != http.StatusOK {
		t.Fatalf("import A: %d %s", status, body)
	}
	for i, c := range queued {
		if status, body := importAnswer(t, c, 10*time.Second); status != http.StatusOK {
			t.Fatalf("queued import %d: %d %s", i, status, body)
		}
	}
	var order []string
	entries := a.audit.list(100)
	for i := len(entries) - 1; i >= 0; i-- { // listed newest first
		for _, ch := range entries[i].Changes {
			if ch.Path == "session_affinity.ttl_s" {
				order = append(order, ch.New)
			}
		}
	}
	if got := strings.Join(order, " "); got != "40 51 52 53 54" {
		t.Fatalf("imports ran in the order %s, want 40 51 52 53 54", got)
	}
	if got := a.store.Load().SessionAffinity.TTLSeconds; got != 54 {
		t.Fatalf("ttl_s %v after the imports, want the last one's 54", got)
	}
}

// Over TLS the wait watches the TCP connection under it: a client's
// close_notify arrives as a record ahead of its FIN, so the socket's TCP
// state tells, not a peek.
func TestAQueuedImportOverTLSGivesUpWhenItsClientLeaves(t *testing.T) {
	logs := captureLogs(t)
	shortDeadlines(t, 20*time.Second, 20*time.Second)
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.StartTLS()
	certs := ts.TLS.Certificates
	client := ts.Client().Transport.(*http.Transport).TLSClientConfig
	ts.Close()
	a, err := New(Options{Store: config.NewStore("", nil), Addr: "127.0.0.1:0", Key: testKey, TLS: &tls.Config{Certificates: certs}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	addr := a.Addr().String()
	send := func(snap []byte, n int) net.Conn {
		t.Helper()
		c, err := tls.Dial("tcp", addr, client)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /api/backup/import HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", testKey, len(snap))
		c.Write(snap[:n])
		return c
	}
	snapA, snapB := snapshotOf(t, a, 44), snapshotOf(t, a, 55)
	ca := send(snapA, 10)
	waitImporting(t, a)
	cb := send(snapB, len(snapB))
	time.Sleep(300 * time.Millisecond)
	cb.Close()
	if !waitLog(logs, "while it waited", 3*time.Second) {
		t.Fatal("an import queued over TLS did not give up in 3 s after its client left")
	}
	ca.Write(snapA[10:])
	if status, body := importAnswer(t, ca, 10*time.Second); status != http.StatusOK {
		t.Fatalf("import A: %d %s", status, body)
	}
	time.Sleep(100 * time.Millisecond)
	if got := a.store.Load().SessionAffinity.TTLSeconds; got != 44 {
		t.Fatalf("ttl_s %v, want A's 44: B, whose client left, ran", got)
	}
}
