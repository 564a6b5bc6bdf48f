package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
)

// Kinds of endpoint bodies.
const (
	kindChat = iota
	kindCompletion
)

// reqBody holds what routing needs from a request body. Byte slices point
// into the request body or into the reqBody's own buffers; a reqBody is
// reused across requests (pooled with the request context).
type reqBody struct {
	model    []byte
	modelBuf []byte
	// modelStart and modelEnd span the model value (quotes included).
	modelStart, modelEnd int
	stream               bool
	// includeUsage: the body's stream_options asks for streaming usage,
	// as vLLM reads it.
	includeUsage bool
	// continuousUsage: its stream_options asks for the usage so far on
	// every chunk (vLLM's continuous_usage_stats, the last copy, read as
	// vLLM reads a bool). The router never asks for it itself.
	continuousUsage bool
	maxTokens       int // -1 when absent
	// choices is how many completions the engine generates per prompt: the
	// larger of n and best_of, the last copy of each as the engine reads
	// it (1 when absent, null or not a positive integer: the engine
	// refuses those); prompts is how many prompts a completion
	// body batches (1 for a chat).
	choices, prompts int
	// text is the prompt text: the completion prompt, or the chat messages'
	// text contents joined with '\n'.
	text []byte
	// promptTokens counts token ids when the prompt is given as ids.
	promptTokens int
	// embeds is how many prompts a completion's prompt_embeds gives
	// (vLLM's, base64 tensors: a string or an array of them); their
	// length in tokens is not read (usage tells it after).
	embeds int
	// tokenIDs holds a token-id prompt (completions) for kv-aware hashing;
	// idText is its text for the prefix layer (sched.AppendTokenPrompt).
	tokenIDs []uint32
	idText   []byte
	// messages and prompt are the raw value spans ([start, end) in the body).
	msgStart, msgEnd       int
	promptStart, promptEnd int // also input, query and text_1
	auxStart, auxEnd       int // documents, text_2
	toolsStart, toolsEnd   int
	// kwStart and kwEnd span a chat's chat_template_kwargs (the last copy,
	// as the engine reads it); a chat's documents are the aux span.
	kwStart, kwEnd int
	nMessages      int
	msgErr         error
	// msgSpans locates the fields of the first maxRouteMessages messages,
	// for decodeMessages; restSize is the size (msgSpan.size) of the rest.
	msgSpans []msgSpan
	restSize int
	// objStart is the index of the body's '{'; streamOpts tells whether it
	// has a stream_options key.
	objStart   int
	streamOpts bool
	// noGenPrompt and continueFinal are a chat's add_generation_prompt
	// false and continue_final_message true (the last copy of each, as
	// the engine reads them): its prompt ends without a generation prompt,
	// or with its final message's content (tokenize).
	noGenPrompt, continueFinal bool
	// addSpecial is the request's add_special_tokens (the last copy, as
	// the engine reads it): 't' true, 'f' false, 0 absent or null (vLLM's
	// default: true for a completion, false for a chat).
	addSpecial byte
	// effortStart and effortEnd span a chat's reasoning_effort (the last
	// copy), which vLLM passes to the chat template.
	effortStart, effortEnd int
}

func (b *reqBody) reset() {
	// Cleared in place, then the buffers put back: a literal that reads
	// *b is built in a temporary and copied over *b (typedmemmove), about
	// four times the instructions.
	modelBuf, text, tokenIDs, idText, msgSpans := trimBuf(b.modelBuf), trimBuf(b.text), trimIDs(b.tokenIDs), trimBuf(b.idText), b.msgSpans[:0]
	*b = reqBody{}
	b.modelBuf, b.text, b.tokenIDs, b.idText, b.msgSpans = modelBuf, text, tokenIDs, idText, msgSpans
	b.maxTokens, b.choices, b.prompts = -1, 1, 1
}

// span is a JSON value's [s, e) in the messages array (so that moving the
// array in the body moves it too); e == 0 when absent.
type span struct{ s, e int }

// msgSpan holds the values of one chat message's fields that the chat
// template reads (the last of a repeated key, as a JSON decoder would).
type msgSpan struct {
	role, content, name, toolCallID, toolCalls span
	// reasoning and reasoningContent: an assistant's reasoning under its
	// current name and its deprecated one (vLLM takes reasoning when it is
	// given, else reasoning_content).
	reasoning, reasoningContent span
}

