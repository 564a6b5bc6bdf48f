package tokenizer

import "unicode/utf8"

// cutSearch bounds how far back Cut looks for a word boundary.
const cutSearch = 4096

// Cut returns how much of text, at most limit bytes, a caller that cannot
// afford to encode all of it (the router, hashing a prompt's leading blocks)
// should encode: a length n for which t's tokens of text[:n] are the leading
// tokens of its encoding of text, so that the block hashes of the prefix
// are those of the whole. n == len(text) when text fits (or limit <= 0).
//
// Simple cuts on its 4-byte token boundary. HF cuts before a space that
// separates two non-space characters: every alternative of the built-in
// split patterns starts a new pre-token at such a space and none ends
// differently at the end of the text than before it, NFC never composes
// across a space, and added tokens are matched first (Cut gives up on a
// tokenizer whose added tokens hold that pattern). Without such a space in
// the last cutSearch bytes the cut falls on a character boundary, and only
// the last word before it may be encoded differently. Other tokenizers get
// limit.
func Cut(t Tokenizer, text []byte, limit int) int {
	if limit <= 0 || len(text) <= limit {
		return len(text)
	}
	switch t := t.(type) {
	case Simple, *Simple:
		return limit &^ 3
	case *HF:
		if !t.spacedAdded {
			if i := spacedAt(text, max(limit-cutSearch, 1), limit); i >= 0 {
				return i
			}
		}
		i := limit
		for i > 0 && !utf8.RuneStart(text[i]) {
			i--
		}
		return i
	}
	return limit
}

// spacedAt returns the index i in [lo, hi] of the last ' ' of s between two
// non-space characters, or -1.
func spacedAt(s []byte, lo, hi int) int {
	for i := min(hi, len(s)-2); i >= max(lo, 1); i-- {
		if s[i] != ' ' {
			continue
		}
		next, _ := utf8.DecodeRune(s[i+1:])
		prev, _ := utf8.DecodeLastRune(s[:i])
		if !isSpace(next) && !isSpace(prev) {
			return i
		}
	}
	return -1
}
