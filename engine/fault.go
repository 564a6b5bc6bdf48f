package engine

import (
	"fmt"
	"math"
	"sync/atomic"

	"encoding/json"
)

// Fault modes.
const (
	FaultNone           = "none"
	FaultError          = "error"
	FaultHang           = "hang"
	FaultCloseMidStream = "close-mid-stream"
	FaultSlow           = "slow"
	FaultHealthFail     = "health-fail"
)

// Fault is an injected misbehaviour. Error, hang and close-mid-stream apply
// per request, to a deterministic fraction Rate of requests; slow and
// health-fail apply to the whole engine while set.
type Fault struct {
	// Mode is one of none, error, hang, close-mid-stream, slow, health-fail.
	Mode string `json:"mode"`
	// Status is the HTTP status of mode error (default 500).
	Status int `json:"status,omitempty"`
	// AfterTokens is how many tokens close-mid-stream lets through before it
	// closes the connection.
	AfterTokens int `json:"after_tokens,omitempty"`
	// Factor multiplies step times in mode slow (default 2).
	Factor float64 `json:"factor,omitempty"`
	// Rate in [0,1] is the fraction of requests a per-request fault hits;
	// 0 (unset) means 1, all requests. The choice is deterministic: the n-th request after the
	// fault was set is hit when splitmix64(Seed+n) < Rate * 2^64.
	Rate float64 `json:"rate,omitempty"`
	// Seed makes the Rate choice reproducible (default 1).
	Seed uint64 `json:"seed,omitempty"`
}

// faultState is an installed fault with its own request counter.
type faultState struct {
	Fault
	n atomic.Uint64
}

// ParseFault decodes a fault from JSON, applying defaults.
func ParseFault(b []byte) (Fault, error) {
	var f Fault
	if err := json.Unmarshal(b, &f); err != nil {
		return Fault{}, fmt.Errorf("cannot parse fault JSON: %w", err)
	}
	return f.normalize()
}

func (f Fault) normalize() (Fault, error) {
	switch f.Mode {
	case "", FaultNone:
		return Fault{Mode: FaultNone, Rate: 1, Seed: 1}, nil
	case FaultError, FaultHang, FaultCloseMidStream, FaultSlow, FaultHealthFail:
	default:
		return Fault{}, fmt.Errorf("unknown fault mode %q (want none, error, hang, close-mid-stream, slow or health-fail)", f.Mode)
	}
	if f.Status == 0 {
		f.Status = 500
	}
	if f.Status < 100 || f.Status > 599 {
		return Fault{}, fmt.Errorf("fault status must be an HTTP status in [100, 599], got %d", f.Status)
	}
	if f.AfterTokens < 0 {
		return Fault{}, fmt.Errorf("fault after_tokens must not be negative, got %d", f.AfterTokens)
	}
	if f.Factor == 0 {
		f.Factor = 2
	}
	if !(f.Factor > 0) || math.IsInf(f.Factor, 0) {
		return Fault{}, fmt.Errorf("fault factor must be positive, got %v", f.Factor)
	}
	if f.Rate == 0 {
		f.Rate = 1
	}
	if !(f.Rate > 0 && f.Rate <= 1) {
		return Fault{}, fmt.Errorf("fault rate must be in [0, 1], got %v", f.Rate)
	}
	if f.Seed == 0 {
		f.Seed = 1
	}
	return f, nil
}

// hits reports whether the next request is affected by a per-request fault.
func (f *faultState) hits() bool {
	if f.Rate >= 1 {
		return true
	}
	if f.Rate <= 0 {
		return false
	}
	n := f.n.Add(1)
	return float64(splitmix64(f.Seed+n)) < f.Rate*(1<<64)
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
