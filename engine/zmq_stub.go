//go:build !cgo

package engine

import "errors"

// ZMQAvailable reports whether this binary was built with ZMQ support.
const ZMQAvailable = false

// NewPublisher is unavailable without cgo.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	return nil, errors.New("engine: built without cgo: the ZMQ KV event publisher is unavailable")
}
