package jsonscan

import (
	"strconv"
	"unsafe"
)

// LaxBool reads the JSON value v (without surrounding space) as vLLM's
// request models (pydantic's lax bool) read a bool field: 't' for true, 1
// and the strings "1", "t", "y", "on", "yes", "true"; 'f' for false, 0 and
// "0", "f", "n", "no", "off", "false" (strings decoded and in any ASCII
// case: "\u0074rue" and "False" too); 0 for null and for values the engine
// refuses. It allocates nothing.
func LaxBool(v []byte) byte {
	switch string(v) {
	case "true", "1":
		return 't'
	case "false", "0":
		return 'f'
	}
	if len(v) == 0 {
		return 0
	}
	if v[0] != '"' {
		if v[0] == '-' || v[0] >= '0' && v[0] <= '9' {
			return laxNumber(v)
		}
		return 0
	}
	raw := v[1 : len(v)-1]
	// An escape decodes 6 bytes (\uXXXX) to at least one: contents longer
	// than 6*5 decode to more than the 5 bytes of the longest word.
	var buf [30]byte
	if HasEscape(raw) {
		if len(raw) > len(buf) {
			return 0
		}
		raw = Unescape(buf[:0], raw)
	}
	if len(raw) > 5 {
		return 0
	}
	var low [5]byte
	for i, c := range raw {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		low[i] = c
	}
	switch string(low[:len(raw)]) {
	case "1", "t", "y", "on", "yes", "true":
		return 't'
	case "0", "f", "n", "no", "off", "false":
		return 'f'
	}
	return 0
}

// laxNumber reads the JSON number v as a lax bool: 'f' when it is 0, 't'
// when it is 1 (1.0, 1e0, 10e-1, -0 alike, as Python reads them as a
// float), else 0. Numbers of 10 and more are refused before they are
// parsed, so ParseFloat never fails (its error allocates). v is handed to
// ParseFloat without a copy: string(v) went to the heap for a number of
// more than 32 bytes, and ParseFloat keeps no reference to its argument.
func laxNumber(v []byte) byte {
	i := 0
	if v[i] == '-' {
		i++
	}
	intStart := i
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
	}
	intEnd, fracStart, fracEnd := i, i, i
	if i < len(v) && v[i] == '.' {
		i++
		fracStart = i
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
		fracEnd = i
	}
	exp := 0
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		neg := false
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			neg = v[i] == '-'
			i++
		}
		for ; i < len(v); i++ {
			if exp < 1e8 {
				exp = exp*10 + int(v[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	// The power of ten of the first significant digit: v is in
	// [10^order, 10^(order+1)).
	order, zero := 0, true
	for j := intStart; j < intEnd && zero; j++ {
		if v[j] != '0' {
			order, zero = intEnd-j-1, false
		}
	}
	for j := fracStart; j < fracEnd && zero; j++ {
		if v[j] != '0' {
			order, zero = fracStart-j-1, false
		}
	}
	if zero {
		return 'f'
	}
	if order+exp >= 1 {
		return 0 // 10 or more: neither 0 nor 1, and maybe past float64
	}
	f, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(v), len(v)), 64)
	if err != nil {
		return 0
	}
	switch f {
	case 0:
		return 'f' // below float64's smallest: 0, as Python reads it
	case 1:
		return 't'
	}
	return 0
}
