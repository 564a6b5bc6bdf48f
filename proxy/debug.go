package proxy

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// Introspection endpoints: POST /tokenize (vLLM's shape) and POST
// /debug/route. Neither is on the hot path; both sit behind --api-key.

// kindOf guesses the endpoint of a body: chat when it has messages.
func kindOf(rs *reqState, body []byte) int {
	if err := rs.parsed.parse(body, kindChat); err == nil {
		return kindChat
	}
	return kindCompletion
}

// debugBody answers a request that is not a POST, or whose body is not
// received, and returns nil; otherwise the request's state holding the
// body (the caller releases it).
func (s *Server) debugBody(ctx *fasthttp.RequestCtx) *reqState {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "use POST", "POST")
		return nil
	}
	rs := s.acquireState()
	if err := s.readBody(ctx, rs); err != nil {
		s.releaseState(rs, endComplete)
		s.writeBodyError(ctx, err) // as for inference requests: 413, 503, 408 or 400
		return nil
	}
	return rs
}

func writeNoTokenizer(ctx *fasthttp.RequestCtx) {
	writeError(ctx, fasthttp.StatusNotImplemented, typeInvalidRequest, "the router has no tokenizer (use --router-policy kv-aware)", "", "")
}

// hiddenModel answers 404 model_not_found, as /v1/models/{model} does,
// when u may not call the body's model (users[].models): the debugging
// endpoints do not tell a restricted user which other models exist. A user
// a reload replaced while the body arrived is identified again first, as
// an inference request's is (its model list may be narrower now, or the
// user gone); authenticate answers when the key no longer passes.
func (s *Server) hiddenModel(ctx *fasthttp.RequestCtx, u *govern.User, model []byte) bool {
	if u != nil && s.gov.Stale(u) {
		var ok bool
		if u, ok = s.authenticate(ctx); !ok {
			return true
		}
	}
	if len(model) == 0 || u.AllowsModel(string(model)) {
		return false
	}
	writeError(ctx, fasthttp.StatusNotFound, typeNotFound, unknownModel(model), "model", "model_not_found")
	return true
}

