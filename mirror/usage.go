package mirror

import (
	"bytes"

	"github.com/infera/infera/protocol"
)

var keyUsage = []byte(`"usage"`)

// maxTokenDigits bounds a token count (15 digits: below 10^15, far beyond
// any answer, and exact in a float64 metric).
const maxTokenDigits = 15

// scanUsage takes the top-level "usage" of an OpenAI answer or stream
// chunk b, {"usage":{"prompt_tokens":N,"completion_tokens":N,...},...},
// without decoding the JSON: a document without the bytes "usage" costs
// one search, and otherwise one pass that skips every other member. It
// decides as encoding/json would into
//
//	struct{ Usage *struct{ PromptTokens, CompletionTokens int } }
//
// for a well-formed object whose keys are written without escapes: the last
// duplicate wins, a null usage is none, a missing or null count is 0, and a
// count that is not a non-negative integer (or has more than 15 digits)
// leaves res unchanged. Keys are matched exactly (encoding/json would also
// take "Usage"). A document it cannot walk (unbalanced brackets or quotes,
// a missing colon or comma, trailing bytes) leaves res unchanged; other
// breaks of JSON's rules are not looked for.
func scanUsage(b []byte, res *result) {
	if !bytes.Contains(b, keyUsage) {
		return
	}
	var (
		found            bool // a usage object, as of the last "usage" member
		prompt, complete int
	)
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return // no members
	}
	for {
		key, j, ok := scanString(b, i)
		if !ok {
			return
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return
		}
		i = skipSpace(b, i+1)
		if string(key) == "usage" {
			var p, c int
			var isObj bool
			if i, isObj, p, c, ok = scanUsageValue(b, i); !ok {
				return
			}
			found, prompt, complete = isObj, p, c
		} else if i, ok = skipValue(b, i); !ok {
			return
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return
		}
		if b[i] == '}' {
			break
		}
		if b[i] != ',' {
			return
		}
		i = skipSpace(b, i+1)
	}
	if skipSpace(b, i+1) != len(b) || !found {
		return
	}
	res.usage = true
	res.prompt, res.complete = prompt, complete
}

// scanUsageValue reads the value of a "usage" member at b[i:]: null
// (isObj false) or an object whose prompt_tokens and completion_tokens, when
// present and not null, are non-negative integers.
func scanUsageValue(b []byte, i int) (end int, isObj bool, prompt, complete int, ok bool) {
	if j, isNull := literal(b, i, "null"); isNull {
		return j, false, 0, 0, true
	}
	if i >= len(b) || b[i] != '{' {
		// Another type: encoding/json refuses the whole document.
		return i, false, 0, 0, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true, 0, 0, true
	}
	for {
		key, j, ok := scanString(b, i)
		if !ok {
			return j, false, 0, 0, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return i, false, 0, 0, false
		}
		i = skipSpace(b, i+1)
		switch string(key) {
		case "prompt_tokens":
			if i, prompt, ok = scanCount(b, i); !ok {
				return i, false, 0, 0, false
			}
		case "completion_tokens":
			if i, complete, ok = scanCount(b, i); !ok {
				return i, false, 0, 0, false
			}
		default:
			if i, ok = skipValue(b, i); !ok {
				return i, false, 0, 0, false
			}
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false, 0, 0, false
		}
		if b[i] == '}' {
			return i + 1, true, prompt, complete, true
		}
		if b[i] != ',' {
			return i, false, 0, 0, false
		}
		i = skipSpace(b, i+1)
	}
}

// scanCount reads a token count: null (0) or a non-negative integer of at
// most maxTokenDigits digits, with no fraction or exponent.
func scanCount(b []byte, i int) (end, n int, ok bool) {
	if j, isNull := literal(b, i, "null"); isNull {
		return j, 0, true
	}
	start := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		n = n*10 + int(b[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > maxTokenDigits || digits > 1 && b[start] == '0' {
		return i, 0, false
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return i, 0, false
	}
	return i, n, true
}

// scanString reads the JSON string at b[i:] and returns its raw contents
// (escapes not decoded) and the index after its closing quote.
func scanString(b []byte, i int) (s []byte, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	start := i + 1
	for j := start; j < len(b); {
		k := bytes.IndexAny(b[j:], "\"\\")
		if k < 0 {
			return nil, len(b), false
		}
		j += k
		if b[j] == '\\' {
			j += 2
			continue
		}
		return b[start:j], j + 1, true
	}
	return nil, len(b), false
}

// skipValue skips the JSON value at b[i:] (a string, an object or array
// by its brackets, a scalar up to the next delimiter) and returns the index
// after it. It checks quotes and bracket balance, not every rule of JSON.
func skipValue(b []byte, i int) (end int, ok bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		_, end, ok = scanString(b, i)
		return end, ok
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if _, i, ok = scanString(b, i); !ok {
					return i, false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return i, false
	}
	start := i
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i, i > start
		case '"', '{', '[', ':':
			return i, false
		}
		i++
	}
	return i, i > start
}

// literal reports whether b[i:] starts with lit, and the index after it.
func literal(b []byte, i int, lit string) (int, bool) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), true
	}
	return i, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// apiKind is the usage vocabulary of the API a copy was sent to.
