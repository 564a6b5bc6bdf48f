package kv

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/zeebo/xxh3"
)

// EventKind is the type of one KV cache event.
type EventKind uint8

// Event kinds. KindUnknown events are counted and skipped.
const (
	KindUnknown EventKind = iota
	KindBlockStored
	KindBlockRemoved
	KindAllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one decoded KV cache event. Slices alias the Decoder's buffers
// and the payload; they are valid until the next Decode call.
type Event struct {
	Kind EventKind
	// Hashes are the engine's block hashes as opaque ids: uint64 as is,
	// negative int64 as their two's complement bits, bytes hashed with xxh3.
	Hashes []uint64
	// Parent is the parent block's engine hash (HasParent false for the
	// first block of a chain).
	Parent    uint64
	HasParent bool
	// Tokens holds the token ids of all blocks, concatenated (BlockStored).
	Tokens    []uint32
	BlockSize int
	// LoraName is the LoRA adapter name, empty for the base model.
	LoraName []byte
	// Medium is the storage tier ("GPU", "CPU", ...); empty when omitted.
	Medium []byte
	// GroupIdx is the KV cache group (hybrid models); 0 when omitted.
	GroupIdx int
}

// Batch is one decoded payload.
type Batch struct {
	TS float64
	// DPRank is the data-parallel rank (0 when the payload omits it).
	DPRank    int
	HasDPRank bool
	Events    []Event
	// Unknown counts events of unknown type that were skipped.
	Unknown int
}

// Decoder decodes payloads, reusing its buffers: Decode does not allocate
// once the buffers have grown to the largest batch seen. A Decoder is not
// safe for concurrent use.
type Decoder struct {
	r      mpReader
	batch  Batch
	hashes []uint64
	tokens []uint32
	// offsets of each event's hashes/tokens in the shared buffers.
	spans []span
}

type span struct{ h0, h1, t0, t1 int }

// maxKeptTokens bounds the token buffer a Decoder keeps between batches (4
// MiB; a batch of vLLM's holds a few thousand tokens per scheduler step).
const maxKeptTokens = 1 << 20

// maxBatchHashes and maxBatchTokens bound the block hashes and token ids
// one batch may hold (64 MiB decoded each): a hash or token id takes one
// byte of msgpack and 8 or 4 decoded, so a 60 MiB frame of small integers
// made the decoder allocate 2.8 GB and hold 1 GiB. A batch of vLLM's holds
// one scheduler step; a rank holds at most maxRankBlocks blocks.
const (
	maxBatchHashes = 1 << 23
	maxBatchTokens = 1 << 24
)

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("malformed KV event payload")

// Decode parses one msgpack payload: [ts, events, dp_rank?] or the map form
// {"ts":..., "events":..., "data_parallel_rank":...}. The returned batch is
// owned by d and valid until the next call.
func (d *Decoder) Decode(payload []byte) (*Batch, error) {
	d.r.reset(payload)
	b := &d.batch
	b.TS, b.DPRank, b.HasDPRank, b.Unknown = 0, 0, false, 0
	b.Events = b.Events[:0]
	// A huge batch (or a hostile one) must not pin its buffers for the
	// worker's lifetime: past maxKeptTokens the next batch starts afresh.
	if cap(d.tokens) > maxKeptTokens {
		d.tokens = nil
	}
	if cap(d.hashes) > maxKeptTokens/16 {
		d.hashes = nil
	}
	if cap(b.Events) > maxKeptTokens/16 {
		b.Events, d.spans = nil, nil
	}
	d.hashes, d.tokens, d.spans = d.hashes[:0], d.tokens[:0], d.spans[:0]
	if err := d.decodeBatch(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if d.r.off != len(payload) {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(payload)-d.r.off)
	}
	for i := range b.Events {
		s := d.spans[i]
		e := &b.Events[i]
		e.Hashes = d.hashes[s.h0:s.h1:s.h1]
		e.Tokens = d.tokens[s.t0:s.t1:s.t1]
	}
	return b, nil
}

func (d *Decoder) decodeBatch() error {
	r := &d.r
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMapByte(c) {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := r.str()
			if err != nil {
				return err
			}
			switch string(k) {
			case "ts":
				if d.batch.TS, err = r.float(); err != nil {
					return err
				}
			case "events":
				if err := d.decodeEvents(); err != nil {
					return err
				}
			case "data_parallel_rank":
				if err := d.decodeRank(); err != nil {
					return err
				}
			default:
				if err := r.skip(0); err != nil {
					return err
				}
			}
		}
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch has %d elements, want at least 2", n)
	}
	if d.batch.TS, err = r.float(); err != nil {
		return fmt.Errorf("ts: %w", err)
	}
	if err := d.decodeEvents(); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.decodeRank(); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) decodeRank() error {
	if d.r.isNil() {
		return nil
	}
	v, neg, err := d.r.int()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	if neg || v > math.MaxUint16 {
		return fmt.Errorf("data_parallel_rank %d out of range", int64(v))
	}
	d.batch.DPRank, d.batch.HasDPRank = int(v), true
	return nil
}

