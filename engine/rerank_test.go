package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

type rerankAnswer struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens *int `json:"prompt_tokens"`
		TotalTokens  int  `json:"total_tokens"`
	} `json:"usage"`
	Results []struct {
		Index    int `json:"index"`
		Document *struct {
			Text string `json:"text"`
		} `json:"document"`
		RelevanceScore float64 `json:"relevance_score"`
	} `json:"results"`
}

// /v1/rerank (and /rerank, /v2/rerank) answers Jina's and Cohere's shape as
// vLLM does: results by descending relevance, the document a result
// stands for, top_n, return_documents; a text with the query's words ranks
// above one without.
func TestRerankRanksDocumentsSharingTheQuerysWordsFirst(t *testing.T) {
	e := startEngine(t, nil)
	for _, path := range []string{"/v1/rerank", "/rerank", "/v2/rerank"} {
		code, b, _ := e.post(t, path, `{"model":"sim-model","query":"what is deep learning",
			"documents":["the cat sat on the mat",{"text":"deep learning is a kind of machine learning"},"what is deep learning"]}`)
		var a rerankAnswer
		if code != 200 || json.Unmarshal(b, &a) != nil || !strings.HasPrefix(a.ID, "rerank-") || a.Model != "sim-model" || a.Usage.TotalTokens == 0 {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		if len(a.Results) != 3 || a.Results[0].Index != 2 || a.Results[1].Index != 1 || a.Results[2].Index != 0 ||
			a.Results[1].Document == nil || a.Results[1].Document.Text != "deep learning is a kind of machine learning" {
			t.Fatalf("%s: ranking %s", path, b)
		}
		for i := 1; i < 3; i++ {
			if s := a.Results[i].RelevanceScore; s > a.Results[i-1].RelevanceScore || s < 0 || s > 1 {
				t.Fatalf("%s: scores %s", path, b)
			}
		}
	}
	// return_documents is read as vLLM reads a bool: "false" and 0 too.
	for _, v := range []string{`false`, `"false"`, `0`} {
		code, b, _ := e.post(t, "/v1/rerank", `{"model":"sim-model","query":"deep","documents":["a","deep","b"],"top_n":1,"return_documents":`+v+`}`)
		var a rerankAnswer
		if code != 200 || json.Unmarshal(b, &a) != nil || len(a.Results) != 1 || a.Results[0].Index != 1 || a.Results[0].Document != nil {
			t.Fatalf("top_n 1 without documents (%s): %d %s", v, code, b)
		}
	}
	for body, status := range map[string]int{
		`{"model":"sim-model","documents":["a"]}`:           400,
		`{"model":"sim-model","query":"q","documents":[]}`:  400,
		`{"model":"sim-model","query":"q","documents":[1]}`: 400,
		`{"model":"nope","query":"q","documents":["a"]}`:    404,
	} {
		if code, b, _ := e.post(t, "/v1/rerank", body); code != status {
			t.Fatalf("%s: %d %s", body, code, b)
		}
	}
}

// /v1/score (and /score) scores text_1 against each text of text_2, or the
// texts pairwise, as vLLM's score API does.
func TestScoreScoresPairs(t *testing.T) {
	e := startEngine(t, nil)
	var a struct {
		Object string `json:"object"`
		Data   []struct {
			Index  int     `json:"index"`
			Object string  `json:"object"`
			Score  float64 `json:"score"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	code, b, _ := e.post(t, "/score", `{"model":"sim-model","text_1":"deep learning","text_2":["deep learning","the cat"]}`)
	if code != 200 || json.Unmarshal(b, &a) != nil || a.Object != "list" || len(a.Data) != 2 || a.Data[1].Index != 1 ||
		a.Data[0].Object != "score" || a.Data[0].Score <= a.Data[1].Score || a.Usage.PromptTokens == 0 {
		t.Fatalf("one against many: %d %s", code, b)
	}
	code, b, _ = e.post(t, "/v1/score", `{"model":"sim-model","text_1":["a b","c"],"text_2":["a b","d"]}`)
	if code != 200 || json.Unmarshal(b, &a) != nil || len(a.Data) != 2 || a.Data[0].Score < 0.99 {
		t.Fatalf("pairwise: %d %s", code, b)
	}
	if code, b, _ := e.post(t, "/v1/score", `{"model":"sim-model","text_1":["a","b"],"text_2":["c","d","e"]}`); code != 400 {
		t.Fatalf("2 against 3: %d %s", code, b)
	}
}

// A rerank answer's usage holds prompt_tokens beside total_tokens, as
// vLLM's RerankUsage does: with total_tokens alone the router read no
// usage, so rerank tokens never reached infera_usage_tokens_total and a
// user's limits kept the router's estimate instead of the engine's count.
func TestRerankUsageHasPromptTokensAsVLLMs(t *testing.T) {
	e := startEngine(t, nil)
	code, b, _ := e.post(t, "/v1/rerank", `{"model":"sim-model","query":"what is this","documents":["alpha beta gamma","delta"]}`)
	var a rerankAnswer
	if code != 200 || json.Unmarshal(b, &a) != nil || a.Usage.PromptTokens == nil || *a.Usage.PromptTokens != a.Usage.TotalTokens || a.Usage.TotalTokens == 0 {
		t.Fatalf("%d %s", code, b)
	}
}