// size is the message's weight for extrapolating a prompt's length from
// its leading messages: its content, reasoning and tool-call bytes, plus
// one.
func (sp *msgSpan) size() int {
	r := sp.reasoningSpan()
	return 1 + sp.content.e - sp.content.s + sp.toolCalls.e - sp.toolCalls.s + r.e - r.s
}

// trimIDs empties ids, dropping them when they grew large.
func trimIDs(ids []uint32) []uint32 {
	if cap(ids) > 64<<10 {
		return nil
	}
	return ids[:0]
}

// badRequestError is a client error with an OpenAI param name.
type badRequestError struct {
	msg   string
	param string
}

func (e *badRequestError) Error() string { return e.msg }

var (
	errNotObject     = &badRequestError{msg: "request body must be a JSON object"}
	errNoModel       = &badRequestError{msg: "you must provide a model parameter", param: "model"}
	errModelType     = &badRequestError{msg: "model must be a string", param: "model"}
	errStreamType    = &badRequestError{msg: "stream must be a boolean", param: "stream"}
	errMaxTokens     = &badRequestError{msg: "max_tokens must be a non-negative integer", param: "max_tokens"}
	errNoMessages    = &badRequestError{msg: "messages is required and must be a non-empty array", param: "messages"}
	errMessages      = &badRequestError{msg: "messages must be an array of objects", param: "messages"}
	errNoPrompt      = &badRequestError{msg: "prompt (or prompt_embeds) is required", param: "prompt"}
	errEmbedsType    = &badRequestError{msg: "prompt_embeds must be a base64 string or an array of them", param: "prompt_embeds"}
	errPromptType    = &badRequestError{msg: "prompt must be a string, an array of strings, or an array of token ids", param: "prompt"}
	errEmptyPrompt   = &badRequestError{msg: "prompt must not be empty: give a non-empty string, or a non-empty array of non-empty strings or token-id arrays", param: "prompt"}
	errMalformedJSON = &badRequestError{msg: "malformed JSON in request body"}
	errEmptyModel    = &badRequestError{msg: "model must not be empty", param: "model"}
)

// Routing keys: a body that names one twice is refused, since engines
// disagree with each other (and maybe with us) on which one counts.
const (
	rkModel = 1 << iota
	rkStream
	rkMaxTokens
	rkMaxCompletionTokens
	rkMessages
	rkPrompt
	rkInput // input, query, text_1
	rkAux   // documents, text_2
	rkPromptEmbeds
)

func duplicateKey(name string) error {
	return &badRequestError{msg: "duplicate key " + name + " in request body", param: name}
}

// readKeys are the keys parse reads, at the top level (and include_usage
// in stream_options).
var readKeys = [...][]byte{[]byte("model"), []byte("stream"), []byte("max_tokens"), []byte("max_completion_tokens"),
	[]byte("messages"), []byte("prompt"), []byte("stream_options"), []byte("tools"), []byte("n"), []byte("best_of"),
	[]byte("input"), []byte("encoding_format"), []byte("dimensions"), []byte("query"), []byte("documents"),
	[]byte("top_n"), []byte("text_1"), []byte("text_2"), []byte("include_usage"), []byte("prompt_embeds")}

// foldedKey returns the key of readKeys that key is a case variant of
// ("Model", "MAX_TOKENS", "max_to\u212aens" with the Kelvin sign), or
// nil. An engine decoding with Go's encoding/json (infera engine, Ollama,
// ...) matches keys case-insensitively, the last one winning, so such a
// key would be read by the engine and not by the router: another model
// than the one allowed, more tokens than the quota was charged. A key of
// lowercase ASCII only (nearly all) cannot be one.
func foldedKey(key []byte) []byte {
	plain := true
	for _, c := range key {
		if c >= 'A' && c <= 'Z' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return nil
	}
	for _, k := range readKeys {
		if bytes.EqualFold(key, k) {
			return k
		}
	}
	return nil
}

func caseVariantKey(key []byte) error {
	want := string(foldedKey(key))
	return &badRequestError{msg: "key " + strconv.Quote(string(key)) + " is " + strconv.Quote(want) +
		" in another case: an engine that matches keys regardless of case would read it, the router does not", param: want}
}

