package engine

import "testing"

// BenchmarkPublisherEncode queues BlockStored events of one 16-token block
// (the engine side; no sockets) and cuts a batch every 256 events.
func BenchmarkPublisherEncode(b *testing.B) {
	p, err := newPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		b.Fatal(err)
	}
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(1000 + i*37)
	}
	hs := []uint64{0}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		hs[0] = uint64(i)
		p.BlockStored(hs, uint64(i-1), i > 0, toks, 16)
		if i%256 == 255 {
			p.takeBatch(1)
		}
	}
}
