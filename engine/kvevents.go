package engine

import (
	"fmt"
)

// KVEventSink receives the simulated engine's KV cache changes, in order,
// from the goroutine that owns the cache. The publisher behind
// --kv-events-endpoint implements it (Publisher).
type KVEventSink interface {
	// BlockStored reports newly cached full blocks of one chain: their engine
	// hashes, the parent block's engine hash (hasParent false for the first
	// block of a sequence), the concatenated token ids of these blocks and the
	// block size.
	BlockStored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int)
	// BlockRemoved reports evicted blocks by engine hash.
	BlockRemoved(hashes []uint64)
	// AllCleared reports that the whole cache was dropped.
	AllCleared()
	// Close stops the publisher.
	Close() error
}

// KVEventsOptions configures the KV event publisher.
type KVEventsOptions struct {
	Endpoint       string      // ZMQ PUB bind address, e.g. tcp://*:5557
	ReplayEndpoint string      // ZMQ ROUTER bind address for replay, optional
	Layout         EventLayout // legacy or map
	Topic          string
}

// NewKVEventSink starts the KV event publisher: a ZMQ PUB socket bound at
// o.Endpoint emitting vLLM's wire format (Publisher), plus a ROUTER replay
// server at o.ReplayEndpoint when set. It is a variable so tests can swap it.
var NewKVEventSink = func(o KVEventsOptions) (KVEventSink, error) {
	p, err := NewPublisher(PublisherConfig{
		Endpoint: o.Endpoint, ReplayEndpoint: o.ReplayEndpoint, Layout: o.Layout, Topic: o.Topic,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot start KV event publisher: %w", err)
	}
	return p, nil
}
