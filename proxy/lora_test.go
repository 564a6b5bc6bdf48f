package proxy

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/infera/infera/kv"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/tokenizer"
)

// TestAPromptForALoRAAdapterIsHashedWithTheAdaptersName: vLLM keys an
// adapter's blocks apart from the base model's, so a request for an adapter
// (a name the KV events named as lora_name) is hashed with the adapter's
// name and a request for the base model without one; both were hashed as
// the base model's (a false hit for the adapter, never a true one).
func TestAPromptForALoRAAdapterIsHashedWithTheAdaptersName(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	var mu sync.Mutex
	var loras []string
	var adapter atomic.Bool
	r := startRouterWith(t, f, nil, func(o *Options) {
		o.Sched.KV = kvroute.NewKVAware(kvroute.KVAwareConfig{Index: radix.New(), OverlapWeight: 1, BlockSize: 16})
		o.Tokenizer = tokenizer.Simple{}
		o.HashBlocks = func(dst []uint64, tokens []uint32, bs int, lora string) []uint64 {
			mu.Lock()
			loras = append(loras, lora)
			mu.Unlock()
			return kv.HashBlocks(dst, tokens, bs, lora)
		}
		o.IsLora = func(model []byte) string {
			if adapter.Load() && string(model) == "m" {
				return "m"
			}
			return ""
		}
	}, up.url)
	// The worker serves "m": first as a base model, then as an adapter
	// (once events named it).
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("the quick brown fox ", 40) + `"}]}`
	for _, isAdapter := range []bool{false, true} {
		adapter.Store(isAdapter)
		if code, b := post(t, r.url+"/v1/chat/completions", body); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(loras, []string{"", "m"}) {
		t.Fatalf("hashed with LoRA names %q, want [\"\" m]", loras)
	}
}
