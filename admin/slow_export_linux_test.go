package admin

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// An export of a large config (an export of 110,000 users is 27 MB) had
// the listener's 60 s write deadline, from the request's head: read
// slower than about 0.45 MB/s, through a tunnel to a remote router, the
// download was cut. Once its key is checked, a download has the transfer
// timeout. Here 60,000 users (6.6 MB, above the 4 MB a loopback socket
// holds) are read at about 1.6 MB/s with the listener's deadlines at
// 300 ms.
func TestAnExportReadSlowerThanTheWriteTimeoutArrivesWhole(t *testing.T) {
	shortDeadlines(t, 300*time.Millisecond, 60*time.Second)
	a, addr := listening(t)
	var doc strings.Builder
	doc.WriteString(`{"users":[`)
	for i := range 60000 {
		if i > 0 {
			doc.WriteByte(',')
		}
		fmt.Fprintf(&doc, `{"name":"user-%05d","enabled":true,"models":["qwen3-8b","qwen3-32b"]}`, i)
	}
	doc.WriteString(`]}`)
	c, err := config.Parse([]byte(doc.String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.Apply(c, 0); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		// A small window, as a slow link's: the server's writes wait for
		// the reader instead of filling a large loopback buffer.
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		})
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/backup/export HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", testKey)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer res.Body.Close()
	var got int
	buf := make([]byte, 16<<10)
	for {
		n, err := res.Body.Read(buf)
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the export was cut after %d bytes: %v", got, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	want, err := a.seal.encodeSnapshot(a.store.Load(), 2, kindExport, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || got < len(want)-100 {
		t.Fatalf("%d: %d bytes, want about %d", res.StatusCode, got, len(want))
	}
}
