package admin

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// shortDeadlines shortens the admin listener's deadlines for one test.
func shortDeadlines(t *testing.T, read, transfer time.Duration) {
	r, w, tr := readTimeout, writeTimeout, transferTimeout
	readTimeout, writeTimeout, transferTimeout = read, read, transfer
	t.Cleanup(func() { readTimeout, writeTimeout, transferTimeout = r, w, tr })
}

// listening starts an admin on its own loopback listener (Start), with the
// listener's deadlines, and returns its address.
func listening(t *testing.T) (*Admin, string) {
	t.Helper()
	a, err := New(Options{Store: config.NewStore("", nil), Addr: "127.0.0.1:0", Key: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, a.Addr().String()
}

// trickle sends a request whose body takes about spread to arrive (in
// ten pieces) and returns the answer.
func trickle(t *testing.T, addr, method, path string, body []byte, spread time.Duration, hdr ...string) (int, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n", method, path, testKey, len(body))
	for _, h := range hdr {
		head += h + "\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		time.Sleep(spread / 10)
		piece := body[i*len(body)/10 : (i+1)*len(body)/10]
		if _, err := c.Write(piece); err != nil {
			break // the server gave up on the body: its answer says why
		}
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: no answer: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// An import's body may be up to 64 MiB, but the admin listener read every
// body within 60 s: below about 1.1 MB/s (a 4 MB export sent at 40 KB/s,
// through a tunnel to a remote router) the import was cut and answered
// 500 "read tcp ...: i/o timeout". Once its key is checked, an import's
// body and answer have the transfer timeout instead. The idle bound
// (importIdleTimeout, 1 s here) does not cut a body that keeps moving.
func TestAnImportSlowerThanTheReadTimeoutIsImported(t *testing.T) {
	shortDeadlines(t, time.Second, 30*time.Second)
	shortIdle(t, time.Second)
	a, addr := listening(t)
	next, err := config.Parse([]byte(`{"session_affinity":{"ttl_s":77}}`))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := a.seal.encodeSnapshot(next, 1, kindExport, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	status, body := trickle(t, addr, "POST", "/api/backup/import", snap, 2500*time.Millisecond)
	if status != http.StatusOK {
		t.Fatalf("an import sent over 2.5 s (read timeout and idle bound 1 s): %d %s", status, body)
	}
	if got := a.store.Load().SessionAffinity.TTLSeconds; got != 77 {
		t.Fatalf("ttl_s %v after the import, want 77", got)
	}
}

// Any other body that does not arrive before the read deadline is a 408
// in the API's error shape, and changes nothing: it was a 500 carrying the
// socket's "i/o timeout".
func TestABodyThatDoesNotArriveInTimeIsA408(t *testing.T) {
	shortDeadlines(t, time.Second, 30*time.Second)
	a, addr := listening(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PATCH /api/config/session_affinity HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nIf-Match: *\r\nContent-Length: 100\r\n\r\n{\"ttl_s\":", testKey)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer res.Body.Close()
	var e errorJSON
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusRequestTimeout || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, "did not arrive in time") {
		t.Fatalf("a body that stopped half way: %d %s", res.StatusCode, b)
	}
	if _, v := a.store.Current(); v != 1 {
		t.Fatalf("version %d, want 1: the write changed the config", v)
	}
}
