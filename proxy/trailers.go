package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// dropTrailers forgets the fields of a chunked request body's trailer
// section, once the body was read. fasthttp keeps them beside the head's
// fields: Peek falls back to them for a name the head lacks and PeekAll
// appends them, so after the head was checked a client could add an
// X-Forwarded-For that a trusted proxy's did not hold (the address the
// access log and the Responses affinity take for it), an
// x-worker-instance-id or a session affinity header (its route), a mirror
// or loop header, or an Anthropic-Beta for an external upstream. Like
// nginx, the router reads and forwards none of them (RFC 9110 section
// 6.5.1 lets a recipient discard trailer fields); the engine never got
// them (appendForwardLines reads the head alone).
//
// Del removes a name from both sections, so the head's own values of a
// name the trailer also used are put back, after the Trailer announcement
// is gone (Add puts an announced name in the trailer section).
func dropTrailers(h *fasthttp.RequestHeader) {
	block := h.TrailerHeader() // "Name: value\r\n" lines, then "\r\n"
	if len(block) <= 2 {
		return
	}
	block = append([]byte(nil), block...) // h's scratch: Del and Add reuse it
	var names, kept [][]byte              // kept: name, value pairs
	for line := range bytes.SplitSeq(block, []byte("\r\n")) {
		name, _, ok := bytes.Cut(line, []byte(":"))
		if !ok || hasName(names, name) {
			continue
		}
		names = append(names, name)
		for k, v := range h.All() { // the head's fields only
			if bytes.EqualFold(k, name) {
				kept = append(kept, bytes.Clone(k), bytes.Clone(v))
			}
		}
	}
	for _, name := range names {
		h.DelBytes(name)
	}
	h.Del(fasthttp.HeaderTrailer)
	for i := 0; i+1 < len(kept); i += 2 {
		h.AddBytesKV(kept[i], kept[i+1])
	}
}

func hasName(names [][]byte, name []byte) bool {
	for _, n := range names {
		if bytes.EqualFold(n, name) {
			return true
		}
	}
	return false
}