// handleTokenize answers {"tokens":[...],"count":N,"max_model_len":0},
// with "truncated":true (and "estimated_count") when the router encoded
// only part of the prompt.
func (s *Server) handleTokenize(ctx *fasthttp.RequestCtx, u *govern.User) {
	rs := s.debugBody(ctx)
	if rs == nil {
		return
	}
	defer s.releaseState(rs, endComplete)
	if s.o.Tokenizer == nil {
		writeNoTokenizer(ctx)
		return
	}
	body := rs.body
	kind := kindOf(rs, body)
	if err := rs.parsed.parse(body, kind); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "", "")
		return
	}
	if s.hiddenModel(ctx, u, rs.parsed.model) {
		return
	}
	if err := s.tokenize(rs, body, kind); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "messages", "")
		return
	}
	b := make([]byte, 0, 32+8*len(rs.tokens))
	b = append(b, `{"tokens":[`...)
	for i, t := range rs.tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"count":`...)
	b = strconv.AppendInt(b, int64(len(rs.tokens)), 10)
	b = append(b, `,"max_model_len":0`...)
	// The router encodes only a bounded part of a costly prompt (its
	// leading part, or nothing: --router-tokenize-max-bytes, the tool and
	// message bounds): say so, with its estimate of the whole, rather
	// than answer a count that looks like the prompt's.
	if rs.tokSkip {
		b = append(b, `,"truncated":true`...)
	} else if rs.tokCut > 0 && rs.tokCut < rs.tokText {
		b = append(b, `,"truncated":true,"estimated_count":`...)
		b = strconv.AppendInt(b, int64(rs.promptTokens()), 10)
	}
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// maxDetokenize bounds the ids of one /detokenize request.
const maxDetokenize = 1 << 20

var (
	errDetokenize        = &badRequestError{msg: "tokens is required: an array of token ids", param: "tokens"}
	errDetokenizeID      = &badRequestError{msg: "tokens: each token id must be an integer in [0, 4294967295]", param: "tokens"}
	errDetokenizeTooMany = &badRequestError{msg: "tokens: more than " + strconv.Itoa(maxDetokenize) + " token ids", param: "tokens"}
)

// handleDetokenize answers vLLM's POST /detokenize ({"tokens": [ids]}) with
// the router's tokenizer: {"prompt": text}, invalid UTF-8 replaced.
func (s *Server) handleDetokenize(ctx *fasthttp.RequestCtx) {
	rs := s.debugBody(ctx)
	if rs == nil {
		return
	}
	defer s.releaseState(rs, endComplete)
	dec, ok := s.o.Tokenizer.(tokenizer.Decoder)
	if !ok {
		writeNoTokenizer(ctx)
		return
	}
	ids, err := detokenizeIDs(rs.tokens[:0], rs.body)
	rs.tokens = ids
	if err != nil {
		var br *badRequestError
		if !errors.As(err, &br) {
			br = errMalformedJSON
		}
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, br.msg, br.param, "")
		return
	}
	rs.render = dec.AppendDecode(rs.render[:0], ids)
	b := append(make([]byte, 0, 16+len(rs.render)), `{"prompt":`...)
	b = appendJSONString(b, arenaString(rs.render))
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// detokenizeIDs reads the tokens array of a /detokenize body into dst.
func detokenizeIDs(dst []uint32, body []byte) ([]uint32, error) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return dst, errNotObject
	}
	seen := false
	end, err := forEachField(body, i, func(k []byte, vs, ve int) error {
		if string(k) != "tokens" {
			return nil
		}
		if seen || body[vs] != '[' {
			return errDetokenize
		}
		seen = true
		_, err := forEachElem(body, vs, func(s, e int) error {
			n, err := strconv.ParseUint(string(body[s:e]), 10, 32) // token ids span uint32
			if err != nil {
				return errDetokenizeID
			}
			if len(dst) >= maxDetokenize {
				return errDetokenizeTooMany
			}
			dst = append(dst, uint32(n))
			return nil
		})
		return err
	})
	if err != nil {
		return dst, err
	}
	if skipSpace(body, end) != len(body) {
		return dst, errMalformedJSON
	}
	if !seen {
		return dst, errDetokenize
	}
	return dst, nil
}

// RouteExplainer explains a kv-aware decision (kvroute.KVAware.Explain).
type RouteExplainer func(cands []*fleet.Worker, r *sched.Request) any

// handleDebugRoute parses a normal request body and returns, without
// sending it, its block hashes, each candidate's overlap, load terms and
// cost, and the choice.
func (s *Server) handleDebugRoute(ctx *fasthttp.RequestCtx, u *govern.User) {
	rs := s.debugBody(ctx)
	if rs == nil {
		return
	}
	defer s.releaseState(rs, endComplete)
	body := rs.body
	kind := kindOf(rs, body)
	if kind == kindChat {
		// As a request's: the reasoning mode may rewrite it (map mode's
		// enable_thinking changes the rendered prompt and its hashes).
		var ok bool
		if body, kind, _, ok = s.frontDoor(ctx, s.store.Load(), rs, kind); !ok {
			return
		}
	}
	if err := rs.parsed.parse(body, kind); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "", "")
		return
	}
	if s.hiddenModel(ctx, u, rs.parsed.model) {
		return
	}
	r := &rs.sreq
	r.Reset()
	r.Model = rs.parsed.model
	r.PromptTokens = rs.parsed.estimateTokens()
	if s.o.Tokenizer != nil && s.o.HashBlocks != nil {
		if err := s.hashPrompt(rs, body, kind); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "messages", "")
			return
		}
	}
	v := s.sched.Fleet.View()
	cands := v.ByModel[string(r.Model)]
	out := struct {
		Model       string   `json:"model"`
		Policy      string   `json:"policy"`
		BlockSize   int      `json:"block_size"`
		Tokens      int      `json:"tokens"`
		BlockHashes []string `json:"block_hashes"`
		Candidates  []string `json:"candidates"`
		KV          any      `json:"kv,omitempty"`
	}{Model: string(r.Model), Policy: s.policy.String(), BlockSize: s.o.BlockSize, Tokens: len(rs.tokens)}
	for _, h := range r.BlockHashes {
		out.BlockHashes = append(out.BlockHashes, strconv.FormatUint(h, 16))
	}
	for _, w := range cands {
		out.Candidates = append(out.Candidates, w.ID)
	}
	if s.o.Explain != nil && len(cands) > 0 {
		out.KV = s.o.Explain(cands, r)
	}
	b, _ := json.Marshal(out)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
