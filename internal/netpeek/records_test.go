package netpeek

import (
	"bytes"
	"testing"
)

func record(n int) []byte {
	return append([]byte{23, 3, 3, byte(n >> 8), byte(n)}, bytes.Repeat([]byte{'x'}, n)...)
}

func TestWholeRecordsCountsOnlyBytesThatEndOnARecordBoundary(t *testing.T) {
	two := append(record(200), record(180)...)
	for _, tc := range []struct {
		name string
		b    []byte
		want int
	}{
		{"nothing", nil, -1},
		{"one record", record(200), 205},
		{"two records", two, len(two)},
		{"an empty record", record(0), 5},
		{"a header cut short", record(200)[:3], -1},
		{"a fragment cut short", record(200)[:100], -1},
		{"a second record cut short", two[:len(two)-1], -1},
		{"a length no record has", record(tlsRecordMax + 1), -1},
		{"the largest record", record(tlsRecordMax), tlsRecordMax + 5},
		{"a plain response", []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"), -1},
	} {
		if got := wholeRecords(tc.b); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// wholeRecordsRef walks the records one by one, as a TLS client reads them.
func wholeRecordsRef(b []byte) int {
	rest := b
	for len(rest) > 0 {
		if len(rest) < 5 {
			return -1
		}
		n := int(rest[3])*256 + int(rest[4])
		if n > tlsRecordMax || len(rest) < 5+n {
			return -1
		}
		rest = rest[5+n:]
	}
	if len(b) == 0 {
		return -1
	}
	return len(b)
}

func FuzzWholeRecords(f *testing.F) {
	f.Add(record(3))
	f.Add(append(record(1), record(2)...))
	f.Add([]byte("HTTP/1.1 200 OK\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := wholeRecords(b), wholeRecordsRef(b); got != want {
			t.Fatalf("wholeRecords(%q) = %d, want %d", b, got, want)
		}
	})
}
