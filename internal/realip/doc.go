// Package realip finds a client's address behind trusted proxies, as
// nginx's realip module does with set_real_ip_from, real_ip_header
// X-Forwarded-For and real_ip_recursive on, and Envoy's XFF original IP
// detection with xff_trusted_cidrs: when the TCP peer is a trusted proxy,
// the client is the rightmost X-Forwarded-For address that is not itself
// trusted.
//
// It owns the set of trusted addresses (--trusted-proxies) and the
// X-Forwarded-For parser; it knows nothing of HTTP servers: callers hand
// it the peer's address and the header's field lines, as fasthttp
// ([][]byte) or net/http ([]string) keeps them. It allocates nothing per
// request.
package realip
