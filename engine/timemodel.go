package engine

import (
	"fmt"
	"time"
)

// TimeModel turns the work of one engine step into simulated GPU time. It is a
// pure value: no clock, no state, safe to copy and to share.
//
// A step that prefills p sequences with u uncached prompt tokens in total and
// decodes one token for each of d already running sequences takes
//
//	PrefillTime(u, p) + DecodeStepTime(d)
//
// where either term is zero when its batch is empty. Every duration is
// multiplied by Slow (when > 0) and divided by Speedup (when > 0).
//
// The defaults (DefaultTimeModel) resemble a Llama-3-8B-class model in bf16 on
// one H100 under vLLM: prefill runs at roughly 12-13k tokens/s (80 µs per
// uncached token) plus a fixed 8 ms forward-pass floor and 0.25 ms per
// prefilled sequence; a decode step costs 12 ms plus 0.15 ms per running
// sequence (about 80 tokens/s for one sequence, 22 ms per step at a batch of 64).
//
// A step that both prefills and decodes costs the sum: the running
// sequences' next tokens wait for the whole prefill, as when prefill and
// decode run as separate forward passes. This is the interference that
// prefill-decode disaggregation removes: on a prefill engine every step only
// prefills, on a decode engine every step only decodes, and the KV moves
// between them in TransferTime.
type TimeModel struct {
	// PrefillBase is the floor of any step that prefills: one forward pass,
	// even when the whole prompt is cached (the last token is always computed).
	PrefillBase time.Duration
	// PrefillPerToken is the cost of each uncached prompt token.
	PrefillPerToken time.Duration
	// PrefillPerSeq is the extra cost of each sequence prefilled in the step.
	PrefillPerSeq time.Duration
	// DecodeBase is the fixed cost of a decode step (weights streamed once).
	DecodeBase time.Duration
	// DecodePerSeq is the extra cost of each sequence in a decode step
	// (attention over its KV, sampling).
	DecodePerSeq time.Duration
	// TransferBase is the fixed latency of one KV transfer between a
	// prefill and a decode engine (handshake and completion notice).
	TransferBase time.Duration
	// TransferPerBlock is the transfer time of one KV block.
	TransferPerBlock time.Duration
	// Speedup divides every duration; values <= 0 mean 1.
	Speedup float64
	// Slow multiplies every duration (fault injection); values <= 0 mean 1.
	Slow float64
}

// DefaultTimeModel returns the defaults documented on TimeModel.
func DefaultTimeModel() TimeModel {
	return TimeModel{
		PrefillBase:     8 * time.Millisecond,
		PrefillPerToken: 80 * time.Microsecond,
		PrefillPerSeq:   250 * time.Microsecond,
		DecodeBase:      12 * time.Millisecond,
		DecodePerSeq:    150 * time.Microsecond,
		// 16 tokens of an 8B model's KV (32 layers x 8 KV heads x 128 dims
		// x K and V x 2 bytes = 128 KiB per token) are 2 MiB: 42 µs at
		// 50 GB/s, one 400 Gb/s RDMA NIC.
		TransferBase:     time.Millisecond,
		TransferPerBlock: 40 * time.Microsecond,
		Speedup:          1,
	}
}

// Validate reports a model that cannot produce sensible times.
func (m TimeModel) Validate() error {
	if m.PrefillBase < 0 || m.PrefillPerToken < 0 || m.PrefillPerSeq < 0 || m.DecodeBase < 0 || m.DecodePerSeq < 0 ||
		m.TransferBase < 0 || m.TransferPerBlock < 0 {
		return fmt.Errorf("time model durations must not be negative: %+v", m)
	}
	if m.PrefillBase+m.PrefillPerSeq+m.PrefillPerToken <= 0 || m.DecodeBase+m.DecodePerSeq <= 0 {
		return fmt.Errorf("time model must give prefill and decode steps a positive duration: %+v", m)
	}
	return nil
}

func (m TimeModel) scale(d time.Duration) time.Duration {
	f := 1.0
	if m.Slow > 0 {
		f = m.Slow
	}
	if m.Speedup > 0 {
		f /= m.Speedup
	}
	if f == 1 {
		return d
	}
	v := float64(d) * f
	if v >= float64(maxScaled) {
		// A huge slow-down (--speedup 1e-300, a slow fault's factor 1e308)
		// overflowed the conversion to a negative duration: the slowest
		// engine answered at once.
		return maxScaled
	}
	return time.Duration(v)
}

// maxScaled caps a scaled duration (about 36 years), leaving room to add
// a prefill and a decode time to a clock's now without overflow.
const maxScaled = time.Duration(1 << 60)

// PrefillTime is the duration of prefilling seqs sequences holding
// uncachedTokens prompt tokens in total that are not in the prefix cache.
// It is zero when seqs <= 0.
func (m TimeModel) PrefillTime(uncachedTokens, seqs int) time.Duration {
	if seqs <= 0 {
		return 0
	}
	if uncachedTokens < 0 {
		uncachedTokens = 0
	}
	d := m.PrefillBase + time.Duration(uncachedTokens)*m.PrefillPerToken + time.Duration(seqs)*m.PrefillPerSeq
	return m.scale(d)
}

// DecodeStepTime is the duration of one decode step over batch running
// sequences, each producing one token. It is zero when batch <= 0.
func (m TimeModel) DecodeStepTime(batch int) time.Duration {
	if batch <= 0 {
		return 0
	}
	return m.scale(m.DecodeBase + time.Duration(batch)*m.DecodePerSeq)
}

// TransferTime is the duration of moving blocks KV blocks from a prefill
// engine to a decode engine: TransferBase + blocks*TransferPerBlock (only
// TransferBase when blocks <= 0: the completion notice still travels).
func (m TimeModel) TransferTime(blocks int) time.Duration {
	return m.scale(m.TransferBase + time.Duration(max(blocks, 0))*m.TransferPerBlock)
}

// StepTime is the duration of a step that prefills prefillSeqs sequences with
// uncachedTokens uncached tokens and decodes decodeSeqs sequences.
func (m TimeModel) StepTime(uncachedTokens, prefillSeqs, decodeSeqs int) time.Duration {
	return m.PrefillTime(uncachedTokens, prefillSeqs) + m.DecodeStepTime(decodeSeqs)
}
