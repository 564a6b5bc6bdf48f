package engine

import (
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"testing"
)

// hx decodes a hex vector written with spaces and comments (# to line end).
func hx(t testing.TB, s string) []byte {
	t.Helper()
	var clean strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		t.Fatalf("bad hex vector: %s", err)
	}
	return b
}

// Hand-encoded vectors: byte for byte what msgspec emits for vLLM's
// KVEventBatch structs (vllm/distributed/kv_events.py); kv/decode_test.go
// decodes the same bytes.
const (
	// [1.5, [["BlockStored", [1, 2^64-1], nil, [1,2,3,4], 2, nil, "GPU", nil]], 0]
	wireLegacy = `
93                              # batch: array of 3
cb 3ff8000000000000             # ts 1.5
91                              # events: array of 1
98                              # BlockStored: 8 positional fields
ab 426c6f636b53746f726564       # "BlockStored"
92 01 cf ffffffffffffffff       # block_hashes [1, uint64 max]
c0                              # parent_block_hash nil
94 01 02 03 04                  # token_ids
02                              # block_size
c0                              # lora_id nil
a3 475055                       # medium "GPU"
c0                              # lora_name nil
00                              # data_parallel_rank 0
`
	// [1.0, [stored(parent 7), removed, cleared], 300]: legacy with a
	// multi-byte rank and every event kind.
	wireLegacyAll = `
93 cb 3ff0000000000000 93
98 ab 426c6f636b53746f726564 91 cc c8 07 92 0a 0b 01 c0 a3 475055 c0
93 ac 426c6f636b52656d6f766564 91 cc c8 a3 475055
91 b0 416c6c426c6f636b73436c6561726564
cd 012c                         # data_parallel_rank 300
`
	// {"ts": 3.0, "events": [stored, removed, cleared], "data_parallel_rank": 4}
	wireMap = `
83
a2 7473 cb 4008000000000000
a6 6576656e7473 93
   88
   a4 74797065 ab 426c6f636b53746f726564
   ac 626c6f636b5f686173686573 92 09 0a
   b1 706172656e745f626c6f636b5f68617368 08
   a9 746f6b656e5f696473 94 01 02 03 04
   aa 626c6f636b5f73697a65 02
   a7 6c6f72615f6964 c0
   a6 6d656469756d a3 475055
   a9 6c6f72615f6e616d65 c0
   83
   a4 74797065 ac 426c6f636b52656d6f766564
   ac 626c6f636b5f686173686573 91 09
   a6 6d656469756d a3 475055
   81
   a4 74797065 b0 416c6c426c6f636b73436c6561726564
b2 646174615f706172616c6c656c5f72616e6b 04
`
)

func TestWireEncodingMatchesMsgspecBytes(t *testing.T) {
	f := func(name string, got []byte, vec string) {
		t.Helper()
		if want := hx(t, vec); !slices.Equal(got, want) {
			t.Fatalf("%s encoding\n got %x\nwant %x", name, got, want)
		}
	}
	b := appendBatchHeader(nil, false, 1.5, 1)
	b = appendStored(b, false, []uint64{1, math.MaxUint64}, 0, false, []uint32{1, 2, 3, 4}, 2)
	f("legacy", appendBatchTrailer(b, false, 0), wireLegacy)

	b = appendBatchHeader(nil, false, 1, 3)
	b = appendStored(b, false, []uint64{200}, 7, true, []uint32{10, 11}, 1)
	b = appendRemoved(b, false, []uint64{200})
	b = appendCleared(b, false)
	f("legacy, all kinds", appendBatchTrailer(b, false, 300), wireLegacyAll)

	m := appendBatchHeader(nil, true, 3, 3)
	m = appendStored(m, true, []uint64{9, 10}, 8, true, []uint32{1, 2, 3, 4}, 2)
	m = appendRemoved(m, true, []uint64{9})
	m = appendCleared(m, true)
	f("map", appendBatchTrailer(m, true, 4), wireMap)
}

// The publisher batches the events queued through its KVEventSink methods
// into exactly these bytes.
func TestPublisherBatchesQueuedEvents(t *testing.T) {
	for _, layout := range []EventLayout{LayoutLegacy, LayoutMap} {
		p, err := newPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Layout: layout, DPRank: 4})
		if err != nil {
			t.Fatal(err)
		}
		if p.takeBatch(3) != nil {
			t.Fatalf("%s: empty publisher produced a batch", layout)
		}
		p.BlockStored([]uint64{9, 10}, 8, true, []uint32{1, 2, 3, 4}, 2)
		p.BlockRemoved([]uint64{9})
		p.AllCleared()
		got := p.takeBatch(3)
		isMap := layout == LayoutMap
		want := appendBatchHeader(nil, isMap, 3, 3)
		want = appendStored(want, isMap, []uint64{9, 10}, 8, true, []uint32{1, 2, 3, 4}, 2)
		want = appendRemoved(want, isMap, []uint64{9})
		want = appendCleared(want, isMap)
		want = appendBatchTrailer(want, isMap, 4)
		if !slices.Equal(got, want) {
			t.Fatalf("%s batch\n got %x\nwant %x", layout, got, want)
		}
		if isMap && !slices.Equal(got, hx(t, wireMap)) {
			t.Fatalf("map batch differs from the msgspec vector")
		}
		if p.takeBatch(4) != nil {
			t.Fatalf("%s: batch not consumed", layout)
		}
	}
}

func TestPublisherConfigRefusesBadSettings(t *testing.T) {
	if _, err := newPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Layout: "json"}); err == nil {
		t.Fatal("unknown layout accepted")
	}
	if _, err := newPublisher(PublisherConfig{}); err == nil {
		t.Fatal("empty endpoint accepted")
	}
}

// A full queue drops events, counts them and marks the next batch as lost.
func TestPublisherDropsBeyondPendingLimit(t *testing.T) {
	p, err := newPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", MaxPendingEvents: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p.BlockRemoved([]uint64{uint64(i)})
	}
	if p.Dropped() != 1 || !p.lost.Load() {
		t.Fatalf("dropped %d lost %v, want 1 true", p.Dropped(), p.lost.Load())
	}
}
