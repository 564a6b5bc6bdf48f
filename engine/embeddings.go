package engine

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"

	"github.com/valyala/fasthttp"
)

// The simulated engine serves OpenAI's embeddings endpoint as vLLM's
// pooling models do: POST /v1/embeddings with input as a string, an array
// of strings, an array of token ids or an array of such arrays, optional
// dimensions and encoding_format ("float", the default, or "base64":
// little-endian float32, standard base64, as OpenAI sends it). Vectors are
// deterministic (feature hashing of the input's tokens and their
// positions, L2-normalised), so equal inputs give equal vectors; the
// answer waits the prefill time of the input tokens under the time model.

const (
	embedDimDefault = 256
	embedDimMax     = 4096
	embedMaxInputs  = 2048
)

type embedRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     *int            `json:"dimensions"`
	EncodingFormat *string         `json:"encoding_format"`
}

func (s *Server) handleEmbeddings(ctx *fasthttp.RequestCtx) {
	var req embedRequest
	model, ok := s.poolingRequest(ctx, &req, func() string { return req.Model }) // rerank.go
	if !ok {
		return
	}
	dim := embedDimDefault
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > embedDimMax {
			s.badRequests.Add(1)
			s.writeError(ctx, fasthttp.StatusBadRequest, "dimensions must be between 1 and "+strconv.Itoa(embedDimMax), "invalid_request_error")
			return
		}
		dim = *req.Dimensions
	}
	b64 := false
	if f := req.EncodingFormat; f != nil {
		switch *f {
		case "float":
		case "base64":
			b64 = true
		default:
			s.badRequests.Add(1)
			s.writeError(ctx, fasthttp.StatusBadRequest, "encoding_format must be float or base64", "invalid_request_error")
			return
		}
	}
	inputs, err := s.embedInputs(req.Input)
	if err != nil {
		s.badRequests.Add(1)
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
		return
	}
	total := 0
	for _, in := range inputs {
		total += len(in)
	}
	s.poolingWait(total, len(inputs))
	out := make([]byte, 0, 64+len(inputs)*(dim*12+64))
	out = append(out, `{"object":"list","data":[`...)
	vec := make([]float32, dim)
	var raw []byte
	for i, in := range inputs {
		embedVector(vec, in)
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"object":"embedding","index":`...)
		out = strconv.AppendInt(out, int64(i), 10)
		out = append(out, `,"embedding":`...)
		if b64 {
			raw = raw[:0]
			for _, f := range vec {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			out = append(out, '"')
			out = base64.StdEncoding.AppendEncode(out, raw)
			out = append(out, '"')
		} else {
			out = append(out, '[')
			for j, f := range vec {
				if j > 0 {
					out = append(out, ',')
				}
				out = strconv.AppendFloat(out, float64(f), 'g', -1, 32)
			}
			out = append(out, ']')
		}
		out = append(out, '}')
	}
	out = append(out, `],"model":`...)
	mj, _ := json.Marshal(model)
	out = append(out, mj...)
	out = append(out, `,"usage":{"prompt_tokens":`...)
	out = strconv.AppendInt(out, int64(total), 10)
	out = append(out, `,"total_tokens":`...)
	out = strconv.AppendInt(out, int64(total), 10)
	out = append(out, "}}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
}

// embedInputs returns the token ids of each input.
func (s *Server) embedInputs(raw json.RawMessage) ([][]uint32, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil, badRequest("input is required")
	}
	text := func(v json.RawMessage, i int) ([]uint32, error) {
		var str string
		if err := json.Unmarshal(v, &str); err != nil {
			return nil, badRequest("input[%d] must be a string", i)
		}
		if str == "" {
			return nil, badRequest("input must not contain empty strings")
		}
		ids := s.tok.Encode(nil, []byte(str))
		if len(ids) == 0 {
			return nil, badRequest("input[%d] encodes to zero tokens", i)
		}
		return ids, nil
	}
	ids := func(v json.RawMessage, i int) ([]uint32, error) {
		var n []int64
		if err := json.Unmarshal(v, &n); err != nil || len(n) == 0 {
			return nil, badRequest("input[%d] must be a non-empty array of token ids", i)
		}
		out := make([]uint32, len(n))
		for j, t := range n {
			if t < 0 || t > math.MaxUint32 {
				return nil, badRequest("input[%d] token id %d out of range", i, t)
			}
			out[j] = uint32(t)
		}
		return out, nil
	}
	switch b[0] {
	case '"':
		one, err := text(b, 0)
		return [][]uint32{one}, err
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(b, &items); err != nil {
			return nil, badRequest("cannot parse input: %s", err)
		}
		if len(items) == 0 {
			return nil, badRequest("input must not be empty")
		}
		first := bytes.TrimSpace(items[0])
		if len(first) > 0 && first[0] != '"' && first[0] != '[' {
			one, err := ids(b, 0) // one input given as token ids
			return [][]uint32{one}, err
		}
		if len(items) > embedMaxInputs {
			return nil, badRequest("input holds %d items; at most %d", len(items), embedMaxInputs)
		}
		out := make([][]uint32, len(items))
		for i, it := range items {
			it = bytes.TrimSpace(it)
			var err error
			switch {
			case len(it) > 0 && it[0] == '"' && first[0] == '"':
				out[i], err = text(it, i)
			case len(it) > 0 && it[0] == '[' && first[0] == '[':
				out[i], err = ids(it, i)
			default:
				err = badRequest("input items must all be strings or all be arrays of token ids")
			}
			if err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, badRequest("input must be a string, an array of strings, an array of token ids or an array of token-id arrays")
}

// embedVector fills v with the unit vector of the tokens: each (token,
// position) pair adds a hashed ±1 to a hashed coordinate.
func embedVector(v []float32, tokens []uint32) { hashVector(v, tokens, true) }

// bagVector is embedVector without positions: texts that share tokens
// point the same way wherever the tokens stand (rerank.go).
func bagVector(v []float32, tokens []uint32) { hashVector(v, tokens, false) }

func hashVector(v []float32, tokens []uint32, positional bool) {
	clear(v)
	for i, t := range tokens {
		pos := uint64(i)
		if !positional {
			pos = 0
		}
		h := uint64(t)*0x9e3779b97f4a7c15 ^ pos*0xc2b2ae3d27d4eb4f
		h ^= h >> 31
		h *= 0xbf58476d1ce4e5b9
		h ^= h >> 29
		sign := float32(1)
		if h&1 == 1 {
			sign = -1
		}
		v[(h>>1)%uint64(len(v))] += sign
		v[(h>>33)%uint64(len(v))] += 0.5 * sign
	}
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	if n == 0 {
		v[0], n = 1, 1
	}
	inv := float32(1 / math.Sqrt(n))
	for i := range v {
		v[i] *= inv
	}
}
