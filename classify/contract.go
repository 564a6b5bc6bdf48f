package classify

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
)

// MaxAnswerBytes bounds a classifier's answer.
const MaxAnswerBytes = 64 << 10

// AppendRequest appends the classifier request body for a request for
// model with prompt text: {"model":...,"text":...,"text_bytes":N}. A text
// longer than maxText bytes is cut to its last maxText bytes, at a UTF-8
// boundary (the end of a conversation says most about what is asked);
// text_bytes is always the full length. Invalid UTF-8 becomes U+FFFD, so
// the body is valid JSON whatever the input.
func AppendRequest(dst, model, text []byte, maxText int) []byte {
	n := len(text)
	if maxText >= 0 && len(text) > maxText {
		text = text[len(text)-maxText:]
		// Skip continuation bytes of a rune cut in half (at most 3).
		for i := 0; i < 3 && len(text) > 0 && !utf8.RuneStart(text[0]); i++ {
			text = text[1:]
		}
	}
	dst = append(dst, `{"model":`...)
	dst = appendJSONString(dst, model)
	dst = append(dst, `,"text":`...)
	dst = appendJSONString(dst, text)
	dst = append(dst, `,"text_bytes":`...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Errors of ParseAnswer. They never quote the answer.
var (
	ErrAnswerNotObject = errors.New("classifier answer is not a JSON object")
	ErrAnswerNoTier    = errors.New(`classifier answer has no "tier" string`)
	ErrAnswerBadTier   = errors.New(`classifier answer's "tier" is not L1, L2 or L3`)
	ErrAnswerTooLarge  = errors.New("classifier answer is larger than 64 KiB")
)

// ParseAnswer parses a classifier's answer: one JSON object whose "tier"
// member is the string "L1", "L2" or "L3" (ASCII case of the value
// ignored; other members ignored; keys are exact; with duplicate keys the
// last wins, as in a JSON decoder, and a last "tier" that is null or not a
// string is no tier; escapes are decoded). It validates the whole document
// and does not allocate unless a key or the tier holds escapes.
func ParseAnswer(b []byte) (Tier, error) {
	if len(b) > MaxAnswerBytes {
		return TierUnknown, ErrAnswerTooLarge
	}
	if !json.Valid(b) {
		return TierUnknown, ErrAnswerNotObject
	}
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return TierUnknown, ErrAnswerNotObject
	}
	i++
	found, tier := false, TierUnknown
	for {
		i = skipWS(b, i)
		if b[i] == '}' {
			break
		}
		if b[i] == ',' {
			i = skipWS(b, i+1)
		}
		// A key (b is valid JSON: a string, then ':').
		ks := i
		i = skipString(b, i)
		key := b[ks:i]
		i = skipWS(b, i) + 1 // ':'
		i = skipWS(b, i)
		vs := i
		i = skipValue(b, i)
		if !isTierKey(key) {
			continue
		}
		v := b[vs:i]
		switch {
		case v[0] != '"':
			// The last "tier" member decides: null or a non-string is
			// no tier.
			found, tier = false, TierUnknown
		case bytes.IndexByte(v, '\\') >= 0:
			var sv string
			if err := json.Unmarshal(v, &sv); err != nil {
				return TierUnknown, ErrAnswerNotObject
			}
			found, tier = true, ParseTier(sv)
		default:
			found, tier = true, ParseTier(v[1:len(v)-1])
		}
	}
	switch {
	case !found:
		return TierUnknown, ErrAnswerNoTier
	case tier == TierUnknown:
		return TierUnknown, ErrAnswerBadTier
	}
	return tier, nil
}

// isTierKey reports whether a JSON string literal (quotes included) is
// "tier".
func isTierKey(k []byte) bool {
	if string(k) == `"tier"` {
		return true
	}
	if len(k) > 64 || bytes.IndexByte(k, '\\') < 0 {
		return false
	}
	var s string
	return json.Unmarshal(k, &s) == nil && s == "tier"
}

// The scanners below assume b is valid JSON (checked first).

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string literal starting at i.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the value starting at i.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}
