package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"syscall"
)

// DescribeError names what went wrong with a request to an upstream in a
// fixed vocabulary, for log lines: transport errors can quote bytes the
// peer sent (a malformed status line, a bad header) and raw bytes from a
// peer never reach a log line. Examples: "timeout", "dial: connection
// refused", "read: connection reset by peer", "connection closed early",
// "tls: certificate", "protocol error".
func DescribeError(err error) string {
	if err == nil {
		return ""
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "connection closed early"
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var recErr tls.RecordHeaderError
	switch {
	case errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr):
		return "tls: certificate"
	case errors.As(err, &recErr):
		return "tls: not a TLS server"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "dns: cannot resolve host"
	}
	var op *net.OpError
	var errno syscall.Errno
	if errors.As(err, &op) {
		if errors.As(err, &errno) {
			return op.Op + ": " + errno.Error()
		}
		return op.Op + ": network error"
	}
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return "protocol error"
}
