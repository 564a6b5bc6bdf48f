package jinja

import (
	"math"
	"unicode"
	"unicode/utf8"
)

// appendPyRepr appends v as Python's repr writes it, which is how Python's
// jinja2 prints a list or a dict (str of a container is the repr of its
// items): strings quoted and escaped as repr does, None, True and False,
// {'k': v} and [a, b], (a,) for a one-item tuple. A container nested
// deeper than maxJSONDepth is written [...] (or {...}), as Python writes a
// recursive one; once dst is past limit nothing more is written (callers
// check the output's size).
func appendPyRepr(dst []byte, v Value, depth, limit int) []byte {
	if len(dst) > limit {
		return dst
	}
	switch v.kind {
	case KindString:
		return appendPyStr(dst, v.str)
	case KindNull:
		return append(dst, "None"...)
	case KindUndefined:
		return append(dst, "Undefined"...)
	case KindBool:
		if v.num != 0 {
			return append(dst, "True"...)
		}
		return append(dst, "False"...)
	case KindInt:
		return appendInt(dst, v)
	case KindFloat:
		switch {
		case math.IsNaN(v.num):
			return append(dst, "nan"...)
		case math.IsInf(v.num, 1):
			return append(dst, "inf"...)
		case math.IsInf(v.num, -1):
			return append(dst, "-inf"...)
		}
		return pyFloat(dst, v.num)
	case KindArray, KindTuple:
		open, end := byte('['), byte(']')
		if v.kind == KindTuple {
			open, end = '(', ')'
		}
		if depth >= maxJSONDepth {
			return append(dst, open, '.', '.', '.', end)
		}
		dst = append(dst, open)
		for i, it := range v.arr.items {
			if i > 0 {
				dst = append(dst, ',', ' ')
			}
			dst = appendPyRepr(dst, it, depth+1, limit)
			if len(dst) > limit {
				return dst
			}
		}
		if v.kind == KindTuple && len(v.arr.items) == 1 {
			dst = append(dst, ',')
		}
		return append(dst, end)
	case KindObject, KindKwargs, KindNamespace:
		if v.kind == KindNamespace {
			dst = append(dst, "<Namespace "...)
		}
		if depth >= maxJSONDepth {
			dst = append(dst, "{...}"...)
		} else {
			dst = append(dst, '{')
			for i, k := range v.obj.keys {
				if i > 0 {
					dst = append(dst, ',', ' ')
				}
				dst = appendPyStr(dst, k)
				dst = append(dst, ':', ' ')
				dst = appendPyRepr(dst, v.obj.vals[i], depth+1, limit)
				if len(dst) > limit {
					return dst
				}
			}
			dst = append(dst, '}')
		}
		if v.kind == KindNamespace {
			dst = append(dst, '>')
		}
		return dst
	}
	return appendString(dst, v)
}

// appendPyStr appends s as Python's repr of a str: in single quotes, or in
// double quotes when s holds a single quote and no double quote; the quote,
// backslash, \t, \n and \r escaped, other non-printable characters as
// \xhh, \uhhhh or \Uhhhhhhhh (printable as str.isprintable: not a control,
// format, surrogate, private-use, unassigned or separator character but
// the space). A byte that is not UTF-8 is written \xhh.
func appendPyStr(dst []byte, s string) []byte {
	quote := byte('\'')
	hasSingle, hasDouble := false, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\'':
			hasSingle = true
		case '"':
			hasDouble = true
		}
	}
	if hasSingle && !hasDouble {
		quote = '"'
	}
	dst = append(dst, quote)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == quote || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c < 0x20 || c == 0x7f:
				dst = append(dst, '\\', 'x', hexDigits[c>>4], hexDigits[c&15])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			dst = append(dst, '\\', 'x', hexDigits[c>>4], hexDigits[c&15])
		case unicode.IsPrint(r):
			dst = append(dst, s[i:i+n]...)
		case r < 0x100:
			dst = append(dst, '\\', 'x', hexDigits[r>>4], hexDigits[r&15])
		case r < 0x10000:
			dst = appendU4(dst, r)
		default:
			dst = append(dst, '\\', 'U')
			for sh := 28; sh >= 0; sh -= 4 {
				dst = append(dst, hexDigits[r>>sh&15])
			}
		}
		i += n
	}
	return append(dst, quote)
}
