package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/infera/infera/config"
)

// A whole-number setting may be written as any JSON number whose value is
// whole: 100, 100.0, 1e2 and 1.0E+2 are all 100. encoding/json decodes only
// the first into an int, and a client that computes a setting (a script's
// float, JSON.stringify of 1e21) may send the others: the admin API takes
// them, as the value they stand for.

// maxShownNumber bounds how much of a refused number an error repeats
// (a body may hold a number of a million digits).
const maxShownNumber = 24

// wholeNumber returns n, a JSON number read for a setting of integer type
// t, written as a plain integer; or why it cannot be one: it is not whole
// (100.5), or it lies past what t holds. It never builds the number's
// value (1e1000000000 is refused by its length, not computed).
func wholeNumber(n json.Number, t reflect.Type) (json.Number, error) {
	s := n.String()
	digits, exp, neg, ok := splitNumber(s)
	if !ok {
		return "", fmt.Errorf("%s is not a number", shownNumber(s))
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", nil
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	if exp < 0 {
		return "", fmt.Errorf("%s is not a whole number: this setting takes whole numbers only", shownNumber(s))
	}
	lo, hi := intRange(t)
	if len(trimmed)+exp > 20 { // more digits than any 64-bit integer
		return "", rangeErr(s, lo, hi)
	}
	plain := trimmed + strings.Repeat("0", exp)
	if neg {
		plain = "-" + plain
	}
	if t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr {
		if _, err := strconv.ParseUint(plain, 10, t.Bits()); err != nil {
			return "", rangeErr(s, lo, hi)
		}
	} else if _, err := strconv.ParseInt(plain, 10, t.Bits()); err != nil {
		return "", rangeErr(s, lo, hi)
	}
	return json.Number(plain), nil
}

// splitNumber splits a JSON number into its significant digits (integer
// and fraction parts together), the power of ten they are multiplied by,
// and its sign. An exponent too large to hold is clamped: a number that
// large or that small is refused whatever its digits.
func splitNumber(s string) (digits string, exp int, neg bool, ok bool) {
	if s, neg = strings.CutPrefix(s, "-"); s == "" {
		return "", 0, false, false
	}
	mant, e, hasExp := strings.Cut(strings.ToLower(s), "e")
	if hasExp {
		esign := 1
		switch {
		case strings.HasPrefix(e, "-"):
			esign, e = -1, e[1:]
		case strings.HasPrefix(e, "+"):
			e = e[1:]
		}
		if e == "" || strings.Trim(e, "0123456789") != "" {
			return "", 0, false, false
		}
		if e = strings.TrimLeft(e, "0"); len(e) > 9 {
			e = "999999999"
		}
		v, _ := strconv.Atoi("0" + e)
		exp = esign * v
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits = whole + frac
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", 0, false, false
	}
	return digits, exp - len(frac), neg, true
}

// intRange is the range of integer type t.
func intRange(t reflect.Type) (lo int64, hi uint64) {
	bits := t.Bits()
	if t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr {
		return 0, math.MaxUint64 >> (64 - bits)
	}
	return -1 << (bits - 1), 1<<(bits-1) - 1
}

func rangeErr(s string, lo int64, hi uint64) error {
	return fmt.Errorf("%s is out of range: this setting takes whole numbers from %d to %d", shownNumber(s), lo, hi)
}

// shownNumber is a number as an error repeats it: bounded.
func shownNumber(s string) string {
	if len(s) <= maxShownNumber {
		return s
	}
	return s[:maxShownNumber-3] + "..."
}

// wholeNumbersWritten returns the config document data with every
// whole-number setting written as a plain integer (walkDoc writes them so
// as it walks). A setting that cannot be one (100.5, a value past its
// type's range) is refused with why, at its path. It decodes the whole
// document: parseRefs calls it only once config.Parse refused a number,
// never on the way of a write that parses.
func wholeNumbersWritten(data []byte) ([]byte, error) {
	doc, err := decodeDoc(data)
	if err != nil {
		return nil, err
	}
	// The document goes back to config.Parse re-encoded, where a repeated
	// key would be invisible (the map kept one copy).
	if err := config.RepeatedKey(data, ""); err != nil {
		return nil, err
	}
	if _, err := walkDoc(doc, reflect.TypeFor[config.Config](), "", nil); err != nil {
		return nil, err
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, errors.New("BUG: cannot re-encode a decoded document: " + err.Error())
	}
	return out, nil
}