// parse extracts the routing fields of a chat (kind 0) or completion body.
func (b *reqBody) parse(d []byte, kind int) error {
	b.reset()
	i := skipSpace(d, 0)
	if i >= len(d) || d[i] != '{' {
		if j, err := skipValue(d, i, 0); err != nil || skipSpace(d, j) != len(d) {
			return errMalformedJSON
		}
		return errNotObject
	}
	b.objStart = i
	var perr error
	var seen uint
	maxCompletion := -2
	nChoices, bestOf := 1, 1
	once := func(bit uint, name string) bool {
		if seen&bit != 0 {
			if perr == nil {
				perr = duplicateKey(name)
			}
			return false
		}
		seen |= bit
		return true
	}
	end, err := walkObjectInline(d, i, func(key []byte, vs int) (int, error) {
		switch string(key) {
		case "messages":
			if kind != kindChat || !once(rkMessages, "messages") || d[vs] != '[' {
				return -1, nil // not an array: validated by the walker, refused below
			}
			// Parsed in the same pass that validates it.
			b.msgStart = vs
			ve, err := b.parseMessagesAt(d, vs)
			b.msgEnd = ve
			return ve, err
		case "model", "stream", "max_tokens", "max_completion_tokens", "stream_options", "prompt", "tools", "n", "best_of":
			if poolingKind(kind) && len(key) != len("model") {
				return -1, nil // not a field of these endpoints: the engine's business
			}
		case "input", "encoding_format", "dimensions":
			if kind != kindEmbeddings {
				return -1, nil
			}
		case "query", "top_n":
			if kind != kindRerank {
				return -1, nil
			}
		case "documents":
			if kind != kindRerank && kind != kindChat {
				return -1, nil
			}
		case "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "reasoning_effort":
			if kind != kindChat {
				return -1, nil
			}
		case "prompt_embeds":
			if kind != kindCompletion {
				return -1, nil
			}
		case "add_special_tokens":
			if kind != kindChat && kind != kindCompletion {
				return -1, nil
			}
		case "text_1", "text_2":
			if kind != kindScore {
				return -1, nil
			}
		default:
			if foldedKey(key) != nil && perr == nil {
				perr = caseVariantKey(key)
			}
			return -1, nil
		}
		ve, err := skipValue(d, vs, 1)
		if err != nil {
			return ve, err
		}
		v := d[vs:ve]
		switch string(key) {
		case "model":
			if !once(rkModel, "model") {
				return ve, nil
			}
			if v[0] != '"' {
				perr = errModelType
				return ve, nil
			}
			b.modelStart, b.modelEnd = vs, ve
			raw := v[1 : len(v)-1]
			if hasEscape(raw) {
				b.modelBuf = unescape(b.modelBuf[:0], raw)
				b.model = b.modelBuf
			} else {
				b.model = raw
			}
		case "stream":
			if !once(rkStream, "stream") {
				return ve, nil
			}
			// Read as the engine reads it: "true", 1 and "yes" stream too.
			switch jsonscan.LaxBool(v) {
			case 't':
				b.stream = true
			case 'f':
				b.stream = false
			default:
				if string(v) != "null" {
					perr = errStreamType
				}
			}
		case "max_tokens", "max_completion_tokens":
			completion := len(key) == len("max_completion_tokens")
			if completion && !once(rkMaxCompletionTokens, "max_completion_tokens") ||
				!completion && !once(rkMaxTokens, "max_tokens") {
				return ve, nil
			}
			if v[0] == 'n' {
				return ve, nil
			}
			// Read as the engine reads an int (vLLM's lax int: 100.0,
			// 1e2 and "100" are 100; a plain integer takes parseInt
			// alone): refused, such a limit failed requests the engine
			// serves.
			n := laxInt(v)
			if n < 0 {
				perr = errMaxTokens
				return ve, nil
			}
			if completion {
				maxCompletion = n // wins over max_tokens unless 0, as in vLLM
			} else {
				b.maxTokens = n
			}
		case "stream_options":
			// The last one counts, as the engine reads it; its
			// include_usage defaults to true (vLLM's StreamOptions), its
			// last copy counts.
			b.streamOpts, b.includeUsage, b.continuousUsage = true, v[0] == '{', false
			if v[0] == '{' {
				forEachField(d, vs, func(k []byte, s, e int) error {
					if string(k) == "include_usage" {
						b.includeUsage = jsonscan.LaxBool(d[s:e]) == 't'
					} else if string(k) == "continuous_usage_stats" {
						b.continuousUsage = jsonscan.LaxBool(d[s:e]) == 't'
					} else if foldedKey(k) != nil && perr == nil {
						perr = caseVariantKey(k)
					}
					return nil
				})
			}
		case "prompt":
			if once(rkPrompt, "prompt") {
				b.promptStart, b.promptEnd = vs, ve
			}
		case "prompt_embeds":
			if once(rkPromptEmbeds, "prompt_embeds") {
				if n, ok := countEmbeds(d, vs); ok {
					b.embeds = n
				} else if perr == nil {
					perr = errEmbedsType
				}
			}
		case "tools":
			b.toolsStart, b.toolsEnd = vs, ve // the last, as the engine reads it
		case "n", "best_of":
			// The last copy of each counts, read as the engine reads
			// an int (3.0 and "3" are 3).
			c := 1
			if n := laxInt(v); n > 0 {
				c = min(n, 1<<16)
			}
			if key[0] == 'n' {
				nChoices = c
			} else {
				bestOf = c
			}
		case "input", "query", "text_1":
			name := "input"
			switch key[0] {
			case 'q':
				name = "query"
			case 't':
				name = "text_1"
			}
			if once(rkInput, name) {
				b.promptStart, b.promptEnd = vs, ve
			}
		case "documents", "text_2":
			name := "documents"
			if key[0] == 't' {
				name = "text_2"
			}
			if kind == kindChat || once(rkAux, name) { // a chat's: the last, as the engine reads it
				b.auxStart, b.auxEnd = vs, ve
			}
		case "chat_template_kwargs":
			b.kwStart, b.kwEnd = vs, ve
		case "reasoning_effort":
			b.effortStart, b.effortEnd = vs, ve
		case "add_special_tokens":
			b.addSpecial = jsonscan.LaxBool(v)
		case "add_generation_prompt":
			b.noGenPrompt = jsonscan.LaxBool(v) == 'f'
		case "continue_final_message":
			b.continueFinal = jsonscan.LaxBool(v) == 't'
		case "top_n":
			if _, ok := parseInt(v); !ok && string(v) != "null" {
				perr = errTopN
			}
		case "encoding_format":
			if string(v) != `"float"` && string(v) != `"base64"` && string(v) != "null" {
				perr = errEncodingFormat
			}
		case "dimensions":
			if n, ok := parseInt(v); (!ok || n == 0) && string(v) != "null" {
				perr = errDimensions
			}
		}
		return ve, nil
	})
	if err != nil {
		var br *badRequestError
		if errors.As(err, &br) {
			return err
		}
		return errMalformedJSON
	}
	if j := skipSpace(d, end); j != len(d) {
		return errMalformedJSON
	}
	if perr != nil {
		return perr
	}
	if maxCompletion > 0 {
		// vLLM reads "max_completion_tokens or max_tokens": a 0 (or
		// null) leaves max_tokens in force.
		b.maxTokens = maxCompletion
	}
	b.choices = max(nChoices, bestOf)
	if b.model == nil {
		return errNoModel
	}
	if len(b.model) == 0 {
		return errEmptyModel
	}
	switch kind {
	case kindEmbeddings:
		return b.parseInput(d) // embeddings.go
	case kindRerank:
		return b.parseRerank(d) // rerank.go
	case kindScore:
		return b.parseScore(d)
	}
	if kind == kindChat {
		if b.msgErr != nil {
			return b.msgErr
		}
		if b.msgEnd == 0 || b.nMessages == 0 {
			return errNoMessages
		}
		return nil
	}
	return b.parsePrompt(d)
}

