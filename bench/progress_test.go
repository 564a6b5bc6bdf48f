package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProgressThrottlesAndErases(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(100, 0)
	p := newProgressTo(&buf, "simulate kv-aware", func() time.Time { return now })
	p.Update(64, 1000, "virtual", 12*time.Second, 30, 100)
	want := "\rsimulate kv-aware: 64/1000 requests (6%), virtual 12s, hit rate 0.300"
	if buf.String() != want {
		t.Fatalf("first line %q, want %q", buf.String(), want)
	}
	now = now.Add(100 * time.Millisecond)
	p.Update(128, 1000, "virtual", 20*time.Second, 30, 100)
	if buf.String() != want {
		t.Fatalf("a line within the interval was printed: %q", buf.String())
	}
	now = now.Add(time.Second)
	p.Update(1000, 1000, "virtual", 3600*time.Second, 0, 0)
	line2 := "\rsimulate kv-aware: 1000/1000 requests (100%), virtual 1h0m0s, hit rate 0.000"
	if got := strings.TrimPrefix(buf.String(), want); !strings.HasPrefix(got, line2) {
		t.Fatalf("second line %q", got)
	}
	// A shorter line is padded over the longer one; Done blanks it.
	buf.Reset()
	now = now.Add(time.Second)
	p.Update(1, 2, "elapsed", 0, 0, 0)
	if !strings.HasSuffix(buf.String(), "   ") {
		t.Fatalf("shorter line not padded: %q", buf.String())
	}
	buf.Reset()
	p.Done()
	if s := buf.String(); !strings.HasPrefix(s, "\r") || !strings.HasSuffix(s, "\r") || strings.Trim(s, "\r ") != "" {
		t.Fatalf("Done wrote %q", s)
	}
	buf.Reset()
	p.Done()
	if buf.Len() != 0 {
		t.Fatalf("second Done wrote %q", buf.String())
	}
}

// Output that is not a terminal gets no progress lines.
func TestProgressQuietWhenNotATerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Fatal("a regular file is a terminal")
	}
	p := NewProgress(f, "x")
	p.Update(1, 2, "virtual", time.Second, 1, 2)
	p.Done()
	var nilP *Progress
	nilP.Update(1, 2, "virtual", time.Second, 1, 2)
	nilP.Done()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if IsTerminal(w) {
		t.Fatal("a pipe is a terminal")
	}
	if st, _ := f.Stat(); st.Size() != 0 {
		t.Fatalf("progress written to a file: %d bytes", st.Size())
	}
}
