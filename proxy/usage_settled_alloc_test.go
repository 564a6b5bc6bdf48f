//go:build !race

package proxy

import (
	"testing"
)

// Judging a stream's usage (usage.judge) allocates nothing, on chunks with
// the usage so far (continuous usage stats), a final usage chunk cut in
// its choices key and in its usage object, and chunks cut mid-line.
func TestJudgingAStreamsUsageDoesNotAllocate(t *testing.T) {
	stream := []byte("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	cuts := []int{30, 150, 254, 259, 275} // in a line, in the final chunk's choices value, before and in its usage
	var u usage
	n := testing.AllocsPerRun(200, func() {
		u = usage{usageState: usageState{lines: true}}
		from := 0
		for _, c := range cuts {
			u.scan(stream[from:c])
			from = c
		}
		u.scan(stream[from:])
	})
	if n != 0 {
		t.Fatalf("%v allocations per stream", n)
	}
	if !u.settled(true) || u.completion != 2 {
		t.Fatalf("not settled: %+v", u)
	}
}
