package protocol

import (
	"bytes"

	"github.com/infera/infera/internal/jsonscan"
)

// EnsureStreamUsage makes a streaming chat completions body ask the engine
// for usage (stream_options.include_usage: true), so the router always
// sees the token counts of a stream. clientAsked reports whether the
// client asked itself; if it did not, relay the stream through a
// UsageFilter unless the force-streaming-usage switch is on.
//
// out is body itself when nothing changes (not a stream, or the client
// asked with include_usage), else the rewritten body appended to dst (no allocation when dst
// has room for len(body)+40 bytes). The engine reads the last of duplicate
// keys, so the last stream, stream_options and include_usage count and the
// last one is the one rewritten; their values are read as vLLM reads a
// bool (jsonscan.LaxBool: "true", 1 and "yes" are true). As in vLLM's
// StreamOptions, include_usage defaults to true: "stream_options":{} asks
// for usage, {"include_usage":null} does not. A body that is not a JSON
// object is returned unchanged with an *Error.
func EnsureStreamUsage(dst, body []byte) (out []byte, clientAsked bool, err error) {
	return EnsureStreamUsageForced(dst, body, false)
}

// EnsureStreamUsageForced is EnsureStreamUsage for a router that relays
// the usage to every client when forced (force_stream_usage), as vLLM's
// --enable-force-include-usage does: its should_include_usage takes
// include_usage as the client's or forced, and continuous usage as
// include_usage and the client's continuous_usage_stats, so a forced
// client that set continuous_usage_stats gets usage in every chunk even
// with include_usage false; forced, they are left as the client sent them.
func EnsureStreamUsageForced(dst, body []byte, forced bool) (out []byte, clientAsked bool, err error) {
	start := skipSpace(body, 0)
	if start >= len(body) || body[start] != '{' {
		return body, false, errNotObject
	}
	var stream, opts span
	end, werr := walkObject(body, start, 0, func(k []byte, s, e int) error {
		switch string(k) {
		case "stream":
			stream = span{s, e}
		case "stream_options":
			opts = span{s, e}
		}
		return nil
	})
	if werr != nil || skipSpace(body, end) != len(body) {
		return body, false, errMalformedBody
	}
	if !stream.ok() || jsonscan.LaxBool(body[stream.s:stream.e]) != 't' {
		return body, false, nil
	}
	if !opts.ok() {
		return InsertStreamUsage(dst, body, start), false, nil
	}
	switch body[opts.s] {
	case 'n': // null
		out = append(dst, body[:opts.s]...)
		out = append(out, `{"include_usage":true}`...)
		return append(out, body[opts.e:]...), false, nil
	case '{':
	default:
		return body, false, nil // the engine refuses it as it would have
	}
	o := body[opts.s:opts.e]
	var inc, cont span
	fields(o, func(k []byte, s, e int) error {
		switch string(k) {
		case "include_usage":
			inc = span{opts.s + s, opts.s + e}
		case "continuous_usage_stats":
			cont = span{opts.s + s, opts.s + e}
		}
		return nil
	})
	// vLLM's StreamOptions has include_usage: Optional[bool] = True: an
	// object without it asks for usage, one with null (None) does not.
	// Without it, include_usage: true is written in first all the same,
	// so that an engine with another default (SGLang's is false) reports
	// the usage the router counts, and the client gets it as from vLLM.
	if !inc.ok() {
		with := `"include_usage":true,`
		if j := skipSpace(body, opts.s+1); body[j] == '}' {
			with = with[:len(with)-1]
		}
		out = append(dst, body[:opts.s+1]...)
		out = append(out, with...)
		return append(out, body[opts.s+1:]...), true, nil
	}
	switch v := body[inc.s:inc.e]; jsonscan.LaxBool(v) {
	case 't':
		return body, true, nil
	case 0:
		if string(v) != "null" {
			return body, false, nil // the engine refuses it as it would have
		}
	}
	// The edit that asks for usage: include_usage set to true.
	at, cut, with := inc.s, inc.e, "true"
	// vLLM sends continuous usage stats (usage in every chunk) only with
	// include_usage: a client that asked for them without it gets no
	// usage, so they are turned off with the usage the router asks for
	// (the usage filter removes only the final usage-only chunk). Forced,
	// the client gets usage, and them with it.
	if forced || !cont.ok() || jsonscan.LaxBool(body[cont.s:cont.e]) != 't' {
		cont = span{}
	}
	out = dst
	if cont.ok() && cont.s < at {
		out = append(out, body[:cont.s]...)
		out = append(out, "false"...)
		out = append(out, body[cont.e:at]...)
	} else {
		out = append(out, body[:at]...)
	}
	out = append(out, with...)
	if cont.ok() && cont.s > at {
		out = append(out, body[cut:cont.s]...)
		out = append(out, "false"...)
		cut = cont.e
	}
	return append(out, body[cut:]...), false, nil
}

