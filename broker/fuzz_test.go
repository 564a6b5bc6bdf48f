package broker

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// FuzzReplySequence: whatever a worker sends back on a request's reply
// subject (any kinds, sequence numbers, statuses, flags and data, in any
// order), the router's client never panics or hangs: Do returns a stream
// with a real HTTP status or a typed transport error, and Next ends in
// io.EOF or a typed error within the messages sent (or the idle timeout)
// and gives nothing after it. The input is a script: each message is a
// control byte (kind, whether its seq is the expected one, last flag,
// error header) followed by a status byte and up to 15 data bytes.
func FuzzReplySequence(f *testing.F) {
	wnc, cli := scriptedWorker(f, ClientConfig{IdleTimeout: 10 * time.Millisecond, MaxQueued: 8, MaxQueuedBytes: 64})
	var script atomic.Pointer[[]byte]
	kinds := []string{KindHead, KindData, KindEnd, KindError, "zzz"}
	sub, err := wnc.Subscribe(ReqSubject("w1"), func(m *nats.Msg) {
		b := *script.Load()
		for seq := 0; len(b) >= 2; seq++ {
			ctl, status := b[0], b[1]
			n := min(int(ctl>>4), len(b)-2)
			data := b[2 : 2+n]
			b = b[2+n:]
			r := nats.NewMsg(m.Reply)
			r.Header.Set(HdrKind, kinds[int(ctl&7)%len(kinds)])
			s := seq
			if ctl&8 != 0 {
				s = seq + int(status%3) - 1 // a gap, a repeat or (1 in 3) the right one
			}
			r.Header.Set(HdrSeq, strconv.Itoa(s))
			r.Header.Set(HdrStatus, strconv.Itoa(int(status)*4))
			if status&1 != 0 {
				r.Header.Set(HdrLast, "1")
			}
			if status&2 != 0 {
				r.Header.Set(HdrError, "engine said no")
			}
			r.Data = data
			wnc.PublishMsg(r)
		}
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { sub.Unsubscribe() })
	wnc.Flush()

	// head 200 (status byte 50: 50*4), two data chunks, end.
	f.Add([]byte{0x00, 50, 0x21, 0, 'h', 'i', 0x21, 0, 'y', 'o', 0x02, 0})
	f.Add([]byte{0x00, 51})                              // head with Last: the whole answer
	f.Add([]byte{0x03, 107})                             // error 428 (not 429): engine unreachable
	f.Add([]byte{0x00, 50, 0x09, 2, 0x02, 0})            // a data chunk out of order
	f.Add([]byte{0x00, 50, 0xf1, 0, 'a', 'b', 'c', 'd'}) // data past the byte bound, no end
	f.Add([]byte{0x00, 50, 0x02, 2})                     // end with an error: broke mid-way
	f.Add([]byte{0x01, 0})                               // data before the head
	f.Add([]byte{0x00, 0})                               // head with status 0
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 512 {
			return
		}
		script.Store(&b)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := cli.Do(ctx, "w1", &Request{Path: "/x"})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Do: untyped error %v", err)
			}
			return
		}
		defer s.Close()
		if st := s.Status(); st < 100 || st > 999 {
			t.Fatalf("Do: status %d", st)
		}
		for i := 0; ; i++ {
			if i > len(b)+2 {
				t.Fatalf("Next did not end after %d calls for %d scripted messages", i, len(b)/2)
			}
			_, err := s.Next()
			if err == nil {
				continue
			}
			var e *Error
			if !errors.Is(err, io.EOF) && !errors.As(err, &e) {
				t.Fatalf("Next: untyped error %v", err)
			}
			if _, again := s.Next(); again == nil {
				t.Fatal("Next gave data after it failed or ended")
			}
			return
		}
	})
}
