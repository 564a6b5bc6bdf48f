// Package netpeek looks at a socket without blocking and without consuming
// anything: whether bytes are waiting, or the peer closed it. The proxy uses
// it to refuse pooled upstream connections that carry unsolicited bytes and
// to notice clients that left; the mirror to skip dead keep-alive
// connections.
package netpeek

// State is what a peek found.
type State uint8

// States.
const (
	Empty  State = iota // nothing to read, still open
	Data                // bytes are waiting
	Closed              // the peer closed or reset the connection
)