func (d *Decoder) decodeEvents() error {
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := 0; i < n; i++ {
		if err := d.decodeEvent(); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

func isMapByte(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }

func kindOf(name []byte) EventKind {
	switch string(name) {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return KindUnknown
}

func (d *Decoder) decodeEvent() error {
	r := &d.r
	c, err := r.peek()
	if err != nil {
		return err
	}
	e := Event{}
	sp := span{h0: len(d.hashes), t0: len(d.tokens)}
	if isMapByte(c) {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := r.str()
			if err != nil {
				return err
			}
			if err := d.field(&e, string(k)); err != nil {
				return fmt.Errorf("%s: %w", fieldName(k), err)
			}
		}
	} else {
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("empty event array")
		}
		name, err := r.str()
		if err != nil {
			return fmt.Errorf("event tag: %w", err)
		}
		e.Kind = kindOf(name)
		var fields []string
		switch e.Kind {
		case KindBlockStored:
			fields = storedFields
		case KindBlockRemoved:
			fields = removedFields
		}
		for i := 1; i < n; i++ {
			f := ""
			if i-1 < len(fields) {
				f = fields[i-1]
			}
			if err := d.field(&e, f); err != nil {
				return fmt.Errorf("field %d (%s): %w", i, f, err)
			}
		}
	}
	if e.Kind == KindUnknown {
		d.hashes, d.tokens = d.hashes[:sp.h0], d.tokens[:sp.t0]
		d.batch.Unknown++
		return nil
	}
	sp.h1, sp.t1 = len(d.hashes), len(d.tokens)
	d.batch.Events = append(d.batch.Events, e)
	d.spans = append(d.spans, sp)
	return nil
}

// Positional field names of the legacy array layout (after the tag).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// fieldName names map field k in an error, which is logged: a name the
// decoder knows, never the publisher's bytes.
func fieldName(k []byte) string {
	if string(k) == "type" {
		return "type"
	}
	for _, f := range storedFields { // removedFields' names are among them
		if string(k) == f {
			return f
		}
	}
	return "unknown field"
}

// field decodes the value of the named field into e; unknown names skip it.
func (d *Decoder) field(e *Event, name string) error {
	r := &d.r
	switch name {
	case "type":
		k, err := r.str()
		if err != nil {
			return err
		}
		e.Kind = kindOf(k)
	case "block_hashes":
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		if len(d.hashes)+n > maxBatchHashes {
			return fmt.Errorf("batch holds more than %d block hashes", maxBatchHashes)
		}
		for i := 0; i < n; i++ {
			h, err := d.hash()
			if err != nil {
				return err
			}
			d.hashes = append(d.hashes, h)
		}
	case "parent_block_hash":
		if r.isNil() {
			return nil
		}
		h, err := d.hash()
		if err != nil {
			return err
		}
		e.Parent, e.HasParent = h, true
	case "token_ids":
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		if len(d.tokens)+n > maxBatchTokens {
			return fmt.Errorf("batch holds more than %d token ids", maxBatchTokens)
		}
		for i := 0; i < n; i++ {
			v, neg, err := r.int()
			if err != nil {
				return err
			}
			if neg || v > math.MaxUint32 {
				return fmt.Errorf("token id %d out of range", int64(v))
			}
			d.tokens = append(d.tokens, uint32(v))
		}
	case "block_size":
		v, neg, err := r.int()
		if err != nil {
			return err
		}
		if neg || v == 0 || v > 1<<20 {
			return fmt.Errorf("block size %d out of range", int64(v))
		}
		e.BlockSize = int(v)
	case "medium", "lora_name":
		if r.isNil() {
			return nil
		}
		s, err := r.str()
		if err != nil {
			return err
		}
		if name == "medium" {
			e.Medium = s
		} else {
			e.LoraName = s
		}
	case "group_idx":
		if r.isNil() {
			return nil
		}
		v, neg, err := r.int()
		if err != nil {
			return err
		}
		if neg || v > math.MaxInt32 {
			return fmt.Errorf("group_idx %d out of range", int64(v))
		}
		e.GroupIdx = int(v)
	default:
		return r.skip(0)
	}
	return nil
}

// hash reads one engine block hash as an opaque uint64 id.
func (d *Decoder) hash() (uint64, error) {
	if d.r.isStrOrBin() {
		b, err := d.r.str()
		if err != nil {
			return 0, err
		}
		if len(b) == 8 {
			// Keep 8-byte hashes readable: same bits as the big-endian int.
			return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
				uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7]), nil
		}
		return xxh3.Hash(b), nil
	}
	v, _, err := d.r.int()
	return v, err
}

// IsGPU reports whether the event concerns the device cache (medium
// omitted or "GPU"); other tiers are not routed on.
func (e *Event) IsGPU() bool { return len(e.Medium) == 0 || bytes.EqualFold(e.Medium, []byte("GPU")) }
