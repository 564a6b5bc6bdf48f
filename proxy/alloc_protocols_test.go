//go:build !race

package proxy

import (
	"bytes"
	"testing"
)

// TestStreamingAndProtocolPathsZeroAlloc extends TestNonStreamZeroAlloc to
// the streaming path (a chat stream whose usage chunk the router asks for
// and filters out) and to the protocol front doors (conversion of the
// request, the answer and the stream): steady state, infera's code
// allocates nothing; the bound allows fasthttp's one allocation per
// request (see TestNonStreamZeroAlloc).
func TestStreamingAndProtocolPathsZeroAlloc(t *testing.T) {
	checks := map[string]func([]byte) bool{
		"chat":      func(b []byte) bool { return bytes.Contains(b, []byte(`"usage"`)) },
		"messages":  func(b []byte) bool { return bytes.HasPrefix(b, []byte(`{"id":"msg_`)) },
		"responses": func(b []byte) bool { return bytes.HasPrefix(b, []byte(`{"id":"resp_`)) },
		"chat-stream": func(b []byte) bool {
			return bytes.HasSuffix(b, []byte("[DONE]\n\n")) && !bytes.Contains(b, []byte(`"usage"`))
		},
		"messages-stream": func(b []byte) bool {
			return bytes.HasSuffix(b, []byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
		},
		"responses-stream": func(b []byte) bool { return bytes.Contains(b, []byte("event: response.incomplete")) }, // finish_reason length
	}
	for _, policy := range []string{"round-robin", "kv-aware"} {
		up := startUpstream(t, benchEngine)
		f := defaultFlags()
		f.RouterPolicy = policy
		r := startRouter(t, f, nil, up.url)
		for _, c := range protoCases {
			n := protoAllocs(t, r, c, func(b []byte) {
				if !checks[c.name](b) {
					t.Fatalf("%s/%s: unexpected answer %q", policy, c.name, b)
				}
			})
			t.Logf("%s/%s: %.2f allocs per request", policy, c.name, n)
			if n > 1.05 {
				t.Errorf("%s/%s: %.2f allocs per request, want at most fasthttp's 1", policy, c.name, n)
			}
		}
	}
}
