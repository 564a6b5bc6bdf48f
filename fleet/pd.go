package fleet

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
)

// PD is what a prefill or decode worker's record says about its part in
// disaggregation: the record's opaque bootstrap JSON, read leniently (fields
// of another type are ignored), in the shape `infera engine` advertises:
//
//	{"pd_mode":"sglang","bootstrap_host":"10.0.0.5","bootstrap_port":8998}
type PD struct {
	// Mode is bootstrap.pd_mode ("sglang", "vllm" or empty when not said).
	Mode string
	// BootstrapHost is where decode engines reach the prefill engine's KV
	// server: bootstrap.bootstrap_host, else the host of the worker's URL
	// (as SGLang's mini_lb takes the prefill URL's hostname). An IPv6
	// address is wrapped in brackets.
	BootstrapHost string
	// BootstrapPort is bootstrap.bootstrap_port; 0 when the record has none
	// (the router then sends null and the decode engine uses its own
	// --disaggregation-bootstrap-port).
	BootstrapPort int
}

// parsePD reads r's bootstrap data; the URL's host is the default host.
func parsePD(r *Record, urlHost string) PD {
	var b struct {
		Mode any `json:"pd_mode"`
		Host any `json:"bootstrap_host"`
		Port any `json:"bootstrap_port"`
	}
	var p PD
	if len(r.Bootstrap) > 0 {
		_ = json.Unmarshal(r.Bootstrap, &b) // opaque: a malformed record gives no data
	}
	if s, ok := b.Mode.(string); ok {
		p.Mode = strings.ToLower(s)
	}
	host := urlHost
	if s, ok := b.Host.(string); ok && s != "" {
		host = s
	}
	p.BootstrapHost = bracketIPv6(host)
	switch v := b.Port.(type) {
	case float64:
		if v >= 1 && v <= 65535 && v == float64(int(v)) {
			p.BootstrapPort = int(v)
		}
	case string: // tolerate "8998"
		if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 65535 {
			p.BootstrapPort = n
		}
	}
	return p
}

// bracketIPv6 wraps a bare IPv6 address in brackets (SGLang's
// maybe_wrap_ipv6_address); other hosts are returned as they are.
func bracketIPv6(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if ip := net.ParseIP(h); ip != nil && ip.To4() == nil {
		return "[" + h + "]"
	}
	return h
}

// IsPD reports whether the worker serves one phase of disaggregation.
func (w *Worker) IsPD() bool { return w.Role != RoleMixed }
