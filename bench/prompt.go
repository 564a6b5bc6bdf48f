package bench

import (
	"strconv"

	"github.com/infera/infera/tokenizer"
)

// PromptConfig maps trace hash ids to prompt content.
//
// Each hash id stands for one block of TokensPerBlock tokens, rendered as
// TokensPerBlock*BytesPerToken bytes of deterministic text seeded by the id:
// equal ids give byte-identical blocks, so requests sharing a leading run of
// ids share a byte-identical prefix; different ids give different blocks (the
// id is spelled at the start of its block). The text is lowercase ASCII words,
// digits, brackets and spaces only, so it needs no JSON escaping. With the
// engine's default tokenizer (tokenizer.Simple, 4 bytes per token) a block of
// 512 tokens is 2048 bytes, i.e. exactly 512 tokens.
type PromptConfig struct {
	// TokensPerBlock is the number of tokens one hash id stands for
	// (512 in Mooncake traces).
	TokensPerBlock int
	// BytesPerToken is how many bytes of text make one token under the
	// target tokenizer (4 for tokenizer.Simple; about 4 for English BPE).
	BytesPerToken int
	// Seed changes all generated content (0 is a fine default).
	Seed uint64
}

// DefaultPromptConfig matches Mooncake traces and tokenizer.Simple.
func DefaultPromptConfig() PromptConfig {
	return PromptConfig{TokensPerBlock: TraceBlockTokens, BytesPerToken: 4}
}

func (c *PromptConfig) norm() (tpb, bpt int) {
	tpb, bpt = c.TokensPerBlock, c.BytesPerToken
	if tpb <= 0 {
		tpb = TraceBlockTokens
	}
	if bpt <= 0 {
		bpt = 4
	}
	return tpb, bpt
}

// BlockBytes returns the length in bytes of one block's text.
func (c *PromptConfig) BlockBytes() int {
	tpb, bpt := c.norm()
	return tpb * bpt
}

var words = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
	"be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
	"but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
	"can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
	"so", "no", "model", "token", "cache", "router", "prefix", "engine", "request",
	"latency", "batch", "kernel", "memory", "tensor", "layer", "query", "answer",
	"system", "user", "tool", "agent", "search", "result", "value", "error", "code",
	"function", "return", "string", "number", "list", "table", "file", "path", "data",
}

// splitmix64 is a tiny, good-enough PRNG step.
func splitmix64(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// AppendBlock appends the text of block id (exactly BlockBytes bytes).
func (c *PromptConfig) AppendBlock(dst []byte, id int64) []byte {
	return c.appendFill(dst, 'b', uint64(id), c.BlockBytes())
}

// appendFill appends exactly n bytes of text seeded by (kind, id).
func (c *PromptConfig) appendFill(dst []byte, kind byte, id uint64, n int) []byte {
	if n <= 0 {
		return dst
	}
	start := len(dst)
	dst = append(dst, '[', kind)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, "] "...)
	s := c.Seed ^ (id * 0x2545f4914f6cdd1d) ^ uint64(kind)<<56
	for len(dst)-start < n {
		r := splitmix64(&s)
		for k := 0; k < 4 && len(dst)-start < n; k++ {
			dst = append(dst, words[int(r&0xffff)%len(words)]...)
			dst = append(dst, ' ')
			r >>= 16
		}
	}
	return dst[:start+n]
}

// AppendPrompt appends the prompt text of a request of inputTokens tokens
// whose blocks are hashIDs: the blocks' text in order, cut to
// inputTokens*BytesPerToken bytes; past the last id the prompt is padded with
// text unique to salt (pass a distinct value per request).
func (c *PromptConfig) AppendPrompt(dst []byte, hashIDs []int64, inputTokens int, salt uint64) []byte {
	_, bpt := c.norm()
	want := inputTokens * bpt
	if want <= 0 {
		return dst
	}
	start := len(dst)
	bb := c.BlockBytes()
	for _, id := range hashIDs {
		if len(dst)-start >= want {
			break
		}
		dst = c.AppendBlock(dst, id)
	}
	for pad := uint64(0); len(dst)-start < want; pad++ {
		dst = c.appendFill(dst, 'u', salt*1_000_003+pad, bb)
	}
	return dst[:start+want]
}

// AppendPromptTokens appends the token ids of the same prompt as
// AppendPrompt, encoded with tokenizer.Simple (for /v1/completions token
// arrays). scratch is reused for the text and returned.
func (c *PromptConfig) AppendPromptTokens(dst []uint32, scratch []byte, hashIDs []int64, inputTokens int, salt uint64) ([]uint32, []byte) {
	scratch = c.AppendPrompt(scratch[:0], hashIDs, inputTokens, salt)
	return tokenizer.Simple{}.Encode(dst, scratch), scratch
}
