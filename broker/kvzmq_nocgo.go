//go:build !cgo

package broker

import "fmt"

// StartKVRelay needs cgo (libzmq); this build has none.
func StartKVRelay(cfg KVRelayConfig) (*KVRelay, error) {
	return nil, fmt.Errorf("broker: the KV-event relay needs a cgo build (libzmq)")
}
