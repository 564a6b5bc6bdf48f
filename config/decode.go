package config

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/infera/infera/internal/jsonscan"
)

// decodeConfig decodes the config document data (one JSON object, trimmed)
// over defaults(), refusing unknown fields, with the errors of a json.Decoder with
// DisallowUnknownFields.
//
// A json.Decoder copies the whole document into a buffer of its own before
// it decodes (a buffer grown by doubling, so up to twice the document, and
// the smaller ones before it as garbage): for an import of 50,000 users
// (12 MB) that was 17 MB live beside the document and the config, and the
// largest part of the import's peak. json.Unmarshal decodes from data
// itself, but cannot refuse unknown fields: onlyKnownKeys checks them on
// the bytes, conservatively (a key it cannot vouch for, such as one that
// matches a field only in another case, counts as unknown). Whenever
// Unmarshal fails or a key may be unknown, the document is decoded again
// with the json.Decoder, which decides: what is accepted, what is refused
// and every error are the Decoder's, as before.
func decodeConfig(data []byte, defaults func() *Config) (*Config, error) {
	c := defaults()
	if n := usersIn(data); n > 0 && c.Users == nil {
		c.Users = make([]User, 0, n)
	}
	if json.Unmarshal(data, c) == nil && onlyKnownKeys(data, jsonscan.SkipSpace(data, 0), reflect.TypeFor[Config](), maxKnownLevels) {
		return c, nil
	}
	// Unmarshal may have set some fields before it failed: from the
	// defaults again.
	c = defaults()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, decodeError(err, data, reflect.TypeFor[Config]())
	}
	if dec.More() || dec.InputOffset() != int64(len(data)) {
		return nil, &FieldError{Msg: fmt.Sprintf("unexpected data after the JSON object at byte %d", dec.InputOffset())}
	}
	return c, nil
}

// usersIn counts the members of the document's users list (the last one,
// which encoding/json keeps), 0 when there is none or it cannot tell.
// encoding/json decodes a list into the slice it finds, growing it only
// past its capacity: a users list decoded into a nil slice was grown a
// quarter at a time, which for 50,000 users allocated about five times
// the final list (21 MB) while the document and the config were both
// live, and kept up to a quarter more than the users.
func usersIn(data []byte) int {
	n := 0
	jsonscan.WalkMembers(data, 0, func(raw []byte, vs int) (int, error) {
		if string(raw) != "users" || data[vs] != '[' {
			return jsonscan.SkipValue(data, vs, maxKnownLevels-1)
		}
		m := 0
		ve, err := jsonscan.WalkArray(data, vs, maxKnownLevels-1, func(int, int) error {
			m++
			return nil
		})
		if err == nil {
			n = m
		}
		return ve, err
	})
	return n
}

// maxKnownLevels bounds the nesting onlyKnownKeys walks: deeper documents
// are left to the Decoder (a config nests a handful of levels).
const maxKnownLevels = 64

var errMaybeUnknown = errors.New("a key may be unknown")

// onlyKnownKeys reports whether every key of the value at d[i] that
// encoding/json would decode into a struct field of t (at any depth) names
// a field exactly, so that a json.Decoder with DisallowUnknownFields would
// not refuse it for an unknown field. It says false whenever it cannot
// tell: a key that matches a field only without regard to case, a struct
// with embedded fields, a value of another kind than t's, bytes jsonscan
// refuses (invalid UTF-8, which encoding/json reads as U+FFFD), nesting
// deeper than levels. Values decoded by their own UnmarshalJSON or
// UnmarshalText (User, Secret, ...) are theirs to check, under Unmarshal as
// under the Decoder, whose DisallowUnknownFields does not reach them.
func onlyKnownKeys(d []byte, i int, t reflect.Type, levels int) bool {
	if i >= len(d) || levels <= 0 {
		return false
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if d[i] == 'n' || customDecoded(t) {
		// null sets nothing; a custom decoder checks its own keys.
		return true
	}
	switch t.Kind() {
	case reflect.Struct:
		fields, ok := exactFields(t)
		if !ok || d[i] != '{' {
			return false
		}
		_, err := jsonscan.WalkObject(d, i, levels, func(key []byte, vs, ve int) error {
			ft, ok := fields[string(key)]
			if !ok || !onlyKnownKeys(d, vs, ft, levels-1) {
				return errMaybeUnknown
			}
			return nil
		})
		return err == nil
	case reflect.Map:
		if d[i] != '{' {
			return false
		}
		_, err := jsonscan.WalkObject(d, i, levels, func(_ []byte, vs, ve int) error {
			if !onlyKnownKeys(d, vs, t.Elem(), levels-1) {
				return errMaybeUnknown
			}
			return nil
		})
		return err == nil
	case reflect.Slice, reflect.Array:
		if d[i] != '[' {
			// A []byte is a base64 string; anything else failed Unmarshal.
			return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 && d[i] == '"'
		}
		_, err := jsonscan.WalkArray(d, i, levels, func(vs, ve int) error {
			if !onlyKnownKeys(d, vs, t.Elem(), levels-1) {
				return errMaybeUnknown
			}
			return nil
		})
		return err == nil
	case reflect.Interface:
		// Decoded as generic JSON: no fields to know.
		return true
	default:
		// A string, number or bool: no keys (and a value of another kind
		// made Unmarshal fail).
		return d[i] != '{' && d[i] != '['
	}
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// customDecoded reports whether encoding/json decodes a value of type t
// (addressable, as a field or element is) with its own method.
func customDecoded(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(unmarshalerType) || pt.Implements(unmarshalerType) ||
		t.Implements(textUnmarshalerType) || pt.Implements(textUnmarshalerType)
}

// exactFieldsCache holds exactFields' answers by type.
var exactFieldsCache sync.Map // reflect.Type -> knownFields

type knownFields struct {
	byName map[string]reflect.Type
	ok     bool
}

// exactFields maps the JSON names of struct t's fields (the json tag's
// name, else the field's) to their types, as encoding/json names them; ok
// is false for a struct with embedded fields, whose names encoding/json
// resolves by depth and tags (not needed by the config's types).
func exactFields(t reflect.Type) (map[string]reflect.Type, bool) {
	if v, ok := exactFieldsCache.Load(t); ok {
		k := v.(knownFields)
		return k.byName, k.ok
	}
	k := knownFields{byName: map[string]reflect.Type{}, ok: true}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if sf.Anonymous {
			k = knownFields{}
			break
		}
		tag := sf.Tag.Get("json")
		if tag == "-" || !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if name == "" {
			name = sf.Name
		}
		if _, dup := k.byName[name]; dup || !plainName(name) {
			// Two fields of one name (encoding/json decodes neither), or
			// a tag encoding/json may not take as a name.
			k = knownFields{}
			break
		}
		k.byName[name] = sf.Type
	}
	exactFieldsCache.Store(t, k)
	return k.byName, k.ok
}

// plainName reports whether a field's JSON name is letters, digits and
// underscores, which encoding/json takes as a tag's name.
func plainName(s string) bool {
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return s != ""
}