// InsertStreamUsage appends body to dst with stream_options asking for
// usage inserted as the first member of the object whose '{' is body[start]
// (what EnsureStreamUsage writes for a stream with no stream_options). The
// object must have a member: a stream request has "stream".
func InsertStreamUsage(dst, body []byte, start int) []byte {
	out := append(dst, body[:start+1]...)
	out = append(out, `"stream_options":{"include_usage":true},`...)
	return append(out, body[start+1:]...)
}

// UsageFilter relays a chat completions SSE stream minus its usage-only
// chunk (the {"choices":[],"usage":{...}} event an engine sends last when
// asked for usage), for clients that did not ask for it. The usage it
// removes is kept in Usage. Bytes are relayed as they came, except that an
// event split across reads is held until its end arrives. Reuse with
// Reset; the zero value is ready. Not safe for concurrent use.
type UsageFilter struct {
	// Usage is the usage of the removed chunk.
	Usage   Usage
	carry   []byte // the incomplete event at the end of the last feed
	scanned int    // carry bytes already searched for an event end
	scratch []byte
}

// Reset clears f for another stream, keeping its buffers (up to 256 KiB
// each: a huge event's buffer is dropped).
func (f *UsageFilter) Reset() {
	carry, scratch := reuse(f.carry), reuse(f.scratch)
	*f = UsageFilter{} // in place (a literal naming the buffers is copied over f)
	f.carry, f.scratch = carry, scratch
}

var keyUsage = []byte(`"usage"`)

// Filter appends the bytes of src that the client should get to dst.
// Steady state (each read holding whole events with no usage key): one
// copy, no allocation.
func (f *UsageFilter) Filter(dst, src []byte) []byte {
	if len(f.carry) == 0 {
		end := lastEventEnd(src)
		dst = f.events(dst, src[:end])
		if end < len(src) {
			f.carry = append(f.carry, src[end:]...)
			f.scanned = 0
		}
		return dst
	}
	f.carry = append(f.carry, src...)
	end := lastEventEnd(f.carry[f.scanned:])
	if end == 0 {
		// no event end yet; search only new bytes next time (minus 2 for
		// an end straddling the boundary)
		if f.scanned = len(f.carry) - 2; f.scanned < 0 {
			f.scanned = 0
		}
		if len(f.carry) > MaxEventBytes {
			// Not an SSE stream we can frame: relay as is.
			dst = append(dst, f.carry...)
			f.carry, f.scanned = f.carry[:0], 0
		}
		return dst
	}
	end += f.scanned
	dst = f.events(dst, f.carry[:end])
	n := copy(f.carry, f.carry[end:])
	f.carry, f.scanned = f.carry[:n], 0
	return dst
}

// Held returns the incomplete event the filter holds back (Flush sends
// it): valid until the next Filter, Flush or Reset.
func (f *UsageFilter) Held() []byte { return f.carry }

// Flush appends what is held back at the end of the stream.
func (f *UsageFilter) Flush(dst []byte) []byte {
	dst = f.event(dst, f.carry)
	f.carry, f.scanned = f.carry[:0], 0
	return dst
}

// events relays the whole events in b, dropping usage-only ones. Only an
// event holding the usage key is looked at; the events before it are copied
// as they are. (Its start is found backwards, so blank lines before it go
// with the copied bytes rather than with the event: relayed either way.)
func (f *UsageFilter) events(dst, b []byte) []byte {
	for len(b) > 0 {
		i := jsonscan.IndexKey(b, keyUsage)
		if i < 0 {
			return append(dst, b...)
		}
		s := lastEventEnd(b[:i])
		dst = append(dst, b[:s]...)
		b = b[s:]
		n := nextEventEnd(b)
		if n == 0 {
			n = len(b)
		}
		if ev := b[:n]; f.usageOnly(ev) {
			dst = append(dst, ev[:strayBreaks(ev)]...)
		} else {
			dst = append(dst, ev...)
		}
		b = b[n:]
	}
	return dst
}

// event relays one SSE event, or, when it is a usage-only chunk, only the
// blank lines that open it (see strayBreaks).
func (f *UsageFilter) event(dst, ev []byte) []byte {
	if jsonscan.IndexKey(ev, keyUsage) < 0 || !f.usageOnly(ev) {
		return append(dst, ev...)
	}
	return append(dst, ev[:strayBreaks(ev)]...)
}