// insertStreamUsage appends to dst the body d (which b was parsed from; a
// stream with no stream_options) with stream_options inserted first
// (protocol.InsertStreamUsage), and moves b to the new body as a parse of
// it would: the spans after the insertion shift, the model is re-pointed.
// No second walk of the body.
func (b *reqBody) insertStreamUsage(dst, d []byte) []byte {
	out := protocol.InsertStreamUsage(dst, d, b.objStart)
	at, delta := b.objStart+1, len(out)-len(dst)-len(d)
	for _, x := range [...]*int{&b.modelStart, &b.modelEnd, &b.msgStart, &b.msgEnd, &b.promptStart, &b.promptEnd, &b.toolsStart, &b.toolsEnd, &b.auxStart, &b.auxEnd, &b.kwStart, &b.kwEnd, &b.effortStart, &b.effortEnd} {
		if *x >= at {
			*x += delta
		}
	}
	if len(b.modelBuf) == 0 { // not unescaped: the model aliases the body
		b.model = out[b.modelStart+1 : b.modelEnd-1]
	}
	b.streamOpts, b.includeUsage = true, true
	return out
}

func hasEscape(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' {
			return true
		}
	}
	return false
}

// parseMessagesAt walks (and validates) the messages array at d[vs],
// collecting the text of the contents (of each message the last content
// key, as the engine's JSON decoder keeps it), and returns the index after
// it. A
// message that is not an object is recorded (b.msgErr) rather than
// returned, so that malformed JSON later in the body is reported as such.
func (b *reqBody) parseMessagesAt(d []byte, vs int) (int, error) {
	// Each message is validated by the walk that reads it, so its bytes
	// are scanned once; the array is at depth 1, its messages at 2.
	return walkElements(d, vs, func(ms int) (int, error) {
		if d[ms] != '{' {
			me, err := skipValue(d, ms, 2)
			if err == nil {
				b.msgErr = errMessages
			}
			return me, err
		}
		b.nMessages++
		var sp msgSpan
		me, err := walkObject(d, ms, 2, func(key []byte, s, e int) error {
			switch string(key) {
			case "content":
				sp.content = span{s - vs, e - vs} // the last copy, as the engine reads it
			case "role":
				sp.role = span{s - vs, e - vs}
			case "name":
				sp.name = span{s - vs, e - vs}
			case "tool_call_id":
				sp.toolCallID = span{s - vs, e - vs}
			case "reasoning":
				sp.reasoning = valueSpan(d, s, e, vs)
			case "reasoning_content":
				sp.reasoningContent = valueSpan(d, s, e, vs)
			case "tool_calls":
				sp.toolCalls = span{s - vs, e - vs}
			}
			return nil
		})
		if err != nil {
			return me, err
		}
		if sp.content.e > 0 {
			b.appendContent(d, vs+sp.content.s, vs+sp.content.e)
		}
		// Routing renders at most maxRouteMessages messages: the rest are
		// only weighed (a 32 MiB body may hold a million).
		if len(b.msgSpans) < maxRouteMessages {
			b.msgSpans = append(b.msgSpans, sp)
		} else {
			b.restSize += sp.size()
		}
		return me, nil
	})
}

