package netpeek

import (
	"crypto/tls"
	"net"
	"time"
)

// Handshake runs the TLS client handshake over c before deadline and
// returns the TLS connection (c is closed on failure). fasthttp leaves the
// handshake of a dialled connection to the request's first write, before
// any read deadline is set: a server that accepted the connection and
// never answered the handshake held the caller forever (the smart model
// selection classifier, the mirror).
func Handshake(c net.Conn, conf *tls.Config, deadline time.Time) (net.Conn, error) {
	tc := tls.Client(c, conf)
	if err := tc.SetDeadline(deadline); err != nil {
		tc.Close()
		return nil, err
	}
	if err := tc.Handshake(); err != nil {
		tc.Close()
		return nil, err
	}
	if err := tc.SetDeadline(time.Time{}); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}
