package admin

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/infera/infera/internal/netpeek"
)

// connKey is the context key of a request's socket (withConn).
type connKey struct{}

// withConn is the admin server's ConnContext: it puts the socket under
// the connection (under TLS, the TCP one) in the context of the
// connection's requests, for untilClientLeaves.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return ctx
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, rc)
}

// peerCheckEvery is how often a request waiting for the import slot
// checks whether its client closed the connection (a variable: tests may
// shorten it).
var peerCheckEvery = 200 * time.Millisecond

// errLeftWaiting answers a request whose client closed its connection
// while it waited (for the import slot): nobody reads the answer, and
// the log has an INFO line (authed), not an error. 499 as on the proxy
// (a client that closed its request).
var errLeftWaiting = &httpError{status: 499, msg: "the client closed its connection while the import waited for the one running: nothing was changed"}

// untilClientLeaves returns a context of r's that also ends, with the
// cause errLeftWaiting, once r's client closed or reset its connection,
// checked every peerCheckEvery, and the function that stops the watch
// (call it when the wait is over). net/http ends r's context when the
// client leaves only once the body has been read (its background read
// then sees the close), so a request waiting before reading its body does
// not see it: the socket's TCP state tells (netpeek.PeerClosed: CLOSE_WAIT
// or CLOSE, whatever unread bytes wait ahead of the FIN; Linux only,
// elsewhere the wait ends with r's context alone). The descriptor is used
// inside RawConn.Control, never kept or duplicated: a connection closed
// meanwhile cannot have its number reused under the check.
func untilClientLeaves(r *http.Request) (context.Context, context.CancelFunc) {
	rc, ok := r.Context().Value(connKey{}).(syscall.RawConn)
	if !ok {
		return context.WithCancel(r.Context())
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	go func() {
		t := time.NewTicker(peerCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			left := false
			if rc.Control(func(fd uintptr) { left = netpeek.PeerClosed(int(fd)) }) == nil && left {
				cancel(errLeftWaiting)
				return
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}
