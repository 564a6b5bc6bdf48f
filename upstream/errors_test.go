package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Errors of real requests are described in fixed words, never with the
// bytes a peer sent.
func TestDescribeErrorNeverQuotesThePeer(t *testing.T) {
	do := func(url string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		return err
	}
	serveRaw := func(answer string, hold time.Duration) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					bufio.NewReader(c).ReadString('\n')
					io.WriteString(c, answer)
					time.Sleep(hold)
				}()
			}
		}()
		return "http://" + ln.Addr().String()
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + ln.Addr().String()
	ln.Close()
	f := func(err error, want string) {
		t.Helper()
		if err == nil {
			t.Fatal("no error")
		}
		if got := DescribeError(err); got != want {
			t.Fatalf("DescribeError(%v) = %q, want %q", err, got, want)
		}
	}
	f(do(closed, time.Second), "dial: connection refused")
	f(do(serveRaw("HTTP/1.1 99999 PEER-SECRET\r\n\r\n", 0), time.Second), "protocol error")
	f(do(serveRaw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", 0), time.Second), "connection closed early")
	f(do(serveRaw("", 2*time.Second), 100*time.Millisecond), "timeout")
	f(fmt.Errorf("wrapped: %w", context.Canceled), "cancelled")
	f(errors.New("PEER-SECRET"), "protocol error")
	if DescribeError(nil) != "" {
		t.Fatal("nil error described")
	}
	if strings.Contains(DescribeError(do(serveRaw("garbage PEER-SECRET\r\n\r\n", 0), time.Second)), "SECRET") {
		t.Fatal("peer bytes in the description")
	}
}
