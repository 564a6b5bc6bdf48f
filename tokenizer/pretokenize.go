package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The split patterns the hand-written pre-tokenizer implements. Go's regexp
// has no lookahead, so splitWords below is a direct transcription of these
// alternations with the backtracking the regex engines perform.
const (
	// qwen2Pattern is used by Qwen2/Qwen2.5/Qwen3 (digits split one by one).
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// cl100kPattern is GPT-4's and Llama 3's (digits in runs of up to 3).
	cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// isSpace is \s as the reference (JavaScript, u flag) defines it.
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return (r|0x20) >= 'a' && (r|0x20) <= 'z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= '0' && r <= '9'
	}
	return unicode.IsNumber(r)
}

func decodeAt(s []byte, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRune(s[i:])
}

// splitWords calls emit for each pre-token of s, in order, as the pattern
// (qwen2Pattern when maxDigits is 1, cl100kPattern when it is 3) splits it
// with the "Isolated" behaviour. Invalid UTF-8 bytes count as symbols.
func splitWords(s []byte, maxDigits int, emit func(word []byte)) {
	for i := 0; i < len(s); {
		n := matchAt(s, i, maxDigits)
		emit(s[i : i+n])
		i += n
	}
}

// matchAt returns the length of the pattern's match at s[i:] (always > 0).
func matchAt(s []byte, i, maxDigits int) int {
	r, size := decodeAt(s, i)
	// 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' && i+1 < len(s) {
		c1 := s[i+1] | 0x20
		var c2 byte
		if i+2 < len(s) {
			c2 = s[i+2] | 0x20
		}
		switch {
		case c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd':
			return 2
		case (c1 == 'r' || c1 == 'v') && c2 == 'e', c1 == 'l' && c2 == 'l':
			return 3
		}
	}
	// 2. [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return i + size + letterRun(s, i+size) - i
	}
	if r != '\r' && r != '\n' && !isNumber(r) {
		if r2, _ := decodeAt(s, i+size); r2 >= 0 && isLetter(r2) {
			return size + letterRun(s, i+size)
		}
	}
	// 3. \p{N} or \p{N}{1,3}
	if isNumber(r) {
		n := size
		for k := 1; k < maxDigits; k++ {
			r2, sz := decodeAt(s, i+n)
			if r2 < 0 || !isNumber(r2) {
				break
			}
			n += sz
		}
		return n
	}
	// 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := i
	if r == ' ' {
		j += size
	}
	if k := symbolRun(s, j); k > 0 {
		j += k
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j - i
	}
	// Only whitespace remains possible here.
	end, lastNL, nChars := i, -1, 0
	var lastSize int
	for end < len(s) {
		r2, sz := decodeAt(s, end)
		if !isSpace(r2) {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			lastNL = end
		}
		end += sz
		lastSize = sz
		nChars++
	}
	if nChars == 0 {
		// Not reachable for valid patterns (every rune is a letter, a number,
		// whitespace or a symbol); consume one rune to guarantee progress.
		return size
	}
	// 5. \s*[\r\n]+
	if lastNL >= 0 {
		return lastNL + 1 - i
	}
	// 6. \s+(?!\S)
	if end == len(s) {
		return end - i
	}
	if nChars > 1 {
		return end - lastSize - i
	}
	// 7. \s+
	return end - i
}

// ASCII character classes for the runs below: most text is ASCII, and a
// table lookup beats decoding and classifying each rune.
const (
	clsOther = iota // a symbol: not \s, \p{L} or \p{N}
	clsLetter
	clsDigit
	clsSpace
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		r := rune(c)
		switch {
		case isLetter(r):
			t[c] = clsLetter
		case isNumber(r):
			t[c] = clsDigit
		case isSpace(r):
			t[c] = clsSpace
		}
	}
	return t
}()

func letterRun(s []byte, i int) int {
	j := i
	for j < len(s) {
		if c := s[j]; c < utf8.RuneSelf {
			if asciiClass[c] != clsLetter {
				break
			}
			j++
			continue
		}
		r, sz := utf8.DecodeRune(s[j:])
		if !unicode.IsLetter(r) {
			break
		}
		j += sz
	}
	return j - i
}

// symbolRun returns the byte length of the [^\s\p{L}\p{N}]+ run at s[i:].
func symbolRun(s []byte, i int) int {
	j := i
	for j < len(s) {
		if c := s[j]; c < utf8.RuneSelf {
			if asciiClass[c] != clsOther {
				break
			}
			j++
			continue
		}
		r, sz := utf8.DecodeRune(s[j:])
		if isSpace(r) || isLetter(r) || isNumber(r) {
			break
		}
		j += sz
	}
	return j - i
}