type apiKind uint8

const (
	// apiChat: chat and completions, prompt_tokens and completion_tokens
	// (scanUsage).
	apiChat apiKind = iota
	// apiResponses: OpenAI Responses, input_tokens (cached tokens
	// included: input_tokens_details.cached_tokens is a part of it) and
	// output_tokens (scanAPIUsage).
	apiResponses
	// apiMessages: Anthropic Messages, whose input is input_tokens plus
	// cache_creation_input_tokens plus cache_read_input_tokens (Anthropic
	// counts the tokens written to and read from its prompt cache apart
	// from input_tokens), and output_tokens (scanAPIUsage).
	apiMessages
)

// Input parts of a Messages usage, as they index apiUsage.in and
// result.input: Responses has the first only.
const (
	partInput      = protocol.AnthropicInputTokens   // input_tokens
	partCacheWrite = protocol.AnthropicCacheCreation // cache_creation_input_tokens
	partCacheRead  = protocol.AnthropicCacheRead     // cache_read_input_tokens
	nParts         = len(protocol.AnthropicInput{})
)

// apiUsage is what scanAPIUsage found: each count and whether it was there.
type apiUsage struct {
	in     [nParts]int
	hasIn  [nParts]bool
	out    int
	hasOut bool
}

// scanAPIUsage takes the token counts of an Anthropic Messages (res.api
// apiMessages) or OpenAI Responses (apiResponses) answer or stream event b:
// a "usage" object at the top level (a Messages answer, its message_delta
// event; a Responses answer) or in a top-level "message" (message_start)
// or "response" object (response.completed). Each count present sets its
// part, one absent or null leaves it as an earlier event set it, as
// Anthropic's SDKs accumulate a stream (message_delta carries
// output_tokens, and its input counts, cumulative, only when not null);
// the prompt is then the sum of the input parts known: input_tokens, and
// for Messages cache_creation_input_tokens and cache_read_input_tokens,
// Anthropic's total input (its prompt caching guide). A document it cannot
// walk leaves res unchanged (as scanUsage).
func scanAPIUsage(b []byte, res *result) {
	if !bytes.Contains(b, keyUsage) {
		return
	}
	var u apiUsage
	end, ok := scanAPIObject(b, skipSpace(b, 0), &u, 0, res.api == apiMessages)
	if !ok || skipSpace(b, end) != len(b) {
		return
	}
	in := false
	for k := range u.in {
		if u.hasIn[k] {
			res.input[k], in = u.in[k], true
		}
	}
	if in {
		res.prompt, res.usage = res.input.Total(), true
	}
	if u.hasOut {
		res.complete, res.usage = u.out, true
	}
}

// scanAPIObject walks the object at b[i:] for scanAPIUsage (depth 0: the
// document, 1: its "message" or "response"); cache: the cache counts are
// input parts (Messages).
func scanAPIObject(b []byte, i int, u *apiUsage, depth int, cache bool) (end int, ok bool) {
	if i >= len(b) || b[i] != '{' {
		return i, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		key, j, ok := scanString(b, i)
		if !ok {
			return j, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		i = skipSpace(b, i+1)
		isObj := i < len(b) && b[i] == '{'
		switch {
		case isObj && string(key) == "usage":
			i, ok = scanAPICounts(b, i, u, cache)
		case isObj && depth == 0 && (string(key) == "message" || string(key) == "response"):
			i, ok = scanAPIObject(b, i, u, 1, cache)
		default:
			i, ok = skipValue(b, i)
		}
		if !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false
		}
		if b[i] == '}' {
			return i + 1, true
		}
		if b[i] != ',' {
			return i, false
		}
		i = skipSpace(b, i+1)
	}
}

// scanAPICounts reads a usage object's input_tokens, output_tokens and,
// with cache, cache_creation_input_tokens and cache_read_input_tokens.
func scanAPICounts(b []byte, i int, u *apiUsage, cache bool) (end int, ok bool) {
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	// count reads the count at b[i:] into *n: null is absent, as
	// json.Unmarshal into a *int leaves it.
	count := func(n *int, has *bool) {
		if j, isNull := literal(b, i, "null"); isNull {
			i, ok = j, true
			return
		}
		i, *n, ok = scanCount(b, i)
		*has = true
	}
	for {
		key, j, ok0 := scanString(b, i)
		if !ok0 {
			return j, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		i = skipSpace(b, i+1)
		// string(key) compared in place: converting it to a variable
		// would allocate for a key longer than 32 bytes.
		part := -1
		switch string(key) {
		case "input_tokens":
			part = partInput
		case "output_tokens":
			count(&u.out, &u.hasOut)
		case "cache_creation_input_tokens":
			part = partCacheWrite
		case "cache_read_input_tokens":
			part = partCacheRead
		default:
			i, ok = skipValue(b, i)
		}
		switch {
		case part == partInput || part > partInput && cache:
			count(&u.in[part], &u.hasIn[part])
		case part > partInput:
			i, ok = skipValue(b, i) // not this API's field
		}
		if !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false
		}
		if b[i] == '}' {
			return i + 1, true
		}
		if b[i] != ',' {
			return i, false
		}
		i = skipSpace(b, i+1)
	}
}
