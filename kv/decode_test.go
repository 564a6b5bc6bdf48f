package kv

import (
	"encoding/hex"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
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

// Hand-encoded vectors: byte for byte what msgspec emits for vLLM's structs.
const (
	// [1.5, [["BlockStored", [1, 2^64-1], nil, [1,2,3,4], 2, nil, "GPU", nil]], 0]
	vecLegacy = `
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
	// [1.0, [stored(negative int hashes, parent 7, 5 fields),
	//        removed(bytes hash), cleared]]  -- no dp rank (older vLLM, SGLang)
	vecLegacyNoRank = `
92                              # batch: array of 2
cb 3ff0000000000000             # ts 1.0
93                              # 3 events
95 ab 426c6f636b53746f726564    # ["BlockStored", ...] trailing defaults dropped
   92 fb d3 fffffee08e04fb35    # block_hashes [-5, -1234567890123]
   07                           # parent_block_hash 7
   92 0a 0b                     # token_ids [10, 11]
   01                           # block_size 1
93 ac 426c6f636b52656d6f766564  # ["BlockRemoved", ...]
   91 c4 08 0102030405060708    # block_hashes [bytes(8)]
   a3 475055                    # medium "GPU"
91 b0 416c6c426c6f636b73436c6561726564  # ["AllBlocksCleared"]
`
	// All 12 legacy fields, a 32-byte bytes hash and a LoRA name, rank 2.
	vecLegacyFull = `
93 cb 4000000000000000 91
9c ab 426c6f636b53746f726564
   91 c4 20 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
   c0                           # parent nil
   91 05                        # token_ids [5]
   01                           # block_size 1
   c0                           # lora_id
   a3 475055                    # medium
   a7 6d792d6c6f7261            # lora_name "my-lora"
   c0                           # extra_keys
   00                           # group_idx 0
   ae 66756c6c5f617474656e74696f6e # kv_cache_spec_kind "full_attention"
   c0                           # kv_cache_spec_sliding_window
02                              # data_parallel_rank 2
`
	// {"ts": 2.0, "events": [{"type": "BlockStored", ...,"extra": {...}},
	//  {"type": "NewEvent", "data": [1,2,3]}], "data_parallel_rank": 3}
	vecMap = `
83
a2 7473 cb 4000000000000000
a6 6576656e7473 92
   86
   a4 74797065 ab 426c6f636b53746f726564
   ac 626c6f636b5f686173686573 91 05
   b1 706172656e745f626c6f636b5f68617368 c0
   a9 746f6b656e5f696473 92 01 02
   aa 626c6f636b5f73697a65 02
   a5 6578747261 81 a1 61 91 01       # unknown field, skipped
   82
   a4 74797065 a8 4e65774576656e74    # "type": "NewEvent" (unknown)
   a4 64617461 93 01 02 03
b2 646174615f706172616c6c656c5f72616e6b 03
`
)

func TestDecodeVectors(t *testing.T) {
	var d Decoder
	f := func(name, vec string, check func(b *Batch)) {
		t.Helper()
		b, err := d.Decode(hx(t, vec))
		if err != nil {
			t.Fatalf("%s: %s", name, err)
		}
		check(b)
	}
	f("legacy", vecLegacy, func(b *Batch) {
		if b.TS != 1.5 || b.DPRank != 0 || !b.HasDPRank || len(b.Events) != 1 || b.Unknown != 0 {
			t.Fatalf("legacy: batch %+v", b)
		}
		e := b.Events[0]
		if e.Kind != KindBlockStored || !slices.Equal(e.Hashes, []uint64{1, math.MaxUint64}) || e.HasParent ||
			!slices.Equal(e.Tokens, []uint32{1, 2, 3, 4}) || e.BlockSize != 2 || string(e.Medium) != "GPU" || len(e.LoraName) != 0 {
			t.Fatalf("legacy: event %+v", e)
		}
	})
	f("legacy without rank", vecLegacyNoRank, func(b *Batch) {
		if b.TS != 1 || b.HasDPRank || b.DPRank != 0 || len(b.Events) != 3 {
			t.Fatalf("no rank: batch %+v", b)
		}
		neg := int64(-1234567890123)
		s, r, c := b.Events[0], b.Events[1], b.Events[2]
		if s.Kind != KindBlockStored || !slices.Equal(s.Hashes, []uint64{uint64(math.MaxUint64 - 4), uint64(neg)}) ||
			!s.HasParent || s.Parent != 7 || !slices.Equal(s.Tokens, []uint32{10, 11}) || s.BlockSize != 1 {
			t.Fatalf("no rank: stored %+v", s)
		}
		if r.Kind != KindBlockRemoved || !slices.Equal(r.Hashes, []uint64{0x0102030405060708}) || len(r.Tokens) != 0 {
			t.Fatalf("no rank: removed %+v", r)
		}
		if c.Kind != KindAllBlocksCleared {
			t.Fatalf("no rank: cleared %+v", c)
		}
	})
	f("legacy full", vecLegacyFull, func(b *Batch) {
		raw := make([]byte, 32)
		for i := range raw {
			raw[i] = byte(i)
		}
		e := b.Events[0]
		if b.DPRank != 2 || !slices.Equal(e.Hashes, []uint64{xxh3.Hash(raw)}) || string(e.LoraName) != "my-lora" || e.GroupIdx != 0 {
			t.Fatalf("full: batch %+v event %+v", b, e)
		}
	})
	f("map", vecMap, func(b *Batch) {
		if b.TS != 2 || b.DPRank != 3 || len(b.Events) != 1 || b.Unknown != 1 {
			t.Fatalf("map: batch %+v", b)
		}
		e := b.Events[0]
		if e.Kind != KindBlockStored || !slices.Equal(e.Hashes, []uint64{5}) || e.HasParent ||
			!slices.Equal(e.Tokens, []uint32{1, 2}) || e.BlockSize != 2 {
			t.Fatalf("map: event %+v", e)
		}
	})
}

// TestEncodeMatchesVectors checks the test encoder (encode_test.go) against
// the hand-encoded bytes; engine/kvwire_test.go pins the engine publisher's
// encoder to the same bytes.
func TestEncodeMatchesVectors(t *testing.T) {
	b := appendBatchHeader(nil, false, 1.5, 1)
	b = appendStored(b, false, []uint64{1, math.MaxUint64}, 0, false, []uint32{1, 2, 3, 4}, 2)
	b = appendBatchTrailer(b, false, 0)
	if want := hx(t, vecLegacy); !slices.Equal(b, want) {
		t.Fatalf("legacy encoding\n got %x\nwant %x", b, want)
	}
	// Map layout round trip.
	var d Decoder
	m := appendBatchHeader(nil, true, 3, 3)
	m = appendStored(m, true, []uint64{9, 10}, 8, true, []uint32{1, 2, 3, 4}, 2)
	m = appendRemoved(m, true, []uint64{9})
	m = appendCleared(m, true)
	m = appendBatchTrailer(m, true, 4)
	got, err := d.Decode(m)
	if err != nil {
		t.Fatalf("map round trip: %s", err)
	}
	if got.DPRank != 4 || len(got.Events) != 3 || got.Events[0].Parent != 8 || !slices.Equal(got.Events[0].Hashes, []uint64{9, 10}) ||
		got.Events[1].Kind != KindBlockRemoved || got.Events[2].Kind != KindAllBlocksCleared {
		t.Fatalf("map round trip: %+v", got)
	}
}

func TestDecodeMalformed(t *testing.T) {
	var d Decoder
	f := func(name string, payload []byte) {
		t.Helper()
		if b, err := d.Decode(payload); err == nil || !errors.Is(err, ErrMalformed) {
			t.Fatalf("%s: Decode = %+v, %v; want ErrMalformed", name, b, err)
		}
	}
	f("empty", nil)
	f("not an array", []byte{0x01})
	f("one element", hx(t, "91 cb 3ff0000000000000"))
	f("ts not a number", hx(t, "92 a1 61 90"))
	f("events not an array", hx(t, "92 cb 3ff0000000000000 01"))
	f("huge array length", hx(t, "92 cb 3ff0000000000000 dd 7fffffff"))
	f("negative token", hx(t, "92 cb 3ff0000000000000 91 94 ab 426c6f636b53746f726564 91 01 c0 91 ff"))
	f("token too large", hx(t, "92 cb 3ff0000000000000 91 94 ab 426c6f636b53746f726564 91 01 c0 91 cf 0000000100000000"))
	f("hash is a map", hx(t, "92 cb 3ff0000000000000 91 92 ab 426c6f636b53746f726564 91 80"))
	f("trailing bytes", append(hx(t, vecLegacy), 0))
	f("invalid type byte", hx(t, "92 cb 3ff0000000000000 91 92 a1 58 c1"))
	f("deep nesting", append(hx(t, "92 cb 3ff0000000000000 91 92 a1 58"), []byte(strings.Repeat("\x91", 100)+"\x01")...))
	f("negative dp rank", hx(t, "93 cb 3ff0000000000000 90 ff"))
	// Every truncation of every vector is malformed.
	for _, v := range []string{vecLegacy, vecLegacyNoRank, vecLegacyFull, vecMap} {
		full := hx(t, v)
		for i := range full {
			f("truncated", full[:i])
		}
	}
}

func TestDecodeAllocs(t *testing.T) {
	var d Decoder
	p := hx(t, vecLegacyNoRank)
	if _, err := d.Decode(p); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(p) }); n != 0 {
		t.Fatalf("Decode allocates %.1f times per call, want 0", n)
	}
}

func FuzzDecode(f *testing.F) {
	for _, v := range []string{vecLegacy, vecLegacyNoRank, vecLegacyFull, vecMap} {
		f.Add(hx(f, v))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var d Decoder
		b, err := d.Decode(payload)
		if err != nil {
			return
		}
		for _, e := range b.Events {
			if e.Kind == KindUnknown {
				t.Fatalf("unknown event returned")
			}
		}
	})
}

// The error of a malformed batch is logged (throttled): it must not carry
// the publisher's bytes, as a map event's field name did, whole (a 1 MiB
// name made a 1 MiB log line).
func TestADecodeErrorDoesNotCarryThePublishersBytes(t *testing.T) {
	name := strings.Repeat("A", 1<<20)
	b := mpAppendArray(nil, 2)
	b = mpAppendFloat(b, 1)
	b = mpAppendArray(b, 1)
	b = mpAppendMap(b, 1)
	b = mpAppendStr(b, name)
	b = append(b, 0xc1) // an invalid type byte as its value
	var d Decoder
	_, err := d.Decode(b)
	if err == nil {
		t.Fatal("Decode accepted an invalid value")
	}
	if len(err.Error()) > 200 || strings.Contains(err.Error(), "AAAA") {
		t.Fatalf("the decode error carries the publisher's bytes (%d bytes): %.80q...", len(err.Error()), err.Error())
	}
}

// TestAHugeArrayOfSmallIntegersIsRefusedWithoutAmplifyingMemory: a hash or
// token id takes one byte of msgpack and 8 or 4 bytes decoded, so a frame
// within the socket's 64 MiB bound decoded to gigabytes: a 60 MiB
// BlockRemoved of zeros allocated 2.8 GB, held 1 GiB and took 9.6 s to
// handle. A batch of more hashes than a rank may hold is refused unread.
func TestAHugeArrayOfSmallIntegersIsRefusedWithoutAmplifyingMemory(t *testing.T) {
	n := 1<<23 + 1 // maxBatchHashes + 1
	p := appendBatchHeader(nil, false, 1, 1)
	p = mpAppendArray(p, 2)
	p = mpAppendStr(p, "BlockRemoved")
	p = append(p, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	p = append(p, make([]byte, n)...) // n fixint zeros
	p = appendBatchTrailer(p, false, 0)
	var d Decoder
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := d.Decode(p)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("a batch of %d hashes decoded: %v", n, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Fatalf("refusing a %d MiB batch allocated %d MiB", len(p)>>20, alloc>>20)
	}
	n = 1<<24 + 1 // maxBatchTokens + 1
	p = appendBatchHeader(nil, false, 1, 1)
	p = mpAppendArray(p, 4)
	p = mpAppendStr(p, "BlockStored")
	p = appendHashes(p, []uint64{1})
	p = mpAppendNil(p)
	p = append(p, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	p = append(p, make([]byte, n)...)
	p = appendBatchTrailer(p, false, 0)
	runtime.ReadMemStats(&before)
	_, err = d.Decode(p)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("a batch of %d token ids decoded: %v", n, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Fatalf("refusing a %d MiB batch allocated %d MiB", len(p)>>20, alloc>>20)
	}
}
