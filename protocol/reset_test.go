package protocol

import (
	"strings"
	"testing"
)

// A stream with a huge event must not pin its buffers in pooled values:
// Reset drops buffers past 256 KiB and keeps smaller ones.
func TestResetDropsHugeBuffers(t *testing.T) {
	big := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("x", 1<<20) + "\"}}]}"
	var f UsageFilter
	f.Filter(nil, []byte(big)) // held: no event end yet
	if cap(f.carry) < 1<<20 {
		t.Fatalf("carry %d bytes", cap(f.carry))
	}
	f.Reset()
	if cap(f.carry) != 0 {
		t.Fatalf("UsageFilter.Reset kept %d bytes", cap(f.carry))
	}
	f.Filter(nil, []byte("data: {\"partial"))
	keep := cap(f.carry)
	f.Reset()
	if cap(f.carry) != keep || keep == 0 {
		t.Fatalf("UsageFilter.Reset dropped a small buffer: %d -> %d", keep, cap(f.carry))
	}

	m := &Meta{API: Anthropic, Model: []byte("m")}
	c := AcquireStreamConverter(m)
	defer ReleaseStreamConverter(c)
	c.Feed(nil, []byte(big))
	if cap(c.sse.line) < 1<<20 {
		t.Fatalf("line %d bytes", cap(c.sse.line))
	}
	c.Reset(m)
	if cap(c.sse.line) != 0 || cap(c.sse.data) > maxKeptBuffer || cap(c.acc) > maxKeptBuffer {
		t.Fatalf("StreamConverter.Reset kept %d/%d/%d bytes", cap(c.sse.line), cap(c.sse.data), cap(c.acc))
	}
}
