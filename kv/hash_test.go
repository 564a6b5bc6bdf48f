package kv

import (
	"encoding/binary"
	"testing"

	"github.com/zeebo/xxh3"
)

func TestHashBlocks(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 1, 2, 3, 4, 9}
	hs := HashBlocks(nil, toks, 4, "")
	if len(hs) != 2 {
		t.Fatalf("got %d hashes for 2 full blocks and a partial one", len(hs))
	}
	// Reference: xxh3-64 over little-endian uint32s, seeded with the parent.
	le := func(ts []uint32) []byte {
		b := make([]byte, 4*len(ts))
		for i, v := range ts {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
		return b
	}
	h0 := xxh3.HashSeed(le(toks[:4]), 0)
	h1 := xxh3.HashSeed(le(toks[4:8]), h0)
	if hs[0] != h0 || hs[1] != h1 {
		t.Fatalf("hashes %x, want %x %x", hs, h0, h1)
	}
	if hs[0] == hs[1] {
		t.Fatalf("equal blocks at different positions hash the same")
	}
	lora := HashBlocks(nil, toks, 4, "adapter")
	if lora[0] == hs[0] || lora[0] != xxh3.HashSeed(le(toks[:4]), xxh3.HashString("adapter")) {
		t.Fatalf("LoRA name does not seed the chain")
	}
	if got := HashBlocks(nil, toks, 0, ""); len(got) != 0 {
		t.Fatalf("block size 0: got %d hashes", len(got))
	}
	// Continuing a chain equals hashing it in one go.
	tail := HashBlocksSeed(nil, toks[4:], 4, hs[0])
	if tail[0] != hs[1] {
		t.Fatalf("HashBlocksSeed does not continue the chain")
	}
	dst := make([]uint64, 0, 8)
	if n := testing.AllocsPerRun(100, func() { dst = HashBlocks(dst[:0], toks, 4, "x") }); n != 0 {
		t.Fatalf("HashBlocks allocates %.1f times", n)
	}
}

func TestConnectEndpoint(t *testing.T) {
	f := func(ep, addr, want string) {
		t.Helper()
		if got := connectEndpoint(ep, addr); got != want {
			t.Fatalf("connectEndpoint(%q, %q) = %q, want %q", ep, addr, got, want)
		}
	}
	f("tcp://*:5557", "10.0.0.5:8000", "tcp://10.0.0.5:5557")
	f("tcp://0.0.0.0:5557", "host:80", "tcp://host:5557")
	f("tcp://10.1.1.1:5557", "host:80", "tcp://10.1.1.1:5557")
	f("ipc:///tmp/x", "host:80", "ipc:///tmp/x")
	f("tcp://*:5557", "", "tcp://127.0.0.1:5557")
}
