package engine

import (
	"bytes"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A stream whose sequence completes right after the stream's writer looked
// at it (nothing new, not done) ends complete. The writer then looked at
// ended, which completion sets too: the sequence seemed aborted elsewhere,
// and the stream was cut after its head or mid-body (behind a router, a
// rare "unexpected EOF" from the worker or 502 upstream_protocol_error).
func TestAStreamWhoseSequenceCompletesJustAfterItsWriterLookedEndsComplete(t *testing.T) {
	e := startEngine(t, nil)
	var exercised atomic.Bool
	streamLooked = func(sq *seq) {
		// Tokens only grow: none now means none were seen either.
		if exercised.Load() || sq.tokens.Load() != 0 || sq.done.Load() {
			return
		}
		exercised.Store(true)
		for end := time.Now().Add(10 * time.Second); !sq.ended.Load() && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}
	t.Cleanup(func() { streamLooked = nil })
	for i := 0; i < 20 && !exercised.Load(); i++ {
		resp, err := testClient.Post(e.base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"sim-model","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
			t.Fatalf("stream cut: %v: %q", err, b)
		}
	}
	if !exercised.Load() {
		t.Fatal("no stream's writer looked at its sequence before its first token")
	}
}
