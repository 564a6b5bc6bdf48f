package gateway

import (
	"encoding/json"
	"testing"
)

// Embeddings through `infera serve` to simulated engines, over both
// request transports, under the kv-aware policy (embeddings are routed by
// load): both idle engines take a share, and the survivor answers every
// request once one dies (the request fails over).
func TestE2EEmbeddingsRoundRobinAndFailover(t *testing.T) {
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) {
			s1, e1 := startEngine(t, "--speedup", "50")
			_, e2 := startEngine(t, "--speedup", "50")
			rt, r := startServe(t, append(overTransport(t, transport, e1, e2), "--router-policy", "kv-aware", "--request-max-retries", "1")...)
			waitRoutable(t, rt, 2)
			body := `{"model":"sim-model","input":["the quick brown fox","jumps over"],"encoding_format":"base64"}`
			seen := map[string]int{}
			for i := 0; i < 4; i++ {
				resp, b := doPost(t, r+"/v1/embeddings", body)
				var a struct {
					Data []struct {
						Embedding string `json:"embedding"`
					} `json:"data"`
					Usage struct {
						PromptTokens int `json:"prompt_tokens"`
					} `json:"usage"`
				}
				if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil || len(a.Data) != 2 || len(a.Data[0].Embedding) != (256*4+2)/3*4 || a.Usage.PromptTokens == 0 {
					t.Fatalf("embeddings: %d %.300s", resp.StatusCode, b)
				}
				seen[resp.Header.Get("X-Infera-Engine-Id")]++
			}
			if len(seen) != 2 || seen[""] != 0 {
				t.Fatalf("embeddings routed by load over two idle engines were served by %v", seen)
			}
			s1.Close()
			for i := 0; i < 6; i++ {
				if resp, b := doPost(t, r+"/v1/embeddings", body); resp.StatusCode != 200 {
					t.Fatalf("after an engine died, request %d: %d %s", i, resp.StatusCode, b)
				}
			}
		})
	}
}
