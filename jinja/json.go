package jinja

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

const maxJSONDepth = 128

// FromJSON converts a JSON document to a Value, keeping object key order
// (array-index-like keys first, as JavaScript's JSON.parse does). Numbers
// with an integral value become integers, others floats. A document nested
// deeper than 128 containers is refused with a limit error (IsLimit): a
// bound of this package, not a fault of the document.
func FromJSON(data []byte) (Value, error) { return FromJSONMax(data, 0) }

// FromJSONMax is FromJSON for a document of at most maxValues values
// (scalars and containers; 0: no bound): past it the decode stops with a
// limit error (IsLimit), its cost bounded by maxValues, where a Value of
// each of 120,000 small values costs about 500 bytes and 1 us.
func FromJSONMax(data []byte, maxValues int) (Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	left := maxValues
	if maxValues <= 0 {
		left = -1
	}
	v, err := decodeValue(dec, 0, &left)
	if err != nil {
		if IsLimit(err) {
			return Value{}, err
		}
		return Value{}, fmt.Errorf("cannot decode JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Value{}, errors.New("cannot decode JSON: trailing data")
	}
	return v, nil
}

// decodeValue decodes the next value of dec; *left counts down the values
// still allowed (negative: no bound).
func decodeValue(dec *json.Decoder, depth int, left *int) (Value, error) {
	if depth > maxJSONDepth {
		return Value{}, limitf("JSON nested deeper than %d", maxJSONDepth)
	}
	if *left == 0 {
		return Value{}, limitf("JSON of more values than the bound")
	}
	if *left > 0 {
		*left--
	}
	tok, err := dec.Token()
	if err != nil {
		return Value{}, err
	}
	switch t := tok.(type) {
	case nil:
		return Null(), nil
	case bool:
		return Bool(t), nil
	case string:
		return String(t), nil
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) { // JSON.parse overflows to ±Infinity
			return Value{}, fmt.Errorf("bad number %q: %w", t, err)
		}
		if strings.ContainsAny(string(t), ".eE") {
			// A float in the document, as Python's json.loads reads it:
			// vLLM's template renders 1.0 and 1E5 as 1.0 and 100000.0.
			return Float(f), nil
		}
		if math.Abs(f) >= 1<<53 {
			// An integer a float64 does not hold exactly: Python's
			// json.loads reads it whole and the template prints it so
			// (9223372036854775807, not 9223372036854775808).
			return Value{kind: KindInt, num: f, str: string(t)}, nil
		}
		return Number(f), nil
	case json.Delim:
		switch t {
		case '[':
			var items []Value
			for dec.More() {
				v, err := decodeValue(dec, depth+1, left)
				if err != nil {
					return Value{}, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return Value{}, err
			}
			return Array(items...), nil
		case '{':
			o := NewObject(4)
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return Value{}, err
				}
				k, ok := kt.(string)
				if !ok {
					return Value{}, errors.New("object key is not a string")
				}
				v, err := decodeValue(dec, depth+1, left)
				if err != nil {
					return Value{}, err
				}
				o.Set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return Value{}, err
			}
			return ObjectValue(o), nil
		}
	}
	return Value{}, fmt.Errorf("unexpected JSON token %v", tok)
}
