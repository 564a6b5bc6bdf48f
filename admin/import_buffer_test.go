package admin

import (
	"bytes"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// An import's body was read into one buffer of its announced length,
// made before its first byte: a client holding the key that announced
// 64 MiB and sent 10 bytes made the router hold 64 MiB (for the whole
// transfer timeout). The buffer now grows as the bytes arrive, from at
// most firstBodyBuffer (1 MiB).
func TestAnImportAnnouncingALargeBodyDoesNotReserveItBeforeItArrives(t *testing.T) {
	shortDeadlines(t, 20*time.Second, 20*time.Second)
	a, addr := listening(t)
	runtime.GC()
	var before, m runtime.MemStats
	runtime.ReadMemStats(&before)

	c := sendHead(t, addr, maxSnapshotBytes, `{"format":`)
	waitImporting(t, a)
	// The handler reaches the body's read microseconds after it takes the
	// slot; the heap is watched for a second after that.
	var grew uint64
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		runtime.ReadMemStats(&m)
		grew = max(grew, m.HeapAlloc-min(m.HeapAlloc, before.HeapAlloc))
	}
	c.Close()
	t.Logf("the heap grew by %d bytes while an import announcing %d bytes had sent 10", grew, maxSnapshotBytes)
	// Tolerance: the first buffer (1 MiB), the connection's and the
	// handler's own, and what the test process allocates meanwhile; far
	// below the 64 MiB made at once before.
	if grew > 16<<20 {
		t.Fatalf("the heap grew by %d MiB while an import announcing 64 MiB had sent 10 bytes: want at most 16 MiB", grew>>20)
	}
}

// readAnnounced returns the body whole whatever its size and however its
// reader splits it, and makes its last buffer the announced length (one
// byte more, to see the end) without making one that large first.
func TestReadAnnouncedGrowsToTheAnnouncedLength(t *testing.T) {
	f := func(size, announced int, half bool, wantCap int) {
		t.Helper()
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		var r io.Reader = bytes.NewReader(body)
		if half {
			r = iotest.HalfReader(r)
		}
		got, err := readAnnounced(r, announced)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%d bytes announced %d: %d bytes back, %v", size, announced, len(got), err)
		}
		if wantCap > 0 && cap(got) != wantCap {
			t.Fatalf("%d bytes announced %d: last buffer %d, want %d", size, announced, cap(got), wantCap)
		}
	}
	f(0, 1, false, 2)
	f(10, 10, false, 11)
	f(10, 10, true, 11)
	f(firstBodyBuffer, firstBodyBuffer, false, firstBodyBuffer+1)
	// 1 MiB, 2 MiB (doubling 1 MiB does not reach a quarter of 12 MB,
	// doubling 2 MiB does), then the length.
	f(12_000_000, 12_000_000, true, 12_000_001)
	f(8*firstBodyBuffer, 8*firstBodyBuffer, false, 8*firstBodyBuffer+1)
	f(3*firstBodyBuffer, 3*firstBodyBuffer, false, 3*firstBodyBuffer+1)
	// Fewer bytes than announced, and more.
	f(100, 5_000_000, false, firstBodyBuffer+1)
	f(3*firstBodyBuffer, 10, true, 0)

	r := io.MultiReader(strings.NewReader("{\"a\""), iotest.ErrReader(io.ErrUnexpectedEOF))
	if got, err := readAnnounced(r, 100); err != io.ErrUnexpectedEOF || string(got) != "{\"a\"" {
		t.Fatalf("a body cut short: %q, %v", got, err)
	}
}
