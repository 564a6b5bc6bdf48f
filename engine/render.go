package engine

import (
	"strconv"

	"encoding/json"
)

// fillerWords are the generated tokens, cycled: token i (0-based) is
// fillerWords[i % len]. They need no JSON escaping.
var fillerWords = [...]string{
	" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy",
	" dog", ".", " A", " simulated", " engine", " streams", " one", " token",
	" per", " step", ",", " and", " every", " step", " costs", " time",
	" that", " grows", " with", " the", " batch", ";", " cached", " prefixes",
	" skip", " prefill", ".", " Routers", " should", " send", " shared",
	" prompts", " to", " warm", " caches", " and", " spread", " load", ".", "\\n",
}

// chunk pieces pre-rendered once. A streamed chunk's choices end with
// `}]`: tokenStream.endChunk closes it (with its usage when continuous
// usage stats are on).
var (
	chatTokenPrefix = []byte(`"choices":[{"index":0,"delta":{"content":"`)
	chatTokenSuffix = []byte(`"},"logprobs":null,"finish_reason":null}]`)
	chatRoleChunk   = []byte(`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`)
	chatFinalChunk  = []byte(`"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]`)
	cmplTokenPrefix = []byte(`"choices":[{"index":0,"text":"`)
	cmplTokenSuffix = []byte(`","logprobs":null,"finish_reason":null}]`)
	cmplFinalChunk  = []byte(`"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]`)
	usagePrefix     = []byte(`"choices":[],"usage":`)
	doneChunk       = []byte("data: [DONE]\n\n")
)

// appendHead appends `{"id":"<id>","object":"<object>","created":<created>,"model":<model>,`.
func appendHead(dst []byte, idPrefix string, id uint64, object string, created int64, modelJSON []byte) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, idPrefix...)
	dst = strconv.AppendUint(dst, id, 16)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, modelJSON...)
	dst = append(dst, ',')
	return dst
}

func appendUsage(dst []byte, prompt, completion, cached int) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(cached), 10)
	dst = append(dst, `}}`...)
	return dst
}

func appendFiller(dst []byte, from, to int) []byte {
	for i := from; i < to; i++ {
		dst = append(dst, fillerWords[i%len(fillerWords)]...)
	}
	return dst
}

// appendFullResponse renders a non-streaming response of n tokens.
func appendFullResponse(dst []byte, chat bool, head []byte, n, prompt, cached int) []byte {
	dst = append(dst, head...)
	if chat {
		dst = append(dst, `"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		dst = appendFiller(dst, 0, n)
		dst = append(dst, `"},"logprobs":null,"finish_reason":"length"}],"usage":`...)
	} else {
		dst = append(dst, `"choices":[{"index":0,"text":"`...)
		dst = appendFiller(dst, 0, n)
		dst = append(dst, `","logprobs":null,"finish_reason":"length"}],"usage":`...)
	}
	dst = appendUsage(dst, prompt, n, cached)
	return append(dst, '}')
}

// appendError renders an OpenAI error object.
func appendError(dst []byte, msg, typ string) []byte {
	m, _ := json.Marshal(msg) // a string always marshals
	dst = append(dst, `{"error":{"message":`...)
	dst = append(dst, m...)
	dst = append(dst, `,"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","param":null,"code":null}}`...)
	return dst
}
