package engine

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

type embedAnswer struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (a *embedAnswer) vector(t *testing.T, i int) []float32 {
	t.Helper()
	raw := a.Data[i].Embedding
	var v []float32
	if raw[0] == '"' {
		var s string
		json.Unmarshal(raw, &s)
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b)%4 != 0 {
			t.Fatalf("base64 embedding %q: %v", s, err)
		}
		for j := 0; j < len(b); j += 4 {
			v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(b[j:])))
		}
		return v
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func embed(t *testing.T, e *testEngine, body string) *embedAnswer {
	t.Helper()
	code, b, _ := e.post(t, "/v1/embeddings", body)
	var a embedAnswer
	if code != 200 || json.Unmarshal(b, &a) != nil {
		t.Fatalf("%s: %d %s", body, code, b)
	}
	return &a
}

// The simulated engine answers /v1/embeddings in OpenAI's shape: one unit
// vector per input, in order, of the asked dimensions (256 by default),
// as floats or as base64 little-endian float32 with the same values;
// equal inputs give equal vectors, different inputs different ones; usage
// counts the input tokens.
func TestEmbeddingsAnswerInOpenAIsShape(t *testing.T) {
	e := startEngine(t, nil)
	a := embed(t, e, `{"model":"sim-model","input":["the quick brown fox","jumps over","the quick brown fox"]}`)
	if a.Object != "list" || a.Model != "sim-model" || len(a.Data) != 3 || a.Usage.PromptTokens == 0 || a.Usage.TotalTokens != a.Usage.PromptTokens {
		t.Fatalf("%+v", a)
	}
	var vs [][]float32
	for i, d := range a.Data {
		v := a.vector(t, i)
		if d.Object != "embedding" || d.Index != i || len(v) != 256 {
			t.Fatalf("item %d: %s index %d, %d dims", i, d.Object, d.Index, len(v))
		}
		var n float64
		for _, x := range v {
			n += float64(x) * float64(x)
		}
		if math.Abs(n-1) > 1e-5 {
			t.Fatalf("item %d: norm² %v", i, n)
		}
		vs = append(vs, v)
	}
	same := func(x, y []float32) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(vs[0], vs[2]) || same(vs[0], vs[1]) {
		t.Fatal("equal inputs must give equal vectors, different inputs different ones")
	}
	b64 := embed(t, e, `{"model":"sim-model","input":"the quick brown fox","encoding_format":"base64","dimensions":256}`)
	if !strings.HasPrefix(string(b64.Data[0].Embedding), `"`) || !same(b64.vector(t, 0), vs[0]) {
		t.Fatal("base64 does not carry the float vector")
	}
	small := embed(t, e, `{"model":"sim-model","input":[[1,2,3],[4]],"dimensions":8}`)
	if len(small.vector(t, 1)) != 8 || small.Usage.PromptTokens != 4 {
		t.Fatalf("token ids, 8 dimensions: %d dims, %d tokens", len(small.vector(t, 1)), small.Usage.PromptTokens)
	}
	if ids := embed(t, e, `{"model":"sim-model","input":[1,2,3]}`); len(ids.Data) != 1 || ids.Usage.PromptTokens != 3 {
		t.Fatalf("one token-id input: %+v", ids)
	}
}

func TestEmbeddingsRefuseBadRequests(t *testing.T) {
	e := startEngine(t, nil)
	for body, status := range map[string]int{
		`{"model":"sim-model"}`:                                     400,
		`{"model":"sim-model","input":""}`:                          400,
		`{"model":"sim-model","input":[]}`:                          400,
		`{"model":"sim-model","input":["a",[1]]}`:                   400,
		`{"model":"sim-model","input":[[1],[-1]]}`:                  400,
		`{"model":"sim-model","input":"a","dimensions":0}`:          400,
		`{"model":"sim-model","input":"a","dimensions":5000}`:       400,
		`{"model":"sim-model","input":"a","encoding_format":"hex"}`: 400,
		`{"model":"nope","input":"a"}`:                              404,
		`not json`:                                                  400,
	} {
		if code, b, _ := e.post(t, "/v1/embeddings", body); code != status || !strings.Contains(string(b), `"error"`) {
			t.Fatalf("%s: %d %s, want %d", body, code, b, status)
		}
	}
	if code, _ := e.get(t, "/v1/embeddings"); code != 405 {
		t.Fatalf("GET: %d", code)
	}
}
