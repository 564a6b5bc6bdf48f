package proxy

import (
	"testing"

	"github.com/infera/infera/internal/zerotest"
)

// TestReqStateResetClearsEveryField: a request state whose every field a
// request could set is set (zerotest.Fill: also fields added later) is
// clean after Reset, so the next request taking it from the pool sees
// nothing of the last one: every field zero or its default, every buffer
// emptied (its capacity may be kept), but for the fields named below.
func TestReqStateResetClearsEveryField(t *testing.T) {
	rs := &reqState{}
	zerotest.Fill(rs,
		"lease.state",        // a held lease panics Reset (releaseState ends it first)
		"proto.conv",         // released to its pool by reset: a real converter's
		"call.cancel.target", // an interface (not filled)
	)
	rs.Reset()
	if d := zerotest.Dirty(rs,
		"start",       // set by every request before anything reads it
		"rbuf",        // the response read buffer, kept whole: written before it is read
		"usage.carry", // only its first ncarry bytes are read (usage)
		"live",        // the liveness watchdog's slot, cleared by its remove
		"accLine",     // scratch: written from its start before it is read
		"gov.rlBuf",   // the same
		"gov.gate.g",  // the server's governor, set before each use
		// Reset to their defaults, checked below.
		"parsed.maxTokens", "parsed.choices", "parsed.prompts", "proto.meta.MaxTokens",
	); len(d) > 0 {
		t.Fatalf("after Reset, left from the last request: %s", zerotest.String(d))
	}
	if p := &rs.parsed; p.maxTokens != -1 || p.choices != 1 || p.prompts != 1 || rs.proto.meta.MaxTokens != -1 {
		t.Fatalf("after Reset: max_tokens %d, choices %d, prompts %d, meta max tokens %d; want -1, 1, 1, -1",
			p.maxTokens, p.choices, p.prompts, rs.proto.meta.MaxTokens)
	}
}