// appendContent appends a message content to text, after a '\n' when
// text is not empty: a string as it is, an array of parts as the engine
// flattens it for its chat template (appendRouteText: the text of its text
// part types only, as vLLM's chat_utils reads them, after a marker for
// each media part that names its media); an array with no text or media
// appends nothing. The prefix hash, the token estimate and the smart
// model selection's classifier read this text: text an engine ignores (an
// image part's stray "text") must not steer them, and media the engine
// caches apart must part the prefix.
func (b *reqBody) appendContent(d []byte, s, e int) {
	switch d[s] {
	case '"':
		if len(b.text) > 0 {
			b.text = append(b.text, '\n')
		}
		b.text = unescape(b.text, d[s+1:e-1])
	case '[':
		n := len(b.text)
		if n > 0 {
			b.text = append(b.text, '\n')
		}
		b.text = appendRouteText(b.text, d, s)
		if len(b.text) == n+1 && n > 0 {
			b.text = b.text[:n] // no text: no separator either
		}
	}
}

// countEmbeds counts the prompts of a prompt_embeds value at d[vs:]: a
// string is one, an array of strings as many as it holds, null none.
func countEmbeds(d []byte, vs int) (int, bool) {
	switch d[vs] {
	case 'n':
		return 0, true
	case '"':
		return 1, true
	case '[':
		n := 0
		_, err := forEachElem(d, vs, func(s, e int) error {
			if d[s] != '"' {
				return errEmbedsType
			}
			n++
			return nil
		})
		return n, err == nil
	}
	return 0, false
}

