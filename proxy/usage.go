package proxy

import "bytes"

// usage is the token usage an engine reported.
type usage struct {
	prompt, completion, cached int
	seen                       bool
}

var (
	keyUsage      = []byte(`"usage"`)
	keyPrompt     = []byte(`"prompt_tokens"`)
	keyCompletion = []byte(`"completion_tokens"`)
	keyCached     = []byte(`"cached_tokens"`)
)

// scan looks for a usage object in b (a whole body or one SSE chunk) and
// records its numbers. It is a byte search, not a JSON decode: cheap enough
// to run on every relayed chunk.
func (u *usage) scan(b []byte) {
	i := bytes.Index(b, keyUsage)
	if i < 0 {
		return
	}
	b = b[i+len(keyUsage):]
	if n, ok := intAfter(b, keyPrompt); ok {
		u.prompt, u.seen = n, true
	}
	if n, ok := intAfter(b, keyCompletion); ok {
		u.completion, u.seen = n, true
	}
	if n, ok := intAfter(b, keyCached); ok {
		u.cached = n
	}
}

func intAfter(b, key []byte) (int, bool) {
	i := bytes.Index(b, key)
	if i < 0 {
		return 0, false
	}
	i += len(key)
	for i < len(b) && (b[i] == ' ' || b[i] == ':') {
		i++
	}
	n, ok := 0, false
	for i < len(b) && b[i] >= '0' && b[i] <= '9' && n < 1<<40 {
		n = n*10 + int(b[i]-'0')
		i++
		ok = true
	}
	return n, ok
}

func (u *usage) record() {
	if !u.seen {
		return
	}
	mPromptTokens.Add(u.prompt)
	mOutputTokens.Add(u.completion)
	mCachedTokens.Add(u.cached)
}
