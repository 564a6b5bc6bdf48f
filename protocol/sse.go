package protocol

import "bytes"

// MaxEventBytes bounds one upstream SSE event (its data) and one line: an
// engine that sends more without an event end fails the stream instead of
// growing a buffer without limit.
const MaxEventBytes = 8 << 20

var errEventTooLarge = &Error{Status: 502, Type: TypeServer, Message: "the engine sent an SSE event larger than 8 MiB"}

// sseHandler takes what an sseReader reads: each event's data (valid only
// during the call), and each comment line (an engine's keep-alive).
type sseHandler interface {
	onData(data []byte) error
	onComment()
}

// sseReader splits an upstream SSE byte stream, delivered in arbitrary
// pieces, into events and hands each event's data to a handler. Only the
// data field matters for chat streams; event names, ids and retry fields
// are skipped, and a comment is only reported. Lines end with "\n",
// "\r\n" or a bare "\r", as the SSE specification allows (and the SDKs'
// parsers read).
type sseReader struct {
	line    []byte // an incomplete line carried to the next feed
	data    []byte // the current event's data
	hasData bool
	// afterCR: the last feed ended with a line's "\r"; a "\n" opening
	// the next belongs to it.
	afterCR bool
}

func (r *sseReader) reset() {
	r.line, r.data, r.hasData, r.afterCR = reuse(r.line), reuse(r.data), false, false
}

// lineEnd returns the index of the first line end in b ("\n", "\r\n" or
// a bare "\r") and its length; -1 when b holds none.
func lineEnd(b []byte) (int, int) {
	nl := bytes.IndexByte(b, '\n')
	s := b
	if nl >= 0 {
		s = b[:nl]
	}
	cr := bytes.IndexByte(s, '\r')
	switch {
	case cr < 0:
		return nl, 1
	case cr == nl-1:
		return cr, 2
	}
	return cr, 1
}

// feed consumes src, handing h the data of each complete event.
func (r *sseReader) feed(src []byte, h sseHandler) error {
	if r.afterCR && len(src) > 0 {
		r.afterCR = false
		if src[0] == '\n' {
			src = src[1:]
		}
	}
	for len(src) > 0 {
		i, n := lineEnd(src)
		if i < 0 {
			if len(r.line)+len(src) > MaxEventBytes {
				return errEventTooLarge
			}
			r.line = append(r.line, src...)
			return nil
		}
		line := src[:i]
		if len(r.line) > 0 {
			r.line = append(r.line, line...)
			line = r.line
		}
		r.afterCR = n == 1 && src[i] == '\r' && i+1 == len(src)
		src = src[i+n:]
		if err := r.onLine(line, h); err != nil {
			return err
		}
		r.line = r.line[:0]
	}
	return nil
}

func (r *sseReader) onLine(line []byte, h sseHandler) error {
	if len(line) == 0 {
		return r.dispatch(h)
	}
	if line[0] == ':' {
		h.onComment()
		return nil
	}
	if len(line) < 5 || string(line[:5]) != "data:" {
		return nil // event:, id:, retry:, or an unknown field
	}
	v := line[5:]
	if len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	if r.hasData {
		r.data = append(r.data, '\n')
	}
	if len(r.data)+len(v) > MaxEventBytes {
		return errEventTooLarge
	}
	r.data = append(r.data, v...)
	r.hasData = true
	return nil
}

func (r *sseReader) dispatch(h sseHandler) error {
	if !r.hasData {
		return nil
	}
	err := h.onData(r.data)
	r.data, r.hasData = r.data[:0], false
	return err
}

// flush delivers an event left open at the end of the stream (an engine
// that does not end its last event with a blank line).
func (r *sseReader) flush(h sseHandler) error {
	if len(r.line) > 0 {
		line := r.line
		r.line = r.line[:0]
		if err := r.onLine(line, h); err != nil {
			return err
		}
	}
	return r.dispatch(h)
}