// parsePrompt reads a completion's prompt, and counts its prompts with
// those of prompt_embeds: vLLM takes either or both (the embeddings'
// prompts first), and a prompt of null with embeddings as none.
func (b *reqBody) parsePrompt(d []byte) error {
	if b.embeds > 0 && (b.promptEnd == 0 || d[b.promptStart] == 'n') {
		b.prompts = b.embeds
		return nil
	}
	err := b.parseTextPrompt(d)
	b.prompts += b.embeds
	return err
}

func (b *reqBody) parseTextPrompt(d []byte) error {
	if b.promptEnd == 0 {
		return errNoPrompt
	}
	switch d[b.promptStart] {
	case '"':
		if b.promptEnd-b.promptStart == 2 {
			return errEmptyPrompt
		}
		b.text = unescape(b.text, d[b.promptStart+1:b.promptEnd-1])
		return nil
	case '[':
	default:
		return errPromptType
	}
	first := true
	isIDs := false
	b.prompts = 0
	elems := 0
	_, err := forEachElem(d, b.promptStart, func(vs, ve int) error {
		elems++
		c := d[vs]
		if first {
			isIDs = c != '"' && c != '['
			first = false
		}
		if !isIDs {
			b.prompts++ // a string, or an array of token ids
		}
		switch {
		case c == '"' && !isIDs:
			if ve-vs == 2 {
				return errEmptyPrompt // an engine refuses an empty prompt of a batch
			}
			if len(b.text) > 0 {
				b.text = append(b.text, '\n')
			}
			b.text = unescape(b.text, d[vs+1:ve-1])
		case c == '[' && !isIDs:
			// batch of token-id arrays: count them
			ids := 0
			_, err := forEachElem(d, vs, func(s, e int) error {
				ids++
				n, ok := parseInt(d[s:e])
				if !ok {
					return errPromptType
				}
				b.appendID(n)
				return nil
			})
			if err == nil && ids == 0 {
				return errEmptyPrompt
			}
			return err
		case isIDs && (c >= '0' && c <= '9'):
			n, ok := parseInt(d[vs:ve])
			if !ok {
				return errPromptType
			}
			b.appendID(n)
		default:
			return errPromptType
		}
		return nil
	})
	if err != nil {
		var br *badRequestError
		if errors.As(err, &br) {
			return err
		}
		return errPromptType
	}
	if elems == 0 {
		return errEmptyPrompt
	}
	b.prompts = max(b.prompts, 1)
	return nil
}

// maxRouteIDs bounds the token ids of a prompt kept for routing: the
// leading 65,536 (4,096 blocks of 16), about the tokens of the leading
// --router-tokenize-max-bytes of a text prompt by default. A body of 32 MiB
// holds 16 M ids; copied for the hashes and the prefix layer they took
// 15 bytes of memory for every 2 of the body.
const maxRouteIDs = 64 << 10

// appendID counts a prompt's token id and keeps it while the routing
// bound allows.
func (b *reqBody) appendID(n int) {
	if len(b.tokenIDs) < maxRouteIDs {
		b.tokenIDs = append(b.tokenIDs, uint32(n))
	}
	b.promptTokens++
}

// generations is how many completions the engine generates for the body:
// choices for each prompt.
func (b *reqBody) generations() int { return min(b.choices*b.prompts, 1<<20) }

// estimateTokens returns the prompt length estimate in tokens.
func (b *reqBody) estimateTokens() int {
	if b.promptTokens > 0 {
		return b.promptTokens
	}
	// ~4 bytes per token for English text, plus a few per chat message.
	return (len(b.text)+3)/4 + 4*b.nMessages
}

func (b *reqBody) String() string {
	return fmt.Sprintf("model=%q stream=%v max_tokens=%d text=%dB", b.model, b.stream, b.maxTokens, len(b.text))
}

// reasoningSpan is the message's reasoning as vLLM reads it: its
// reasoning field unless absent, else reasoning_content (vLLM's request
// model renames the deprecated reasoning_content to reasoning when
// reasoning is not given; a null one is not recorded).
func (sp *msgSpan) reasoningSpan() span {
	if sp.reasoning.e > sp.reasoning.s {
		return sp.reasoning
	}
	return sp.reasoningContent
}

// valueSpan is d[s:e]'s span relative to vs, or no span for a null (an
// absent field, as for vLLM's request model).
func valueSpan(d []byte, s, e, vs int) span {
	if d[s] == 'n' {
		return span{}
	}
	return span{s - vs, e - vs}
}
