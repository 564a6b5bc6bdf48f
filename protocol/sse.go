package protocol

import "bytes"

// MaxEventBytes bounds one upstream SSE event (its data) and one line: an
// engine that sends more without an event end fails the stream instead of
// growing a buffer without limit.
const MaxEventBytes = 8 << 20

var errEventTooLarge = &Error{Status: 502, Type: TypeServer, Message: "the engine sent an SSE event larger than 8 MiB"}

// sseReader splits an upstream SSE byte stream, delivered in arbitrary
// pieces, into events and hands each event's data to a callback. Only the
// data field matters for chat streams; event names, ids, retry fields and
// comments are skipped. Lines end with "\n" or "\r\n".
type sseReader struct {
	line    []byte // an incomplete line carried to the next feed
	data    []byte // the current event's data
	hasData bool
}

func (r *sseReader) reset() {
	r.line, r.data, r.hasData = reuse(r.line), reuse(r.data), false
}

// feed consumes src, calling f with the data of each complete event. f's
// argument is valid only during the call.
func (r *sseReader) feed(src []byte, f func(data []byte) error) error {
	if len(r.line) > 0 {
		nl := bytes.IndexByte(src, '\n')
		if nl < 0 {
			if len(r.line)+len(src) > MaxEventBytes {
				return errEventTooLarge
			}
			r.line = append(r.line, src...)
			return nil
		}
		r.line = append(r.line, src[:nl+1]...)
		src = src[nl+1:]
		line := r.line
		if err := r.onLine(line[:len(line)-1], f); err != nil {
			return err
		}
		r.line = r.line[:0]
	}
	for len(src) > 0 {
		nl := bytes.IndexByte(src, '\n')
		if nl < 0 {
			if len(src) > MaxEventBytes {
				return errEventTooLarge
			}
			r.line = append(r.line[:0], src...)
			return nil
		}
		if err := r.onLine(src[:nl], f); err != nil {
			return err
		}
		src = src[nl+1:]
	}
	return nil
}

func (r *sseReader) onLine(line []byte, f func(data []byte) error) error {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) == 0 {
		return r.dispatch(f)
	}
	if len(line) < 5 || string(line[:5]) != "data:" {
		return nil // event:, id:, retry:, a comment, or an unknown field
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

func (r *sseReader) dispatch(f func(data []byte) error) error {
	if !r.hasData {
		return nil
	}
	err := f(r.data)
	r.data, r.hasData = r.data[:0], false
	return err
}

// flush delivers an event left open at the end of the stream (an engine
// that does not end its last event with a blank line).
func (r *sseReader) flush(f func(data []byte) error) error {
	if len(r.line) > 0 {
		line := r.line
		r.line = r.line[:0]
		if err := r.onLine(line, f); err != nil {
			return err
		}
	}
	return r.dispatch(f)
}
