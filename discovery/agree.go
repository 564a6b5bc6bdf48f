package discovery

import (
	"fmt"

	"github.com/infera/infera/fleet"
)

// Agrees reports whether a worker's record is reachable by a server using
// requestTransport (http|nats) and kvTransport (zmq|nats). An empty field in
// the record means "whatever the server uses". On false, reason says what
// disagrees; the proxy excludes the worker and logs reason once.
func Agrees(rec fleet.Record, requestTransport, kvTransport string) (ok bool, reason string) {
	if rec.RequestTransport != "" && requestTransport != "" && rec.RequestTransport != requestTransport {
		return false, fmt.Sprintf("worker %q serves requests over %s but the server uses --request-transport %s", rec.ID, rec.RequestTransport, requestTransport)
	}
	if rec.KVEventTransport != "" && kvTransport != "" && rec.KVEventTransport != kvTransport {
		return false, fmt.Sprintf("worker %q publishes KV events over %s but the server uses --kv-event-transport %s", rec.ID, rec.KVEventTransport, kvTransport)
	}
	if requestTransport == "nats" && !validSubjectToken(rec.ID) {
		return false, fmt.Sprintf("worker id %q cannot be a NATS subject token", rec.ID)
	}
	// A worker without a KV-event endpoint is still routable: it simply
	// contributes nothing to the KV index.
	return true, ""
}

// validSubjectToken mirrors broker.ValidWorkerID (kept here so discovery
// does not import the NATS code).
func validSubjectToken(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= 0x20 || c == 0x7f || c == '.' || c == '*' || c == '>' {
			return false
		}
	}
	return true
}
