package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"
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
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkRepeated(dec, prefix)
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
			fk := string(foldKey(nil, k))
			if first, ok := seen[fk]; ok {
				return fieldErr(p, "repeated key (%q came earlier in the same object; only one copy would count): give each setting once", first)
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

// foldKey appends k folded as encoding/json folds a key to match it to a
// field name: two keys fold alike exactly when they would match the same
// field.
func foldKey(dst []byte, k string) []byte {
	for i := 0; i < len(k); {
		if c := k[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(k[i:])
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
