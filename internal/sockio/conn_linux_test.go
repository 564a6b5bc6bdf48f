package sockio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pair returns a wrapped client connection and the server's plain end.
func pair(t testing.TB) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-ch
	if s == nil {
		t.Fatal("accept failed")
	}
	w, ok := Wrap(c).(*Conn)
	if !ok {
		t.Fatal("a TCP connection was not wrapped")
	}
	t.Cleanup(func() { w.Close(); s.Close() })
	return w, s
}

func TestWrapLeavesOtherConnectionsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Fatal("an in-memory pipe was wrapped")
	}
}

func TestReadWaitsForDataAndWriteSendsAll(t *testing.T) {
	c, s := pair(t)
	go func() {
		time.Sleep(20 * time.Millisecond) // the read parks first
		s.Write([]byte("hello"))
	}()
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if n, err := c.Write([]byte("world")); n != 5 || err != nil {
		t.Fatalf("write %d, %v", n, err)
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(s, buf[:5]); err != nil || string(buf[:5]) != "world" {
		t.Fatalf("peer read %q, %v", buf[:5], err)
	}
}

// A write larger than the socket buffers fills them (EAGAIN), parks, and
// resumes as the peer drains: every byte arrives, in order.
func TestWriteLargerThanSocketBuffersResumesAfterEAGAIN(t *testing.T) {
	c, s := pair(t)
	data := make([]byte, 32<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // let the buffers fill
		b, _ := io.ReadAll(s)
		got <- b
	}()
	n, err := c.Write(data)
	if n != len(data) || err != nil {
		t.Fatalf("write %d of %d, %v", n, len(data), err)
	}
	c.Close()
	if b := <-got; !bytes.Equal(b, data) {
		t.Fatalf("peer got %d bytes, different from the %d written", len(b), len(data))
	}
}

func TestReadAfterPeerClosesIsEOF(t *testing.T) {
	c, s := pair(t)
	s.Write([]byte("x"))
	s.Close()
	buf := make([]byte, 4)
	if n, err := c.Read(buf); n != 1 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read %d, %v; want io.EOF", n, err)
	}
}

func TestReadDeadlineIsATimeout(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	_, err := c.Read(make([]byte, 4))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read error %v; want a timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("deadline of 30ms returned after %v", d)
	}
}

func TestWriteDeadlineStopsAWriteThePeerNeverReads(t *testing.T) {
	c, _ := pair(t)
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := c.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write error %v; want a timeout", err)
	}
	if n <= 0 || n >= 64<<20 {
		t.Fatalf("wrote %d bytes; want a partial count", n)
	}
}

// Close from another goroutine ends a parked Read at once, as with a
// net.Conn (the proxy aborts upstream reads this way when a client leaves).
func TestCloseEndsAParkedRead(t *testing.T) {
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 4))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read error %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the parked Read")
	}
}

func TestResetByPeerIsAReadError(t *testing.T) {
	c, s := pair(t)
	s.(*net.TCPConn).SetLinger(0) // close sends RST
	s.Close()
	time.Sleep(20 * time.Millisecond)
	_, err := c.Read(make([]byte, 4))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read error %v; want ECONNRESET", err)
	}
}

// One reader and one writer at a time, concurrently: a full-duplex echo.
func TestConcurrentReadAndWrite(t *testing.T) {
	c, s := pair(t)
	go io.Copy(s, s) // echo
	const total = 4 << 20
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		chunk := bytes.Repeat([]byte("abcdefgh"), 512)
		for sent := 0; sent < total; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, buf := 0, make([]byte, 64<<10)
	for got < total {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		got += n
	}
	wg.Wait()
}

func TestReadAndWriteAllocateNothing(t *testing.T) {
	c, s := pair(t)
	go io.Copy(s, s)
	msg, buf := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		c.Write(msg)
		io.ReadFull(c, buf)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per round trip", allocs)
	}
}

// BenchmarkPingPong compares a round trip over loopback through the
// runtime's connection and through Conn.
func BenchmarkPingPong(b *testing.B) {
	for _, raw := range []bool{false, true} {
		name := "net.Conn"
		if raw {
			name = "sockio.Conn"
		}
		b.Run(name, func(b *testing.B) {
			c, s := pair(b)
			go io.Copy(s, s)
			var conn net.Conn = c
			if !raw {
				conn = c.Conn
			}
			msg, buf := make([]byte, 1024), make([]byte, 1024)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				conn.Write(msg)
				io.ReadFull(conn, buf)
			}
		})
	}
}

// A deadline later than the armed one is only recorded; the armed one
// fires, and the read carries on to the later deadline.
func TestLaterReadDeadlineIsHonouredNotTheEarlierOne(t *testing.T) {
	c, _ := pair(t)
	start := time.Now()
	c.SetReadDeadline(start.Add(30 * time.Millisecond))
	c.SetReadDeadline(start.Add(200 * time.Millisecond))
	_, err := c.Read(make([]byte, 4))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read error %v; want a timeout", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("read timed out after %v, before its 200ms deadline", d)
	}
}

