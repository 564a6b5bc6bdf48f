package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkPDBodies measures building the legs' bodies from a client body
// (one walk of its top-level members, one copy): SGLang's body for both
// legs, vLLM's prefill and decode bodies, and reading the prefill answer's
// kv_transfer_params.
func BenchmarkPDBodies(b *testing.B) {
	kvp := []byte(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2,3,4,5,6,7,8]],"remote_engine_id":"engine-p","remote_request_id":"cmpl-1","remote_host":"10.0.0.5","remote_port":5600,"tp_size":1}`)
	answer := []byte(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8},"kv_transfer_params":` + string(kvp) + `}`)
	for _, size := range []int{1 << 10, 64 << 10} {
		body := []byte(fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`,
			strings.Repeat("x", size)))
		dst := make([]byte, 0, 2*len(body))
		b.Run(fmt.Sprintf("sglang/%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				dst = appendPushBody(dst[:0], body, "", "10.0.0.5", 8998, uint64(i), 0)
			}
		})
		b.Run(fmt.Sprintf("vllm/%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				dst = appendPullPrefillBody(dst[:0], body, "")
				dst = appendPullDecodeBody(dst[:0], body, "", kvp)
			}
		})
	}
	b.Run("kv_transfer_params", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, ok, _ := kvTransferParams(answer); !ok {
				b.Fatal("no params")
			}
		}
	})
}
