package proxy

import (
	"bytes"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
)

// usage is the token usage an engine reported. The governance reconciles a
// user's quotas and TPM with it (govern.go), so it must be read right even
// when the usage object arrives cut in two by a read boundary (a long
// non-streaming body, or a stream's last event split over two TCP reads).
type usage struct {
	prompt, completion, cached int
	seen                       bool

	// carry holds the end of the last chunk scanned when it cut a usage
	// object (or its key): the next chunk is scanned joined to it.
	carry  [usageCarry]byte
	ncarry int
	// inStart: the last Anthropic event type named so far is
	// message_start (parseProtocol), for a usage object whose event began
	// in an earlier read.
	inStart bool
	// tail is the end of the last read, to find an event type cut by a
	// read boundary (scanProtocol).
	tail  [markerLen - 1]byte
	ntail int
}

// usageCarry bounds the bytes carried over a read boundary: a usage object
// (OpenAI's, vLLM's, SGLang's, with details) is 100-250 bytes.
const usageCarry = 384

var (
	keyUsage      = []byte(`"usage"`)
	keyPrompt     = []byte(`"prompt_tokens"`)
	keyCompletion = []byte(`"completion_tokens"`)
	keyCached     = []byte(`"cached_tokens"`)
	keyTotal      = []byte(`"total_tokens"`)
)

// scan looks for a usage object in b, the next chunk of a body (a whole
// body, or one read of a stream), and records its numbers. It is a byte
// search, not a JSON decode: cheap enough to run on every relayed chunk.
// It allocates nothing.
func (u *usage) scan(b []byte) { u.scanAPI(b, protocol.Chat) }

// scanAPI is scan for the usage objects of api's answers (scanProtocol).
func (u *usage) scanAPI(b []byte, api protocol.API) {
	if u.ncarry > 0 {
		// The Anthropic event type b begins in: b is read again below,
		// from its start, after this reading moved past it.
		inStart := u.inStart
		var w [2 * usageCarry]byte
		n := copy(w[:], u.carry[:u.ncarry])
		n += copy(w[n:], b)
		u.ncarry = 0
		u.parseAPI(w[:n], api)
		if u.ncarry > 0 && len(b) <= usageCarry {
			return // still cut, and b is all in the carry now
		}
		u.ncarry = 0
		u.inStart = inStart
	}
	u.parseAPI(b, api)
}

func (u *usage) parseAPI(b []byte, api protocol.API) {
	if api == protocol.Chat {
		u.parse(b)
		return
	}
	u.parseProtocol(b, api)
}

// parse reads the last usage object of b (a stream with usage in every
// event ends with the totals); when b ends inside it (or inside its key)
// the rest of b from the key on is carried to the next scan.
func (u *usage) parse(b []byte) {
	i := lastIndex(b, keyUsage)
	if i >= 0 {
		obj := b[i+len(keyUsage):]
		if objectEnd(obj) < 0 && len(b)-i <= usageCarry {
			u.ncarry = copy(u.carry[:], b[i:])
		}
		n, okPrompt := intAfter(obj, keyPrompt)
		if okPrompt {
			u.prompt, u.seen = n, true
		}
		n, okCompletion := intAfter(obj, keyCompletion)
		if okCompletion {
			u.completion, u.seen = n, true
		}
		if !okPrompt && !okCompletion {
			// vLLM's rerank answers before its RerankUsage had
			// prompt_tokens: {"total_tokens":N}, all of them prompt.
			if end := objectEnd(obj); end >= 0 {
				if n, ok := intAfter(obj[:end], keyTotal); ok {
					u.prompt, u.seen = n, true
				}
			}
		}
		if n, ok := intAfter(obj, keyCached); ok {
			u.cached = n
		}
		if u.ncarry > 0 {
			return
		}
	}
	// The next key may be cut: carry a tail of b (after the key found)
	// that begins it.
	after := len(b)
	if i >= 0 {
		after = len(b) - i - len(keyUsage)
	}
	if after == 0 || bytes.IndexByte(keyUsage, b[len(b)-1]) < 0 {
		return // an event's end, say: no key's start
	}
	for k := min(len(keyUsage)-1, after); k > 0; k-- {
		if bytes.HasSuffix(b, keyUsage[:k]) {
			u.ncarry = copy(u.carry[:], b[len(b)-k:])
			return
		}
	}
}

// lastIndex is bytes.LastIndex(b, key) by forward searches: bytes.Index
// is vectorised where LastIndex hashes byte by byte (Rabin-Karp), and a
// body or chunk holds the key once or not at all.
func lastIndex(b, key []byte) int {
	i := jsonscan.IndexKey(b, key)
	if i < 0 {
		return -1
	}
	for {
		j := jsonscan.IndexKey(b[i+1:], key)
		if j < 0 {
			return i
		}
		i += 1 + j
	}
}

// objectEnd is the length of the value after a "usage" key in b (its
// colon, then null or an object whose braces close: usage objects hold no
// strings with braces), or -1 when b ends before it does.
func objectEnd(b []byte) int {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == ':' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	if i == len(b) {
		return -1
	}
	if b[i] != '{' {
		if i+4 > len(b) {
			return -1
		}
		return i + 4 // null (or anything else: nothing to wait for)
	}
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

func intAfter(b, key []byte) (int, bool) {
	i := jsonscan.IndexKey(b, key)
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

// forget drops what was read: a partial answer's usage is not its own.
func (u *usage) forget() { *u = usage{} }

// record counts the usage in the metrics and on the worker that served it
// (nil when unknown), whose cached share of prompt tokens is its hit rate.
func (u *usage) record(w *fleet.Worker) {
	if !u.seen {
		return
	}
	mPromptTokens.Add(u.prompt)
	mOutputTokens.Add(u.completion)
	mCachedTokens.Add(u.cached)
	if w != nil {
		w.CountUsage(u.prompt, u.cached)
	}
}