func TestDataBeforeTheLaterDeadlineIsRead(t *testing.T) {
	c, s := pair(t)
	start := time.Now()
	c.SetReadDeadline(start.Add(20 * time.Millisecond))
	c.SetReadDeadline(start.Add(10 * time.Second))
	go func() {
		time.Sleep(100 * time.Millisecond) // after the first deadline
		s.Write([]byte("late"))
	}()
	buf := make([]byte, 4)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

func TestClearedReadDeadlineNeverFires(t *testing.T) {
	c, s := pair(t)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	c.SetReadDeadline(time.Time{})
	go func() {
		time.Sleep(100 * time.Millisecond)
		s.Write([]byte("ok"))
	}()
	buf := make([]byte, 2)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ok" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

// An earlier deadline is armed at once: setting one in the past from
// another goroutine interrupts a parked read.
func TestEarlierDeadlineInterruptsAParkedRead(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(time.Minute))
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 4))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	c.SetReadDeadline(time.Now())
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read error %v; want a timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a deadline in the past did not interrupt the read")
	}
}

func TestLaterWriteDeadlineIsHonouredNotTheEarlierOne(t *testing.T) {
	c, _ := pair(t)
	start := time.Now()
	c.SetWriteDeadline(start.Add(30 * time.Millisecond))
	c.SetWriteDeadline(start.Add(200 * time.Millisecond))
	_, err := c.Write(make([]byte, 64<<20)) // the peer never reads
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write error %v; want a timeout", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("write timed out after %v, before its 200ms deadline", d)
	}
}

// The point of the laziness: a server that moves its deadline forward on
// every request sets the connection's deadline for its first request only
// (idle, then the earlier header deadline), not per request.
func TestDeadlinesMovingForwardArmTheConnectionOnce(t *testing.T) {
	c, s := pair(t)
	go io.Copy(s, s)
	buf := make([]byte, 4)
	for range 100 {
		now := time.Now()
		c.SetReadDeadline(now.Add(time.Minute))      // idle
		c.SetReadDeadline(now.Add(10 * time.Second)) // header: earlier than idle, later than the armed one
		c.SetWriteDeadline(now.Add(10 * time.Second))
		c.Write([]byte("ping"))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	if c.rd.arms != 2 || c.wd.arms != 1 {
		t.Fatalf("read deadline armed %d times, write deadline %d; want 2 and 1", c.rd.arms, c.wd.arms)
	}
}

// The exchange: the request reaches the peer, the call returns once the
// reply is there, and one read(2) gets it (no read that finds nothing).
func TestWriteAwaitReplyReturnsWithTheReplyReadable(t *testing.T) {
	c, s := pair(t)
	go func() {
		buf := make([]byte, 7)
		io.ReadFull(s, buf)
		time.Sleep(50 * time.Millisecond)
		s.Write(append([]byte("re: "), buf...))
	}()
	start := time.Now()
	if n, err := c.WriteAwaitReply([]byte("request")); n != 7 || err != nil {
		t.Fatalf("write %d, %v", n, err)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Fatalf("returned after %v, before the reply was sent", d)
	}
	buf := make([]byte, 64)
	c.reads = 0
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "re: request" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if c.reads != 1 {
		t.Fatalf("%d read(2) calls for a reply already there; want 1", c.reads)
	}
}

func TestWriteAwaitReplyEndsAtTheReadDeadline(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := c.WriteAwaitReply([]byte("request")); n != 7 || err != nil {
		t.Fatalf("write %d, %v", n, err)
	}
	if _, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the deadline: %v; want a timeout", err)
	}
}

// A lazily armed deadline that fires before the caller's ends the wait
// early; the Read that follows still waits for the caller's deadline.
func TestWriteAwaitReplyThenReadKeepTheLaterDeadline(t *testing.T) {
	c, s := pair(t)
	start := time.Now()
	c.SetReadDeadline(start.Add(20 * time.Millisecond))
	c.SetReadDeadline(start.Add(10 * time.Second))
	go func() {
		time.Sleep(100 * time.Millisecond)
		s.Write([]byte("late"))
	}()
	if _, err := c.WriteAwaitReply([]byte("request")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

func TestWriteAwaitReplyWithAPastDeadlineStillReportsTheTimeout(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(-time.Second))
	c.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := c.WriteAwaitReply([]byte("request")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write with both deadlines past: %v; want a timeout", err)
	}
}

// A request larger than the socket buffers is written in full the usual
// way.
func TestWriteAwaitReplyLargerThanSocketBuffersWritesEverything(t *testing.T) {
	c, s := pair(t)
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(data))
		io.ReadFull(s, b)
		s.Write([]byte("ok"))
		got <- b
	}()
	if n, err := c.WriteAwaitReply(data); n != len(data) || err != nil {
		t.Fatalf("write %d of %d, %v", n, len(data), err)
	}
	if b := <-got; !bytes.Equal(b, data) {
		t.Fatal("the peer got different bytes")
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("reply %q, %v", buf, err)
	}
}

func TestWriteAwaitReplyEndsWhenThePeerCloses(t *testing.T) {
	c, s := pair(t)
	go func() {
		io.ReadFull(s, make([]byte, 7))
		s.Close()
	}()
	if _, err := c.WriteAwaitReply([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 4)); err != io.EOF {
		t.Fatalf("read after the peer closed: %v; want io.EOF", err)
	}
}

func TestCloseEndsWriteAwaitReply(t *testing.T) {
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteAwaitReply([]byte("request"))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the wait's end is the next Read's error, got %v here", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the wait")
	}
	if _, err := c.Read(make([]byte, 4)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v; want net.ErrClosed", err)
	}
}

func TestWriteAwaitReplyAllocatesNothing(t *testing.T) {
	c, s := pair(t)
	go io.Copy(s, s)
	msg, buf := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		c.WriteAwaitReply(msg)
		io.ReadFull(c, buf)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per exchange", allocs)
	}
}
