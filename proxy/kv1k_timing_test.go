package proxy

import (
	"strings"
	"testing"
)

// chat1K is a chat request of about 1 KB, as `infera bench proxy` sends.
func chat1K() string {
	head := `{"model":"m","max_tokens":32,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	tail := `"}]}`
	words := "Summarise the following notes about the routing of inference requests across a fleet of engines. "
	var b strings.Builder
	b.WriteString(head)
	for b.Len() < 1024-len(tail) {
		b.WriteString(words)
	}
	return b.String()[:1024-len(tail)] + tail
}

func bench1K(b *testing.B, policy string) {
	up := startUpstream(b, okHandler)
	f := defaultFlags()
	f.RouterPolicy = policy
	r := startRouter(b, f, nil, up.url)
	benchNonStreamBody(b, r.url, chat1K())
}

func BenchmarkProxy1KRoundRobin(b *testing.B) { bench1K(b, "round-robin") }
func BenchmarkProxy1KKVAware(b *testing.B)    { bench1K(b, "kv-aware") }

func BenchmarkDirect1K(b *testing.B) {
	up := startUpstream(b, okHandler)
	benchNonStreamBody(b, up.url, chat1K())
}