// strayBreaks returns the length of the blank lines that open ev (the
// longest run of CR and LF). An extra blank line between two
// events belongs to neither: whether it was framed as the end of one read
// or the start of the next event depends on where reads split the stream,
// so it is relayed even when its event is dropped, and the client gets the
// same bytes for any split.
func strayBreaks(ev []byte) int {
	n := 0
	for n < len(ev) && (ev[n] == '\n' || ev[n] == '\r') {
		n++
	}
	return n
}

// usageOnly reports whether the SSE event ev is a chat chunk with no
// choices (empty, null or absent) and a usage object, recording the usage.
func (f *UsageFilter) usageOnly(ev []byte) bool {
	d := f.scratch[:0]
	n := 0
	for len(ev) > 0 {
		line := ev
		if i, n := lineEnd(ev); i >= 0 {
			line, ev = ev[:i], ev[i+n:]
		} else {
			ev = nil
		}
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if n > 0 {
				d = append(d, '\n')
			}
			n++
			d = append(d, bytes.TrimPrefix(v, []byte{' '})...)
		}
	}
	f.scratch = d
	i := skipSpace(d, 0)
	if i >= len(d) || d[i] != '{' {
		return false
	}
	// No choices: an empty array as vLLM, SGLang and llama.cpp send, or
	// null, or none at all (the OpenAI SDK's stream helper throws on the
	// last two, and the client did not ask for the chunk).
	emptyChoices, usage := true, []byte(nil)
	end, err := walkObject(d, i, 0, func(k []byte, s, e int) error {
		switch string(k) {
		case "choices":
			v := d[s:e]
			emptyChoices = v[0] == 'n' || v[0] == '[' && skipSpace(v, 1) == len(v)-1
		case "usage":
			usage = d[s:e]
		}
		return nil
	})
	if err != nil || skipSpace(d, end) != len(d) || !emptyChoices || usage == nil || usage[0] != '{' {
		return false
	}
	f.Usage.read(usage)
	return true
}

// lastEventEnd returns the index after the last event end (a blank line:
// "\n\n", "\n\r\n", or "\r\r" in a stream whose lines end in a bare CR) in
// b, 0 when there is none.
func lastEventEnd(b []byte) int {
	end := 0
	for j := len(b); j > 0; {
		i := bytes.LastIndexByte(b[:j], '\n')
		if i < 1 {
			break
		}
		if b[i-1] == '\n' || (b[i-1] == '\r' && i >= 2 && b[i-2] == '\n') {
			end = i + 1
			break
		}
		j = i
	}
	for j := len(b); j > end+1; { // a bare CR end after it
		i := bytes.LastIndexByte(b[end:j], '\r') + end
		if i < end+1 {
			break
		}
		if b[i-1] == '\r' {
			return i + 1
		}
		j = i
	}
	return end
}

// nextEventEnd returns the index after the first event end in b, 0 when
// there is none.
func nextEventEnd(b []byte) int {
	end := 0
	for off := 0; ; {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			break
		}
		i += off
		if i+1 < len(b) && b[i+1] == '\n' {
			end = i + 2
			break
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			end = i + 3
			break
		}
		off = i + 1
	}
	lim := len(b)
	if end > 0 {
		lim = end
	}
	for off := 0; ; { // a bare CR end before it
		i := bytes.IndexByte(b[off:lim], '\r')
		if i < 0 {
			return end
		}
		i += off
		if i+1 < lim && b[i+1] == '\r' {
			return i + 2
		}
		off = i + 1
	}
}

// AnthropicInput is the input of an Anthropic Messages answer in the three
// counts its usage objects carry, indexed by AnthropicInputTokens,
// AnthropicCacheCreation and AnthropicCacheRead. A reader of the answer
// sets each count a usage object holds and leaves one that is absent or
// null as an earlier object set it, as Anthropic's SDKs accumulate a
// stream (anthropic-sdk-python, lib/streaming/_messages.py
// accumulate_event): message_start carries all three, message_delta its
// cumulative counts or null (MessageDeltaUsage documents them nullable).
// Total is the answer's input tokens.
type AnthropicInput [3]int

// The counts of AnthropicInput.
const (
	// AnthropicInputTokens: input_tokens, the input neither read from nor
	// written to the prompt cache.
	AnthropicInputTokens = iota
	// AnthropicCacheCreation: cache_creation_input_tokens, computed and
	// written to the cache.
	AnthropicCacheCreation
	// AnthropicCacheRead: cache_read_input_tokens, read from the cache.
	AnthropicCacheRead
)

// Total is the answer's input tokens: Anthropic counts the tokens written
// to and read from its prompt cache apart from input_tokens, so its total
// input is the sum of the three (prompt caching guide, "Tracking cache
// performance").
func (in *AnthropicInput) Total() int {
	return in[AnthropicInputTokens] + in[AnthropicCacheCreation] + in[AnthropicCacheRead]
}
