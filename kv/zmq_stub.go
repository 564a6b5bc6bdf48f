//go:build !cgo

package kv

import (
	"errors"
	"time"
)

// ZMQAvailable reports whether this binary was built with ZMQ support.
const ZMQAvailable = false

var errNoZMQ = errors.New("kv: built without cgo: ZMQ transport unavailable")

func (ws *workerState) runZMQ() {
	ws.logf("cannot subscribe to KV events", "err", errNoZMQ)
}

// Replay is unavailable without cgo.
func Replay(endpoint string, start uint64, timeout time.Duration, fn func(seq uint64, payload []byte)) error {
	return errNoZMQ
}
