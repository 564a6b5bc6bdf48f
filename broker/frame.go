package broker

import (
	"net/http"
	"strings"
)

// Subject prefixes (see the package doc).
const (
	ReqPrefix      = "infera.req."
	CancelPrefix   = "infera.cancel."
	KVEventsPrefix = "infera.kv.events."
)

// Framing headers (see the package doc).
const (
	HdrID     = "Infera-Id"
	HdrMethod = "Infera-Method"
	HdrPath   = "Infera-Path"
	HdrKind   = "Infera-Kind"
	HdrSeq    = "Infera-Seq"
	HdrStatus = "Infera-Status"
	HdrError  = "Infera-Error"
	HdrTopic  = "Infera-Topic"
	HdrLast   = "Infera-Last"
	HdrProbe  = "Infera-Probe"
	// HdrCloseDelimited, "1" on a head, says the engine's body ends only
	// when it closes its connection (HTTP/1.0, or neither Content-Length
	// nor chunked framing): its end looks the same as a crash, so the
	// router judges it as it does over HTTP.
	HdrCloseDelimited = "Infera-Close-Delimited"
	// HdrOpen, on the router's probe of a worker's cancel subject, lists
	// (space-separated) the request ids the router has open there; the
	// worker answers the ones it does not know in HdrUnknown.
	// HdrRound numbers the probe, and the worker's answer repeats it; the
	// answer lists the asked ids the worker has in HdrKnown.
	HdrOpen    = "Infera-Open"
	HdrRound   = "Infera-Round"
	HdrKnown   = "Infera-Known"
	HdrUnknown = "Infera-Unknown"
	// HdrReason, on an error reply with status 502, says how the engine
	// exchange failed (the Reason* values).
	HdrReason = "Infera-Reason"
	// HdrResend, "1" on a request, says the worker may write it again on
	// a fresh engine connection when a reused one closed under it (not
	// Request.Once). A request without it (a Once one, or one from a
	// router older than the worker) is written at most once.
	HdrResend = "Infera-Resend"
	// HdrInstance is a KV-event relay's instance id (see the package doc).
	HdrInstance = "Infera-Instance"

	KindHead  = "head"
	KindData  = "data"
	KindEnd   = "end"
	KindError = "error"
	// KindGone is the router's answer to a worker's data chunk or probe for
	// a request it no longer has open (it gave up on it, and its cancel
	// notice may have been lost in a broker reconnect): stop the request.
	KindGone = "gone"

	// HdrReason's values: the engine could not be connected to (nothing was
	// sent), its answer was not a usable HTTP response, or the connection
	// broke before a response head. An error reply without the header (a
	// worker older than it) is any of them.
	ReasonUnreachable = "unreachable"
	ReasonProtocol    = "protocol"
	ReasonBroken      = "broken"
)

// ReqSubject returns the request subject of worker id.
func ReqSubject(id string) string { return ReqPrefix + id }

// CancelSubject returns the cancel subject of worker id.
func CancelSubject(id string) string { return CancelPrefix + id }

// KVEventsSubject returns the KV-event subject of worker id.
func KVEventsSubject(id string) string { return KVEventsPrefix + id }

// ValidWorkerID reports whether id can be one NATS subject token.
func ValidWorkerID(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; c {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return false
		default:
			if c < 0x20 || c == 0x7f {
				return false
			}
		}
	}
	return true
}

// reserved reports whether header name k belongs to the framing.
func reserved(k string) bool {
	return len(k) >= 7 && strings.EqualFold(k[:7], "infera-")
}

// hopByHop lists headers never forwarded across the transport.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Content-Length": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
}

func skipHeader(k string) bool {
	return reserved(k) || hopByHop[http.CanonicalHeaderKey(k)]
}

// validHeaderValue reports whether v can travel as a NATS header value.
func validHeaderValue(v string) bool {
	return strings.IndexByte(v, '\r') < 0 && strings.IndexByte(v, '\n') < 0
}
