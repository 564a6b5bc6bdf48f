package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Reranking and scoring as vLLM serves them for cross-encoder models:
// POST /v1/rerank (also /rerank, /v2/rerank: Jina's and Cohere's API) and
// POST /v1/score (also /score). A relevance score is the cosine of the two
// texts' hashed bags of tokens (embeddings.go) mapped to [0, 1]: texts with
// the same tokens score 1, texts sharing tokens more than texts sharing
// none (0.5). The answer waits the prefill time of the pairs' tokens.

type rerankRequest struct {
	Model           string            `json:"model"`
	Query           *string           `json:"query"`
	Documents       []json.RawMessage `json:"documents"`
	TopN            *int              `json:"top_n"`
	ReturnDocuments *laxBool          `json:"return_documents"`
}

type scoreRequest struct {
	Model string          `json:"model"`
	Text1 json.RawMessage `json:"text_1"`
	Text2 json.RawMessage `json:"text_2"`
}

// relevance scores two token sequences in [0, 1].
func relevance(a, b []float32, ta, tb []uint32) float64 {
	bagVector(a, ta)
	bagVector(b, tb)
	var dot float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
	}
	return math.Max(0, math.Min(1, (1+dot)/2))
}

// poolingRequest decodes a pooling request into req and returns the model
// it names (the first served model when it names none); ok is false when
// the request was answered with an error.
func (s *Server) poolingRequest(ctx *fasthttp.RequestCtx, req any, model func() string) (string, bool) {
	s.requests.Add(1)
	if err := json.Unmarshal(ctx.PostBody(), req); err != nil {
		s.badPooling(ctx, "cannot parse request body: "+err.Error())
		return "", false
	}
	m := model()
	if m == "" {
		m = s.cfg.Models[0]
	}
	if _, ok := s.models[m]; !ok {
		s.badRequests.Add(1)
		s.writeError(ctx, fasthttp.StatusNotFound, "The model `"+m+"` does not exist.", "invalid_request_error")
		return "", false
	}
	return m, true
}

func (s *Server) poolingWait(tokens, seqs int) {
	s.mu.Lock()
	tm := s.core.cfg.Time
	s.mu.Unlock()
	if d := tm.PrefillTime(tokens, seqs); d > 0 {
		time.Sleep(d)
	}
}

func (s *Server) badPooling(ctx *fasthttp.RequestCtx, msg string) {
	s.badRequests.Add(1)
	s.writeError(ctx, fasthttp.StatusBadRequest, msg, "invalid_request_error")
}

func (s *Server) handleRerank(ctx *fasthttp.RequestCtx) {
	var req rerankRequest
	model, ok := s.poolingRequest(ctx, &req, func() string { return req.Model })
	if !ok {
		return
	}
	if req.Query == nil || *req.Query == "" {
		s.badPooling(ctx, "query is required")
		return
	}
	if len(req.Documents) == 0 {
		s.badPooling(ctx, "documents is required and must not be empty")
		return
	}
	texts := make([]string, len(req.Documents))
	for i, raw := range req.Documents {
		raw = bytes.TrimSpace(raw)
		var doc struct {
			Text *string `json:"text"`
		}
		switch {
		case len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &texts[i]) == nil:
		case len(raw) > 0 && raw[0] == '{' && json.Unmarshal(raw, &doc) == nil && doc.Text != nil:
			texts[i] = *doc.Text
		default:
			s.badPooling(ctx, "documents["+strconv.Itoa(i)+"] must be a string or an object with a text")
			return
		}
	}
	q := s.tok.Encode(nil, []byte(*req.Query))
	type result struct {
		index int
		score float64
	}
	results := make([]result, len(texts))
	a, b := make([]float32, embedDimDefault), make([]float32, embedDimDefault)
	tokens := 0
	for i, t := range texts {
		d := s.tok.Encode(nil, []byte(t))
		tokens += len(q) + len(d)
		results[i] = result{i, relevance(a, b, q, d)}
	}
	s.poolingWait(tokens, len(texts))
	sort.SliceStable(results, func(i, j int) bool { return results[i].score > results[j].score })
	if n := req.TopN; n != nil && *n > 0 && *n < len(results) {
		results = results[:*n]
	}
	out := []byte(`{"id":"rerank-`)
	out = strconv.AppendUint(out, s.requests.Load(), 10)
	out = append(out, `","model":`...)
	mj, _ := json.Marshal(model)
	out = append(out, mj...)
	// vLLM's RerankUsage: prompt_tokens and total_tokens (the router
	// reconciles user limits and counts usage from prompt_tokens).
	out = append(out, `,"usage":{"prompt_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, `,"total_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, `},"results":[`...)
	for i, r := range results {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"index":`...)
		out = strconv.AppendInt(out, int64(r.index), 10)
		if req.ReturnDocuments == nil || bool(*req.ReturnDocuments) {
			tj, _ := json.Marshal(texts[r.index])
			out = append(out, `,"document":{"text":`...)
			out = append(out, tj...)
			out = append(out, '}')
		}
		out = append(out, `,"relevance_score":`...)
		out = strconv.AppendFloat(out, r.score, 'g', -1, 64)
		out = append(out, '}')
	}
	out = append(out, "]}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
}

func (s *Server) handleScore(ctx *fasthttp.RequestCtx) {
	var req scoreRequest
	model, ok := s.poolingRequest(ctx, &req, func() string { return req.Model })
	if !ok {
		return
	}
	texts := func(raw json.RawMessage) []string {
		var one string
		if json.Unmarshal(raw, &one) == nil && one != "" {
			return []string{one}
		}
		var many []string
		if json.Unmarshal(raw, &many) != nil || len(many) == 0 {
			return nil
		}
		for _, t := range many {
			if t == "" {
				return nil
			}
		}
		return many
	}
	t1, t2 := texts(req.Text1), texts(req.Text2)
	if t1 == nil || t2 == nil || len(t1) != 1 && len(t1) != len(t2) {
		s.badPooling(ctx, "text_1 and text_2 must be non-empty strings or arrays of them, text_1 with one text or as many as text_2")
		return
	}
	a, b := make([]float32, embedDimDefault), make([]float32, embedDimDefault)
	tokens := 0
	out := []byte(`{"id":"score-`)
	out = strconv.AppendUint(out, s.requests.Load(), 10)
	out = append(out, `","object":"list","model":`...)
	mj, _ := json.Marshal(model)
	out = append(out, mj...)
	out = append(out, `,"data":[`...)
	for i, t := range t2 {
		first := t1[0]
		if len(t1) > 1 {
			first = t1[i]
		}
		x, y := s.tok.Encode(nil, []byte(first)), s.tok.Encode(nil, []byte(t))
		tokens += len(x) + len(y)
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"index":`...)
		out = strconv.AppendInt(out, int64(i), 10)
		out = append(out, `,"object":"score","score":`...)
		out = strconv.AppendFloat(out, relevance(a, b, x, y), 'g', -1, 64)
		out = append(out, '}')
	}
	s.poolingWait(tokens, len(t2))
	out = append(out, `],"usage":{"prompt_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, `,"total_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, "}}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
}
