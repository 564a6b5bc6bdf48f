package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/infera/infera/internal/jsonscan"
)

// RepeatedKey returns a *FieldError for the first object key that appears
// twice in one object of data, compared as encoding/json matches a key to
// a field (case-insensitively), or nil; the error's path starts with
// prefix (the JSON path of data in the config, "" for a whole config).
// encoding/json keeps the last copy of a repeated key, or merges two
// copies of a section field by field, and a map keeps the last, so the
// first copy would silently do nothing. data must already have decoded as
// JSON (which bounds its nesting).
func RepeatedKey(data []byte, prefix string) error {
	// A scan that allocates nothing but for an error; where the scanner is
	// stricter than encoding/json (invalid UTF-8, which the decoder takes),
	// the decoder's tokens decide. Token by token, a config of 10,000
	// users allocated about ten times its size on every parse.
	r := repeatScan{d: data}
	end, err := r.value(jsonscan.SkipSpace(data, 0), maxRepeatLevels)
	var fe *FieldError
	switch {
	case errors.As(err, &fe):
		return r.located(prefix, fe)
	case err == nil && jsonscan.SkipSpace(data, end) == len(data):
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkRepeated(dec, prefix)
}

// maxRepeatLevels is encoding/json's nesting bound, which data already
// passed.
const maxRepeatLevels = 10001

// repeatScan finds the first key repeated in one object of d.
type repeatScan struct {
	d []byte
	// folded holds the folded keys of the objects open, one after the
	// other; keys[i] is a key's span in folded and its raw span in d.
	folded []byte
	keys   []repeatKey
	// path is the way to the value being scanned, for the error only.
	path []repeatStep
}

type repeatKey struct{ fs, fe, rs, re int }

// repeatStep is an object key (its raw span in d) or a list index (rs -1).
type repeatStep struct{ rs, re, index int }

func (r *repeatScan) value(i, levels int) (int, error) {
	d := r.d
	if i >= len(d) {
		return i, jsonscan.ErrSyntax
	}
	switch d[i] {
	case '{':
		if levels <= 0 {
			return i, jsonscan.ErrSyntax
		}
		keys0, folded0 := len(r.keys), len(r.folded)
		var many map[string]int // folded key -> index in keys, for a large object
		i = jsonscan.SkipSpace(d, i+1)
		if i < len(d) && d[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= len(d) || d[i] != '"' {
				return i, jsonscan.ErrSyntax
			}
			raw, j, err := jsonscan.ScanString(d, i)
			if err != nil {
				return j, err
			}
			k := repeatKey{fs: len(r.folded), rs: i + 1, re: i + 1 + len(raw)}
			r.folded = foldKeyBytes(r.folded, jsonscan.Key(raw))
			k.fe = len(r.folded)
			fk := r.folded[k.fs:k.fe]
			earlier := -1
			if many != nil {
				if o, ok := many[string(fk)]; ok {
					earlier = o
				}
			} else {
				for o := keys0; o < len(r.keys); o++ {
					if bytes.Equal(r.folded[r.keys[o].fs:r.keys[o].fe], fk) {
						earlier = o
						break
					}
				}
			}
			r.path = append(r.path, repeatStep{rs: k.rs, re: k.re})
			if earlier >= 0 {
				o := r.keys[earlier]
				return j, fieldErr("", "repeated key (%s came earlier in the same object; only one copy would count): give each setting once", quotedKey(string(jsonscan.Key(d[o.rs:o.re]))))
			}
			r.keys = append(r.keys, k)
			switch n := len(r.keys) - keys0; {
			case many != nil:
				many[string(fk)] = len(r.keys) - 1
			case n > 32: // past a few dozen keys, comparing each with all is slower
				many = make(map[string]int, 2*n)
				for o := keys0; o < len(r.keys); o++ {
					many[string(r.folded[r.keys[o].fs:r.keys[o].fe])] = o
				}
			}
			i = jsonscan.SkipSpace(d, j)
			if i >= len(d) || d[i] != ':' {
				return i, jsonscan.ErrSyntax
			}
			ve, err := r.value(jsonscan.SkipSpace(d, i+1), levels-1)
			if err != nil {
				return ve, err
			}
			r.path = r.path[:len(r.path)-1]
			i = jsonscan.SkipSpace(d, ve)
			if i >= len(d) {
				return i, jsonscan.ErrSyntax
			}
			if d[i] == '}' {
				r.keys, r.folded = r.keys[:keys0], r.folded[:folded0]
				return i + 1, nil
			}
			if d[i] != ',' {
				return i, jsonscan.ErrSyntax
			}
			i = jsonscan.SkipSpace(d, i+1)
		}
	case '[':
		if levels <= 0 {
			return i, jsonscan.ErrSyntax
		}
		n := 0
		i = jsonscan.SkipSpace(d, i+1)
		if i < len(d) && d[i] == ']' {
			return i + 1, nil
		}
		for {
			r.path = append(r.path, repeatStep{rs: -1, index: n})
			ve, err := r.value(jsonscan.SkipSpace(d, i), levels-1)
			if err != nil {
				return ve, err
			}
			r.path = r.path[:len(r.path)-1]
			n++
			i = jsonscan.SkipSpace(d, ve)
			if i >= len(d) {
				return i, jsonscan.ErrSyntax
			}
			if d[i] == ']' {
				return i + 1, nil
			}
			if d[i] != ',' {
				return i, jsonscan.ErrSyntax
			}
			i++
		}
	}
	return jsonscan.SkipValue(d, i, levels)
}

// located puts the path of the repeated key in front of fe.
func (r *repeatScan) located(prefix string, fe *FieldError) error {
	p := prefix
	for _, s := range r.path {
		if s.rs < 0 {
			p = fmt.Sprintf("%s[%d]", p, s.index)
			continue
		}
		p = joinPath(p, string(jsonscan.Key(r.d[s.rs:s.re])))
	}
	return &FieldError{Path: p, Msg: fe.Msg}
}

func walkRepeated(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("BUG: cannot walk a config that decoded: %w", err)
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]string{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return fmt.Errorf("BUG: cannot walk a config that decoded: %w", err)
			}
			k, _ := kt.(string)
			p := joinPath(path, k)
			fk := string(foldKeyBytes(nil, []byte(k)))
			if first, ok := seen[fk]; ok {
				return fieldErr(p, "repeated key (%s came earlier in the same object; only one copy would count): give each setting once", quotedKey(first))
			}
			seen[fk] = k
			if err := walkRepeated(dec, p); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := walkRepeated(dec, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
	}
	return err
}

// foldKeyBytes appends k folded as encoding/json folds a key to match it
// to a field name: two keys fold alike exactly when they would match the
// same field.
func foldKeyBytes(dst, k []byte) []byte {
	for i := 0; i < len(k); {
		if c := k[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(k[i:])
		for {
			r2 := unicode.SimpleFold(r)
			if r2 <= r {
				r = r2
				break
			}
			r = r2
		}
		dst = utf8.AppendRune(dst, r)
		i += n
	}
	return dst
}

// maxQuotedKey bounds the bytes of a key or a name an error repeats: the
// admin API answers these errors, and a body may be one key (or one
// user name, template name, header name) of megabytes.
const maxQuotedKey = 64

// quotedKey is key quoted for an error, cut to maxQuotedKey bytes (at a
// character) with "..." when longer.
func quotedKey(key string) string {
	if len(key) > maxQuotedKey {
		cut := maxQuotedKey
		for cut > 0 && !utf8.RuneStart(key[cut]) {
			cut--
		}
		key = key[:cut] + "..."
	}
	return strconv.Quote(key)
}
