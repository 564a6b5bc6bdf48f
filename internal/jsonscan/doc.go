// Package jsonscan is the lexical core of the JSON that infera reads on its
// request and conversion paths: a validating scanner over a []byte that
// never allocates on valid input with plain keys. It locates values by
// [start, end) spans, validates what it skips (strict RFC 8259 grammar,
// UTF-8 in strings, no raw control characters), decodes string escapes as a
// JSON decoder would (so "mod\u0065l" is "model"), and appends strings as
// JSON literals.
//
// Callers choose how deep a document may nest: every function that opens
// containers takes levels, how many more containers may be opened from
// here (a container needs levels > 0; its members get levels-1).
//
// It knows nothing of HTTP, OpenAI or Anthropic bodies: proxy/ and
// protocol/ build their field extraction on it. It has no dependencies
// beyond the standard library.
package jsonscan
