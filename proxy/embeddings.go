package proxy

// OpenAI's embeddings endpoint (POST /v1/embeddings) goes through the
// request path like the generation endpoints: authentication, users and
// quotas (the input's tokens count against TPM, reconciled with the
// engine's usage.prompt_tokens), model routing, retries, breakers,
// timeouts, the access log. What differs: it is never a stream, the input
// is no prompt the KV cache could hold (no prefix layer, no KV-aware
// hashing: the load balancer picks), it is never split into
// prefill/decode legs, and smart model selection leaves its model alone.
// The parse checks the shape OpenAI documents; the engine does the rest.

// kindEmbeddings is the endpoint's body kind (parse.go has chat and
// completion, protocols.go the front doors).
const kindEmbeddings = kindResponses + 1

// maxEmbeddingInputs is how many inputs one request may carry (OpenAI's
// limit).
const maxEmbeddingInputs = 2048

var (
	errNoInput        = &badRequestError{msg: "input is required", param: "input"}
	errInputType      = &badRequestError{msg: "input must be a string, an array of strings, an array of token ids or an array of token-id arrays", param: "input"}
	errInputEmpty     = &badRequestError{msg: "input must not be empty, nor hold an empty string or an empty token array", param: "input"}
	errInputTooMany   = &badRequestError{msg: "input may hold at most 2048 items", param: "input"}
	errEncodingFormat = &badRequestError{msg: "encoding_format must be float or base64", param: "encoding_format"}
	errDimensions     = &badRequestError{msg: "dimensions must be a positive integer", param: "dimensions"}
)

// parseInput checks the input span the parse recorded and estimates its
// tokens (token ids as given, about 4 bytes a token for text) into
// promptTokens; the body generates nothing (maxTokens 0).
func (b *reqBody) parseInput(d []byte) error {
	b.maxTokens = 0
	if b.promptEnd == 0 || d[b.promptStart] == 'n' {
		return errNoInput
	}
	switch d[b.promptStart] {
	case '"':
		if b.promptEnd-b.promptStart == 2 {
			return errInputEmpty
		}
		b.promptTokens = textTokens(b.promptStart, b.promptEnd)
		return nil
	case '[':
	default:
		return errInputType
	}
	// An array: of strings, of token ids (one input), or of token-id arrays.
	var first byte
	items := 0
	_, err := forEachElem(d, b.promptStart, func(vs, ve int) error {
		c := d[vs]
		if items == 0 {
			first = c
		}
		items++
		switch {
		case first == '"' && c == '"':
			if ve-vs == 2 {
				return errInputEmpty
			}
			b.promptTokens += textTokens(vs, ve)
		case first == '[' && c == '[':
			n := 0
			if _, err := forEachElem(d, vs, func(s, e int) error {
				if _, ok := parseInt(d[s:e]); !ok {
					return errInputType
				}
				n++
				return nil
			}); err != nil {
				return err
			}
			if n == 0 {
				return errInputEmpty
			}
			b.promptTokens += n
		case first != '"' && first != '[' && c >= '0' && c <= '9':
			if _, ok := parseInt(d[vs:ve]); !ok {
				return errInputType
			}
			b.promptTokens++
		default:
			return errInputType
		}
		return nil
	})
	if err != nil {
		return asBadRequest(err, errInputType)
	}
	switch {
	case items == 0:
		return errInputEmpty
	case (first == '"' || first == '[') && items > maxEmbeddingInputs:
		return errInputTooMany
	}
	return nil
}
