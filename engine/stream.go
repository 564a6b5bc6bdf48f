package engine

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// peerCheckInterval is how often a request that has nothing to write looks
// whether its client closed the connection.
const peerCheckInterval = 100 * time.Millisecond

// seq is the server side of one request in the Core.
type seq struct {
	req    Request
	notify chan struct{} // cap 1; poked by the scheduler on every event
	tokens atomic.Int32  // tokens generated so far
	done   atomic.Bool   // finished normally (stored after tokens)
	ended  atomic.Bool   // finished or aborted: the Core no longer holds req
	// everyToken asks for a poke on every token, not just the last one.
	everyToken bool
	// admitted is closed when a request with a Transfer got its blocks;
	// doneCh, when non-nil, is closed on the last token. Both exist only for
	// PD requests.
	admitted, doneCh chan struct{}
}

// storeTokens raises the token count to n (never lowers it: a transfer's
// first token and the scheduler's steps are delivered by two goroutines).
func (s *seq) storeTokens(n int32) {
	for {
		cur := s.tokens.Load()
		if n <= cur || s.tokens.CompareAndSwap(cur, n) {
			return
		}
	}
}

func newSeq() *seq {
	s := &seq{notify: make(chan struct{}, 1)}
	s.req.Tag = s
	return s
}

func (s *seq) poke() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

var errInjectedClose = errors.New("fault injection: connection closed mid-stream")

// streamLooked, when set (tests), runs in tokenStream.Read between its look
// at the sequence and what it does with what it saw.
var streamLooked func(*seq)

// tokenStream is the SSE body of a streaming response. fasthttp reads it from
// the connection's goroutine and writes each Read as one flushed chunk; a
// failed write (client gone) ends in CloseWithError, which aborts the
// sequence. It renders chunks into one reused buffer.
type tokenStream struct {
	srv  *Server
	sq   *seq
	chat bool
	head []byte // `{"id":...,"model":...,` shared by every chunk

	includeUsage bool
	// continuous: usage in every chunk (stream_options'
	// continuous_usage_stats, with include_usage).
	continuous   bool
	promptTokens int
	plan         *answerPlan // nil: filler text (answer.go)

	closeAfter int      // -1: no close-mid-stream fault
	conn       net.Conn // closed by the close-mid-stream fault

	sent    int // tokens rendered
	buf     []byte
	pending []byte
	eof     bool
	closed  bool
	idle    *time.Timer // peer-close checks before the first token
}

func (t *tokenStream) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		if t.eof {
			return 0, io.EOF
		}
		if t.closeAfter >= 0 && t.sent >= t.closeAfter {
			t.srv.abort(t.sq)
			t.closed = true
			if t.conn != nil {
				_ = t.conn.Close()
			}
			return 0, errInjectedClose
		}
		// ended first: a sequence completes by storing its count, then
		// done, then ended, so one seen ended and then not done was
		// aborted. Read after done and the count, ended took a sequence
		// that completed in between for aborted, and its stream was cut.
		ended := t.sq.ended.Load()
		done := t.sq.done.Load()
		n := int(t.sq.tokens.Load())
		if streamLooked != nil {
			streamLooked(t.sq)
		}
		if t.closeAfter >= 0 && n >= t.closeAfter {
			// The fault cuts the stream after closeAfter tokens, also when
			// the sequence finished before this writer caught up.
			n, done = t.closeAfter, false
		}
		if n > t.sent {
			t.render(n, done)
			continue
		}
		if done {
			t.render(n, true)
			continue
		}
		if ended { // and not done: aborted elsewhere (shutdown)
			return 0, errors.New("generation aborted")
		}
		if t.sent > 0 {
			// Tokens flow: a gone client shows up as a write error.
			select {
			case <-t.sq.notify:
			case <-t.srv.stop:
				t.srv.abort(t.sq)
				return 0, errors.New("engine shutting down")
			}
			continue
		}
		// Queued or prefilling: nothing is written, so look at the socket.
		if t.idle == nil {
			t.idle = time.NewTimer(peerCheckInterval)
		} else {
			t.idle.Reset(peerCheckInterval)
		}
		select {
		case <-t.sq.notify:
			t.idle.Stop()
		case <-t.idle.C:
			if t.conn != nil && peerClosed(t.conn) {
				t.srv.abort(t.sq)
				return 0, errors.New("client went away before the first token")
			}
		case <-t.srv.stop:
			t.idle.Stop()
			t.srv.abort(t.sq)
			return 0, errors.New("engine shutting down")
		}
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// render prepares the chunks of tokens t.sent..n and, when final, the
// closing chunks.
func (t *tokenStream) render(n int, final bool) {
	if t.plan != nil {
		t.renderPlanned(n, final)
		return
	}
	b := t.buf[:0]
	if t.sent == 0 && n > 0 && t.chat {
		b = append(b, "data: "...)
		b = append(b, t.head...)
		b = append(b, chatRoleChunk...)
		b = t.endChunk(b, 0)
	}
	prefix, suffix := cmplTokenPrefix, cmplTokenSuffix
	if t.chat {
		prefix, suffix = chatTokenPrefix, chatTokenSuffix
	}
	for i := t.sent; i < n; i++ {
		b = append(b, "data: "...)
		b = append(b, t.head...)
		b = append(b, prefix...)
		b = append(b, fillerWords[i%len(fillerWords)]...)
		b = append(b, suffix...)
		b = t.endChunk(b, i+1)
	}
	t.sent = n
	if final {
		b = append(b, "data: "...)
		b = append(b, t.head...)
		if t.chat {
			b = append(b, chatFinalChunk...)
		} else {
			b = append(b, cmplFinalChunk...)
		}
		b = t.endChunk(b, n)
		if t.includeUsage {
			b = append(b, "data: "...)
			b = append(b, t.head...)
			b = append(b, usagePrefix...)
			b = appendUsage(b, t.promptTokens, n, t.sq.req.CachedTokens)
			b = append(b, "}\n\n"...)
		}
		b = append(b, doneChunk...)
		t.eof = true
	}
	t.buf = b
	t.pending = b
}

// endChunk ends a chunk whose choices b ends with: with its usage after c
// tokens when continuous usage stats are on, as vLLM sends them on every
// chunk (serving_chat.py, serving_completion.py: a UsageInfo of the prompt
// tokens and the choice's tokens so far, 0 on the role chunk, in its field
// order, without details), then the event's end.
func (t *tokenStream) endChunk(b []byte, c int) []byte {
	if t.continuous {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(t.promptTokens), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(t.promptTokens+c), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(c), 10)
		b = append(b, '}')
	}
	return append(b, "}\n\n"...)
}

// CloseWithError implements fasthttp.ReadCloserWithError: fasthttp calls it
// when the response ends, with the write error if the client went away.
func (t *tokenStream) CloseWithError(err error) error {
	if t.closed {
		return nil
	}
	t.closed = true
	if t.idle != nil {
		t.idle.Stop()
	}
	if !t.sq.done.Load() {
		t.srv.abort(t.sq)
	}
	return nil
}
