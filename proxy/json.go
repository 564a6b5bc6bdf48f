package proxy

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"unicode"
	"unsafe"

	"github.com/infera/infera/internal/jsonscan"
)

// The request path's JSON: a validating scanner (internal/jsonscan) that
// walks the body once, never allocates, and extracts the few fields routing
// needs. Everything else is skipped (and validated) without being decoded.
// Keys are compared decoded, strings must be valid UTF-8, and nesting is
// bounded at maxDepth. The functions below fix those choices for the
// package; they inline to the jsonscan calls.

var errJSON = jsonscan.ErrSyntax

// maxDepth is how deep a request body may nest (containers, the outermost
// one included).
const maxDepth = 256

func isSpace(c byte) bool { return jsonscan.IsSpace(c) }

func skipSpace(d []byte, i int) int { return jsonscan.SkipSpace(d, i) }

// skipValue validates the value starting at d[i], nested depth deep, and
// returns the index after it.
func skipValue(d []byte, i, depth int) (int, error) {
	return jsonscan.SkipValue(d, i, maxDepth-depth)
}

// scanString validates the string starting at d[i] (a quote) and returns the
// raw contents (escapes not decoded), the index after the closing quote.
func scanString(d []byte, i int) (raw []byte, next int, err error) {
	return jsonscan.ScanString(d, i)
}

// unescape appends the decoded form of a validated raw string to dst.
func unescape(dst, raw []byte) []byte { return jsonscan.Unescape(dst, raw) }

// forEachField calls f for each member of the object at d[i]; f gets the
// decoded key and the value's [start, end) span. It validates the whole
// object.
func forEachField(d []byte, i int, f func(key []byte, vs, ve int) error) (int, error) {
	return jsonscan.WalkObject(d, i, maxDepth, f)
}

// forEachElem calls f for each element span of the array at d[i].
func forEachElem(d []byte, i int, f func(vs, ve int) error) (int, error) {
	return jsonscan.WalkArray(d, i, maxDepth, f)
}

// walkObjectInline walks the top-level object at d[i] for callers that
// parse some values themselves, so that a large value is scanned once, not
// validated first and parsed again: f gets the decoded key and the value's
// start; it returns the value's end, or -1 to let the walker skip (and
// validate) the value.
func walkObjectInline(d []byte, i int, f func(key []byte, vs int) (int, error)) (int, error) {
	return jsonscan.WalkObjectInline(d, i, maxDepth, f)
}

// walkElements walks the array at d[i] for callers that parse its
// elements themselves: value gets an element's start and returns the index
// after it, having validated it (walkObject, skipValue).
func walkElements(d []byte, i int, value func(vs int) (int, error)) (int, error) {
	return jsonscan.WalkElements(d, i, value)
}

// walkObject validates the object at d[i], nested depth deep (the object
// itself at depth), calling f for each member (forEachField). It returns
// the index after the object.
func walkObject(d []byte, i, depth int, f func(key []byte, vs, ve int) error) (int, error) {
	return jsonscan.WalkObject(d, i, maxDepth-depth, f)
}

// parseInt reads v as strconv.ParseInt(v, 10, 64) does (an optional
// sign, then decimal digits) and returns it when it lies in [0, 1<<31].
func parseInt(v []byte) (int, bool) {
	i := 0
	if len(v) > 0 && (v[0] == '-' || v[0] == '+') {
		i = 1
	}
	if i == len(v) {
		return 0, false
	}
	n := 0
	for ; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n = n*10 + int(c-'0'); n > 1<<31 {
			return 0, false // too large, or not a number: refused either way
		}
	}
	if v[0] == '-' && n != 0 {
		return 0, false
	}
	return n, true
}

// laxInt reads the JSON value v as vLLM's request models (pydantic's lax
// int) read an int field, for a count the router must not read lower
// than the engine does: an integer; a number with an integral value
// (3.0, 3e0); a string of one, with white space around it, a '+', '_'
// between digits, or a fraction of zeros ("3", " +3 ", "3.00"). It
// returns it capped at 1<<31, or -1 for anything else (null, 3.5, "x",
// a negative one).
// A plain integer takes parseInt alone; the rest is hostile or rare.
func laxInt(v []byte) int {
	if n, ok := parseInt(v); ok {
		return n
	}
	if len(v) == 0 {
		return -1
	}
	if v[0] == '-' || v[0] >= '0' && v[0] <= '9' {
		f, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(v), len(v)), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) || f != math.Trunc(f) || f < 0 {
			return -1
		}
		return int(min(f, 1<<31))
	}
	if v[0] != '"' {
		return -1
	}
	var buf [64]byte
	s := v[1 : len(v)-1]
	if jsonscan.HasEscape(s) {
		s = unescape(buf[:0], s)
	}
	s = bytes.TrimFunc(s, unicode.IsSpace)
	if len(s) > 0 && s[0] == '+' {
		s = s[1:]
	}
	if i := bytes.IndexByte(s, '.'); i >= 0 {
		for _, c := range s[i+1:] {
			if c != '0' {
				return -1
			}
		}
		s = s[:i]
	}
	n := 0
	for i, c := range s {
		switch {
		case c >= '0' && c <= '9':
			n = min(n*10+int(c-'0'), 1<<31)
		case c == '_' && i > 0 && i < len(s)-1 && s[i-1] != '_':
		default:
			return -1
		}
	}
	if len(s) == 0 {
		return -1
	}
	return n
}

// appendJSONString appends s as a JSON string literal (invalid UTF-8 is
// replaced by U+FFFD).
func appendJSONString(dst []byte, s string) []byte { return jsonscan.AppendString(dst, s) }
