package upstream

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Endpoint is an upstream base URL parsed once (when a config is
// compiled), so that building a request's URL is an append.
type Endpoint struct {
	// TLS is true for https.
	TLS bool
	// Addr is host:port to dial, the port defaulted from the scheme
	// (fasthttp.HostClient.Addr).
	Addr string
	// Host is the Host header: the URL's host as written.
	Host string
	// Prefix is the URL's path without its trailing slash ("" for none).
	Prefix string
}

// ParseEndpoint parses an http(s) base URL (config validation has already
// refused user info, queries and fragments; they are refused here too).
func ParseEndpoint(raw string) (Endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Endpoint{}, fmt.Errorf("cannot parse upstream URL: %w", err)
	}
	var e Endpoint
	switch u.Scheme {
	case "http":
	case "https":
		e.TLS = true
	default:
		return Endpoint{}, fmt.Errorf("upstream URL scheme %q: want http or https", u.Scheme)
	}
	if u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Endpoint{}, fmt.Errorf("upstream URL must have a host and no user info, query or fragment")
	}
	e.Host = u.Host
	port := u.Port()
	if port == "" {
		port = "80"
		if e.TLS {
			port = "443"
		}
	}
	e.Addr = net.JoinHostPort(u.Hostname(), port)
	e.Prefix = strings.TrimRight(u.EscapedPath(), "/")
	return e, nil
}

// AppendPath appends the request URI for a request path (as the client
// sent it, e.g. /v1/chat/completions): the prefix, then the path. A prefix
// ending in /v1 and a path starting with /v1/ share that segment, so an
// OpenAI-style base URL ("https://api.example.com/v1") works as well as a
// bare origin.
func (e *Endpoint) AppendPath(dst, path []byte) []byte {
	prefix := e.Prefix
	if strings.HasSuffix(prefix, "/v1") && (len(path) == 3 || len(path) > 3 && path[3] == '/') && string(path[:3]) == "/v1" {
		prefix = prefix[:len(prefix)-3]
	}
	dst = append(dst, prefix...)
	if len(path) == 0 || path[0] != '/' {
		dst = append(dst, '/')
	}
	return append(dst, path...)
}

// AppendURL appends the absolute URL of a request path.
func (e *Endpoint) AppendURL(dst, path []byte) []byte {
	if e.TLS {
		dst = append(dst, "https://"...)
	} else {
		dst = append(dst, "http://"...)
	}
	dst = append(dst, e.Host...)
	return e.AppendPath(dst, path)
}

// RootURL returns the absolute URL of a path under the gateway's root,
// not its OpenAI API (the capacity endpoint): a prefix ending in /v1, an
// OpenAI-style base URL, is taken without that segment.
func (e *Endpoint) RootURL(path string) string {
	r := *e
	r.Prefix = strings.TrimSuffix(r.Prefix, "/v1")
	return r.URL(path)
}

// URL returns the absolute URL of a request path.
func (e *Endpoint) URL(path string) string {
	return string(e.AppendURL(nil, []byte(path)))
}
