package kv

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// littleEndian is true when uint32 slices can be hashed in place.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// LoraSeed returns the chain seed for a LoRA adapter name ("" -> 0).
func LoraSeed(lora string) uint64 {
	if lora == "" {
		return 0
	}
	return xxh3.HashString(lora)
}

// HashBlock returns the router hash of one full block: xxh3-64 over the
// little-endian uint32 tokens, seeded with the parent's router hash (or the
// LoRA seed for the first block), so equal blocks at different positions or
// under different adapters differ.
func HashBlock(parent uint64, tokens []uint32) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, parent)
	}
	if littleEndian {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
		return xxh3.HashSeed(b, parent)
	}
	b := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], t)
	}
	return xxh3.HashSeed(b, parent)
}

// HashBlocks appends to dst the router hashes of every full block of tokens
// (a trailing partial block is not hashed). lora is the adapter name or "".
// It does not allocate when dst has room.
func HashBlocks(dst []uint64, tokens []uint32, blockSize int, lora string) []uint64 {
	return HashBlocksSeed(dst, tokens, blockSize, LoraSeed(lora))
}

// HashBlocksSeed is HashBlocks continuing a chain from parent (a previous
// block's router hash, or LoraSeed for a new chain).
func HashBlocksSeed(dst []uint64, tokens []uint32, blockSize int, parent uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	for len(tokens) >= blockSize {
		parent = HashBlock(parent, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}
