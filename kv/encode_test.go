package kv

import (
	"encoding/binary"
	"math"
)

// A test encoder of vLLM's KV event batches, for building test vectors and
// benchmark inputs. The engine's publisher (engine/kvwire.go) is the
// production encoder; both are pinned to the same msgspec bytes
// (TestEncodeMatchesVectors here, TestWireEncodingMatchesMsgspecBytes there).

const (
	layoutLegacy = "legacy"
	layoutMap    = "map"
)

func appendBatchHeader(dst []byte, isMap bool, ts float64, n int) []byte {
	if isMap {
		dst = mpAppendMap(dst, 3)
		dst = mpAppendStr(dst, "ts")
		dst = mpAppendFloat(dst, ts)
		dst = mpAppendStr(dst, "events")
		return mpAppendArray(dst, n)
	}
	dst = mpAppendArray(dst, 3)
	dst = mpAppendFloat(dst, ts)
	return mpAppendArray(dst, n)
}

func appendBatchTrailer(dst []byte, isMap bool, rank int) []byte {
	if isMap {
		dst = mpAppendStr(dst, "data_parallel_rank")
	}
	return mpAppendUint(dst, uint64(rank))
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = mpAppendArray(dst, len(hs))
	for _, h := range hs {
		dst = mpAppendUint(dst, h)
	}
	return dst
}

func appendStored(dst []byte, isMap bool, hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int) []byte {
	if isMap {
		dst = mpAppendMap(dst, 8)
		dst = mpAppendStr(dst, "type")
		dst = mpAppendStr(dst, "BlockStored")
		dst = mpAppendStr(dst, "block_hashes")
		dst = appendHashes(dst, hashes)
		dst = mpAppendStr(dst, "parent_block_hash")
	} else {
		dst = mpAppendArray(dst, 8)
		dst = mpAppendStr(dst, "BlockStored")
		dst = appendHashes(dst, hashes)
	}
	if hasParent {
		dst = mpAppendUint(dst, parent)
	} else {
		dst = mpAppendNil(dst)
	}
	if isMap {
		dst = mpAppendStr(dst, "token_ids")
	}
	dst = mpAppendArray(dst, len(tokens))
	for _, t := range tokens {
		dst = mpAppendUint(dst, uint64(t))
	}
	if isMap {
		dst = mpAppendStr(dst, "block_size")
		dst = mpAppendUint(dst, uint64(blockSize))
		dst = mpAppendStr(dst, "lora_id")
		dst = mpAppendNil(dst)
		dst = mpAppendStr(dst, "medium")
		dst = mpAppendStr(dst, "GPU")
		dst = mpAppendStr(dst, "lora_name")
		return mpAppendNil(dst)
	}
	dst = mpAppendUint(dst, uint64(blockSize))
	dst = mpAppendNil(dst) // lora_id
	dst = mpAppendStr(dst, "GPU")
	return mpAppendNil(dst) // lora_name
}

func appendRemoved(dst []byte, isMap bool, hashes []uint64) []byte {
	if isMap {
		dst = mpAppendMap(dst, 3)
		dst = mpAppendStr(dst, "type")
		dst = mpAppendStr(dst, "BlockRemoved")
		dst = mpAppendStr(dst, "block_hashes")
		dst = appendHashes(dst, hashes)
		dst = mpAppendStr(dst, "medium")
		return mpAppendStr(dst, "GPU")
	}
	dst = mpAppendArray(dst, 3)
	dst = mpAppendStr(dst, "BlockRemoved")
	dst = appendHashes(dst, hashes)
	return mpAppendStr(dst, "GPU")
}

func appendCleared(dst []byte, isMap bool) []byte {
	if isMap {
		dst = mpAppendMap(dst, 1)
		dst = mpAppendStr(dst, "type")
		return mpAppendStr(dst, "AllBlocksCleared")
	}
	dst = mpAppendArray(dst, 1)
	return mpAppendStr(dst, "AllBlocksCleared")
}

// mpAppend* encode msgpack values by appending to dst.

func mpAppendArray(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	}
	return append(dst, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func mpAppendMap(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xde, byte(n>>8), byte(n))
	}
	return append(dst, 0xdf, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func mpAppendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, s...)
}

func mpAppendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(dst, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	dst = append(dst, 0xcf)
	return binary.BigEndian.AppendUint64(dst, v)
}

func mpAppendFloat(dst []byte, f float64) []byte {
	dst = append(dst, 0xcb)
	return binary.BigEndian.AppendUint64(dst, math.Float64bits(f))
}

func mpAppendNil(dst []byte) []byte { return append(dst, 0xc0) }
