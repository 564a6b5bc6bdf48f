package proxy

import "errors"

// Reranking and scoring, as vLLM serves them for cross-encoder models
// (Jina's and Cohere's rerank API, and vLLM's score API): POST /v1/rerank
// (also /rerank and /v2/rerank) and POST /v1/score (also /score) take the
// request path of the embeddings endpoint (embeddings.go): the same
// checks of the user and the model, LoadOnly routing, no output estimate,
// never a stream, never split into prefill/decode legs. The engine gets
// them at /v1/rerank and /v1/score, which vLLM serves like the other
// spellings.

// Kinds of the pooling endpoints beyond embeddings.
const (
	kindRerank = kindEmbeddings + 1 + iota
	kindScore
)

// maxRerankDocuments bounds the documents of one rerank request (Cohere's
// limit).
const maxRerankDocuments = 1000

var (
	errNoQuery     = &badRequestError{msg: "query is required and must be a non-empty string", param: "query"}
	errDocuments   = &badRequestError{msg: "documents is required: a non-empty array of strings or of objects with a text", param: "documents"}
	errTooManyDocs = &badRequestError{msg: "documents may hold at most 1000 items", param: "documents"}
	errTopN        = &badRequestError{msg: "top_n must be a non-negative integer", param: "top_n"}
	errText1       = &badRequestError{msg: "text_1 is required: a non-empty string or a non-empty array of non-empty strings", param: "text_1"}
	errText2       = &badRequestError{msg: "text_2 is required: a non-empty string or a non-empty array of non-empty strings", param: "text_2"}
	errScorePairs  = &badRequestError{msg: "text_1 must hold one text or as many as text_2", param: "text_1"}
)

// poolingKind reports the kinds that generate nothing (embeddings,
// rerank, score).
func poolingKind(kind int) bool { return kind >= kindEmbeddings && kind <= kindScore }

// parseRerank checks the query and documents the parse recorded and
// estimates the tokens the engine scores: the query once per document,
// plus each document (about 4 bytes a token).
func (b *reqBody) parseRerank(d []byte) error {
	b.maxTokens = 0
	if b.promptEnd == 0 || d[b.promptStart] != '"' || b.promptEnd-b.promptStart == 2 {
		return errNoQuery
	}
	if b.auxEnd == 0 || d[b.auxStart] != '[' {
		return errDocuments
	}
	query := textTokens(b.promptStart, b.promptEnd)
	docs := 0
	_, err := forEachElem(d, b.auxStart, func(vs, ve int) error {
		switch d[vs] {
		case '"':
			b.promptTokens += query + textTokens(vs, ve)
		case '{': // {"text": ...} and the engine's other document forms
			b.promptTokens += query + (ve-vs+3)/4
		default:
			return errDocuments
		}
		docs++
		return nil
	})
	switch {
	case err != nil:
		return asBadRequest(err, errDocuments)
	case docs == 0:
		return errDocuments
	case docs > maxRerankDocuments:
		return errTooManyDocs
	}
	return nil
}

// parseScore checks text_1 and text_2 and estimates the tokens of the
// pairs the engine scores (text_1's one text with each of text_2's, or
// the texts pairwise).
func (b *reqBody) parseScore(d []byte) error {
	b.maxTokens = 0
	n1, t1, err := scoreTexts(d, b.promptStart, b.promptEnd, errText1)
	if err != nil {
		return err
	}
	n2, t2, err := scoreTexts(d, b.auxStart, b.auxEnd, errText2)
	if err != nil {
		return err
	}
	if n1 != 1 && n1 != n2 {
		return errScorePairs
	}
	if n1 == 1 {
		t1 *= n2
	}
	b.promptTokens = t1 + t2
	return nil
}

// scoreTexts reads a text_1 or text_2 value: a non-empty string or a
// non-empty array of them; it returns how many texts and their tokens.
func scoreTexts(d []byte, s, e int, bad *badRequestError) (n, tokens int, err error) {
	if e == 0 {
		return 0, 0, bad
	}
	switch d[s] {
	case '"':
		if e-s == 2 {
			return 0, 0, bad
		}
		return 1, textTokens(s, e), nil
	case '[':
	default:
		return 0, 0, bad
	}
	_, err = forEachElem(d, s, func(vs, ve int) error {
		if d[vs] != '"' || ve-vs == 2 {
			return bad
		}
		n++
		tokens += textTokens(vs, ve)
		return nil
	})
	if err != nil {
		return 0, 0, asBadRequest(err, bad)
	}
	if n == 0 {
		return 0, 0, bad
	}
	return n, tokens, nil
}

// textTokens estimates the tokens of the JSON string at [vs, ve): about 4
// bytes a token, at least one.
func textTokens(vs, ve int) int { return max(1, (ve-vs-2+3)/4) }

// asBadRequest returns err's request error, or bad for any other error
// (a syntax error the walk found).
func asBadRequest(err error, bad *badRequestError) error {
	var br *badRequestError
	if errors.As(err, &br) {
		return br
	}
	return bad
}
