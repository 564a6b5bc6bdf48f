package jinja

import (
	"bytes"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Kind is the runtime type of a Value.
type Kind uint8

// Value kinds, mirroring @huggingface/jinja's runtime value classes.
const (
	KindUndefined Kind = iota
	KindNull
	KindBool
	KindInt
	KindFloat
	KindString
	KindArray
	KindTuple
	KindObject
	KindKwargs
	KindNamespace
	KindFunc
)

var kindNames = [...]string{
	KindUndefined: "UndefinedValue",
	KindNull:      "NullValue",
	KindBool:      "BooleanValue",
	KindInt:       "IntegerValue",
	KindFloat:     "FloatValue",
	KindString:    "StringValue",
	KindArray:     "ArrayValue",
	KindTuple:     "TupleValue",
	KindObject:    "ObjectValue",
	KindKwargs:    "KeywordArgumentsValue",
	KindNamespace: "NamespaceValue",
	KindFunc:      "FunctionValue",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is a template runtime value. The zero Value is undefined.
// Numbers are float64, as in JavaScript; KindInt marks integral ones.
type Value struct {
	kind Kind
	num  float64
	str  string
	arr  *arrayData
	obj  *Object
	fn   *function
}

type arrayData struct {
	items []Value
}

type function struct {
	name string
	call func(st *state, e *env, args []Value) (Value, error)
}

// Undefined returns the undefined value.
func Undefined() Value { return Value{} }

// Null returns none.
func Null() Value { return Value{kind: KindNull} }

// Bool returns a boolean value.
func Bool(b bool) Value {
	v := Value{kind: KindBool}
	if b {
		v.num = 1
	}
	return v
}

// Int returns an integer value.
func Int(i int64) Value { return Value{kind: KindInt, num: float64(i)} }

// Float returns a float value. Integral floats print as "1.0".
func Float(f float64) Value { return Value{kind: KindFloat, num: f} }

// Number returns an integer value when f is integral and a float otherwise,
// as @huggingface/jinja converts JavaScript numbers.
func Number(f float64) Value {
	if f == math.Trunc(f) && !math.IsInf(f, 0) {
		return Value{kind: KindInt, num: f}
	}
	return Value{kind: KindFloat, num: f}
}

// String returns a string value.
func String(s string) Value { return Value{kind: KindString, str: s} }

// Array returns an array value holding items (not copied).
func Array(items ...Value) Value { return Value{kind: KindArray, arr: &arrayData{items: items}} }

// List is a reusable array for callers that build the variables of every
// render: its Value shares the List's storage, so a pooled List (and its
// items' capacity) serves render after render without allocating.
type List struct{ data arrayData }

// Reset empties l, keeping its storage. Values that held l must not be used
// afterwards.
func (l *List) Reset() {
	clear(l.data.items)
	l.data.items = l.data.items[:0]
}

// Append adds v to l.
func (l *List) Append(v Value) { l.data.items = append(l.data.items, v) }

// Value returns l as an array value (not a copy: it sees later appends).
func (l *List) Value() Value { return Value{kind: KindArray, arr: &l.data} }

// ObjectValue wraps o as a mapping value.
func ObjectValue(o *Object) Value { return Value{kind: KindObject, obj: o} }

// Kind returns v's kind.
func (v Value) Kind() Kind { return v.kind }

// Str returns the string of a KindString value and "" otherwise.
func (v Value) Str() string { return v.str }

// Items returns the elements of an array or tuple value.
func (v Value) Items() []Value {
	if v.arr == nil {
		return nil
	}
	return v.arr.items
}

// Object returns the mapping of an object, kwargs or namespace value.
func (v Value) Object() *Object { return v.obj }

// IsUndefined reports whether v is undefined.
func (v Value) IsUndefined() bool { return v.kind == KindUndefined }

func (v Value) isArray() bool  { return v.kind == KindArray || v.kind == KindTuple }
func (v Value) isNumber() bool { return v.kind == KindInt || v.kind == KindFloat }
func (v Value) isNumericLike() bool {
	return v.kind == KindInt || v.kind == KindFloat || v.kind == KindBool
}
func (v Value) isAttrContainer() bool {
	return v.kind == KindObject || v.kind == KindKwargs || v.kind == KindNamespace
}
func (v Value) isObject() bool { return v.kind == KindObject || v.kind == KindKwargs }

// Truth reports v's truthiness as @huggingface/jinja defines it.
func (v Value) Truth() bool {
	switch v.kind {
	case KindBool, KindInt, KindFloat:
		return v.num != 0 && !math.IsNaN(v.num)
	case KindString:
		return v.str != ""
	case KindArray, KindTuple:
		return len(v.arr.items) > 0
	case KindObject, KindKwargs:
		return v.obj.Len() > 0
	case KindNamespace, KindFunc:
		return true
	}
	return false
}

// Object is an insertion-ordered string-keyed mapping. Keys that look like
// array indexes come first in ascending numeric order, as in JavaScript
// objects, so that tojson output matches the reference renderer.
type Object struct {
	keys []string
	vals []Value
	// index maps keys to positions once the object has grown past
	// smallObject keys (indexed); pooled objects keep the map when reset.
	index   map[string]int
	indexed bool
}

// smallObject is the size up to which key lookups scan the keys.
const smallObject = 8

// NewObject returns an empty object with room for n entries.
func NewObject(n int) *Object {
	return &Object{keys: make([]string, 0, n), vals: make([]Value, 0, n)}
}

// Reset empties o, keeping its storage, so that a caller building values
// for every render can reuse its objects. Values that held o must not be
// used afterwards.
func (o *Object) Reset() { o.reset() }

// Len returns the number of entries.
func (o *Object) Len() int {
	if o == nil {
		return 0
	}
	return len(o.keys)
}

// Keys returns the keys in order. The slice must not be modified.
func (o *Object) Keys() []string { return o.keys }

func (o *Object) find(k string) int {
	if o.indexed {
		if i, ok := o.index[k]; ok {
			return i
		}
		return -1
	}
	for i := range o.keys {
		if o.keys[i] == k {
			return i
		}
	}
	return -1
}

// Get returns the value stored under k.
func (o *Object) Get(k string) (Value, bool) {
	if o == nil {
		return Value{}, false
	}
	if i := o.find(k); i >= 0 {
		return o.vals[i], true
	}
	return Value{}, false
}

// Set stores v under k, keeping the position of an existing key.
func (o *Object) Set(k string, v Value) {
	if i := o.find(k); i >= 0 {
		o.vals[i] = v
		return
	}
	pos := len(o.keys)
	if n, ok := arrayIndex(k); ok {
		// Array-index keys precede all others, in numeric order.
		pos = sort.Search(len(o.keys), func(i int) bool {
			m, isIdx := arrayIndex(o.keys[i])
			return !isIdx || m > n
		})
	}
	o.keys = append(o.keys, "")
	o.vals = append(o.vals, Value{})
	copy(o.keys[pos+1:], o.keys[pos:])
	copy(o.vals[pos+1:], o.vals[pos:])
	o.keys[pos] = k
	o.vals[pos] = v
	switch {
	case o.indexed && pos == len(o.keys)-1:
		o.index[k] = pos
	case o.indexed || len(o.keys) > smallObject:
		o.rebuildIndex()
	}
}

// rebuildIndex indexes the keys when the object is large (or was).
func (o *Object) rebuildIndex() {
	if !o.indexed && len(o.keys) <= smallObject {
		return
	}
	if o.index == nil {
		o.index = make(map[string]int, len(o.keys))
	} else {
		clear(o.index)
	}
	for i, key := range o.keys {
		o.index[key] = i
	}
	o.indexed = true
}

// arrayIndex reports whether k is a canonical JavaScript array index.
func arrayIndex(k string) (uint32, bool) {
	if k == "" || len(k) > 10 || (len(k) > 1 && k[0] == '0') {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n >= math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// jsNumber formats f as JavaScript's Number.prototype.toString does.
func jsNumber(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case f == 0:
		return append(dst, '0')
	}
	a := math.Abs(f)
	if a >= 1e-6 && a < 1e21 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64)
	// Go writes e-07 / e+21; JavaScript writes e-7 / e+21.
	s := dst[start:]
	if i := bytes.IndexByte(s, 'e'); i >= 0 && i+2 < len(s) && s[i+2] == '0' {
		j := start + i + 2
		for j < len(dst)-1 && dst[j] == '0' {
			dst = append(dst[:j], dst[j+1:]...)
		}
	}
	return dst
}

// pyFloat formats f as Python's repr(float) does (str and json.dumps
// too): the shortest digits that read back as f, positional with at least
// one decimal digit when the exponent is in [-4, 16), else d.ddde±XX.
// vLLM renders chat templates with Python: a tool schema's 1.0 or 1E5 is
// "1.0" and "100000.0" in the engine's prompt.
func pyFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return jsNumber(dst, f) // NaN, Infinity, -Infinity: as json.dumps writes them
	case f == 0:
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // [-]d[.ddd]e±XX
	if e[0] == '-' {
		dst = append(dst, '-')
		e = e[1:]
	}
	i := bytes.IndexByte(e, 'e')
	mant, exp10 := e[:i], e[i+1:]
	exp, _ := strconv.Atoi(string(exp10))
	var digs [24]byte
	d := append(digs[:0], mant[0])
	if len(mant) > 2 {
		d = append(d, mant[2:]...)
	}
	if exp < -4 || exp >= 16 {
		dst = append(dst, d[0])
		if len(d) > 1 {
			dst = append(dst, '.')
			dst = append(dst, d[1:]...)
		}
		dst = append(dst, 'e')
		if exp < 0 {
			dst, exp = append(dst, '-'), -exp
		} else {
			dst = append(dst, '+')
		}
		if exp < 10 {
			dst = append(dst, '0')
		}
		return strconv.AppendInt(dst, int64(exp), 10)
	}
	if exp < 0 {
		dst = append(dst, "0."...)
		for k := 0; k < -exp-1; k++ {
			dst = append(dst, '0')
		}
		return append(dst, d...)
	}
	if len(d) <= exp+1 {
		dst = append(dst, d...)
		for k := len(d); k < exp+1; k++ {
			dst = append(dst, '0')
		}
		return append(dst, ".0"...)
	}
	dst = append(dst, d[:exp+1]...)
	dst = append(dst, '.')
	return append(dst, d[exp+1:]...)
}

// appendInt appends the integer v: its digits as the JSON document gave
// them when a float64 does not hold it exactly (FromJSON), else as a
// number.
func appendInt(dst []byte, v Value) []byte {
	if v.str != "" {
		return append(dst, v.str...)
	}
	return jsNumber(dst, v.num)
}

// appendString appends v as @huggingface/jinja's toString renders it.
func appendString(dst []byte, v Value) []byte {
	switch v.kind {
	case KindString:
		return append(dst, v.str...)
	case KindInt:
		return appendInt(dst, v)
	case KindFloat:
		return pyFloat(dst, v.num)
	case KindBool:
		if v.num != 0 {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case KindArray, KindTuple, KindObject, KindKwargs, KindNamespace:
		return appendJSON(dst, v, jsonOptions{}, 0, false)
	case KindFunc:
		return append(dst, "function"...)
	}
	return append(dst, "undefined"...)
}

func toString(v Value) string {
	if v.kind == KindString {
		return v.str
	}
	return string(appendString(nil, v))
}

// jsPrimitiveString renders v as JavaScript's String(v.value) would, for
// join and similar helpers that see raw values.
func jsPrimitiveString(dst []byte, v Value) []byte {
	switch v.kind {
	case KindUndefined, KindNull:
		return dst
	case KindInt:
		return appendInt(dst, v)
	case KindFloat:
		return pyFloat(dst, v.num) // Python's str(1.0) is "1.0"
	}
	return appendString(dst, v)
}

type jsonOptions struct {
	indent      int
	ensureASCII bool
	sortKeys    bool
	itemSep     string
	keySep      string
	haveSeps    bool
}

// jsonHardLimit stops JSON rendering of huge (for example self-sharing)
// structures early; callers then fail their own size checks.
const jsonHardLimit = 64 << 20

// appendJSON implements @huggingface/jinja's toJSON.
func appendJSON(dst []byte, v Value, o jsonOptions, depth int, undefinedToNull bool) []byte {
	return appendJSONUpTo(dst, v, o, depth, undefinedToNull, len(dst)+jsonHardLimit)
}

// appendJSONUpTo stops descending once dst is longer than limit (dst may
// already hold other data, such as the render's string arena).
func appendJSONUpTo(dst []byte, v Value, o jsonOptions, depth int, undefinedToNull bool, limit int) []byte {
	if len(dst) > limit || depth > maxJSONDepth {
		return dst
	}
	itemSep, keySep := ", ", ": "
	if o.haveSeps {
		itemSep, keySep = o.itemSep, o.keySep
	} else if o.indent > 0 {
		itemSep = ","
	}
	switch v.kind {
	case KindNull:
		return append(dst, "null"...)
	case KindUndefined:
		if undefinedToNull {
			return append(dst, "null"...)
		}
		return append(dst, "undefined"...)
	case KindInt, KindFloat:
		if math.IsNaN(v.num) || math.IsInf(v.num, 0) {
			return append(dst, "null"...)
		}
		if v.kind == KindFloat {
			return pyFloat(dst, v.num) // json.dumps writes a float as repr does
		}
		return appendInt(dst, v)
	case KindBool:
		return appendString(dst, v)
	case KindString:
		return appendJSONString(dst, v.str, o.ensureASCII)
	case KindArray, KindTuple, KindObject, KindKwargs, KindNamespace:
		pad := func(d []byte, n int) []byte {
			d = append(d, '\n')
			for i := 0; i < n*o.indent; i++ {
				d = append(d, ' ')
			}
			return d
		}
		if v.isArray() {
			items := v.arr.items
			dst = append(dst, '[')
			for i, it := range items {
				if i > 0 {
					dst = append(dst, itemSep...)
				}
				if o.indent > 0 {
					dst = pad(dst, depth+1)
				}
				dst = appendJSONUpTo(dst, it, o, depth+1, undefinedToNull, limit)
			}
			if o.indent > 0 && len(items) > 0 {
				dst = pad(dst, depth)
			}
			return append(dst, ']')
		}
		keys, vals := v.obj.keys, v.obj.vals
		var order []int
		if o.sortKeys {
			var small [32]int
			order = small[:0]
			for i := range keys {
				order = append(order, i)
			}
			slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
		}
		dst = append(dst, '{')
		for n := range keys {
			i := n
			if order != nil {
				i = order[n]
			}
			if n > 0 {
				dst = append(dst, itemSep...)
			}
			if o.indent > 0 {
				dst = pad(dst, depth+1)
			}
			dst = appendJSONString(dst, keys[i], o.ensureASCII)
			dst = append(dst, keySep...)
			dst = appendJSONUpTo(dst, vals[i], o, depth+1, undefinedToNull, limit)
		}
		if o.indent > 0 && len(keys) > 0 {
			dst = pad(dst, depth)
		}
		return append(dst, '}')
	}
	return append(dst, "null"...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s as JSON.stringify does (no HTML escaping),
// optionally escaping every UTF-16 unit at or above 0x7f.
func appendJSONString(dst []byte, s string, ensureASCII bool) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch c {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				if c < 0x20 || (ensureASCII && c == 0x7f) {
					dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
				} else {
					dst = append(dst, c)
				}
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if !ensureASCII {
			dst = utf8.AppendRune(dst, r)
			continue
		}
		if r > 0xffff {
			r -= 0x10000
			dst = appendU4(dst, 0xd800+(r>>10))
			dst = appendU4(dst, 0xdc00+(r&0x3ff))
		} else {
			dst = appendU4(dst, r)
		}
	}
	return append(dst, '"')
}

func appendU4(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', hexDigits[r>>12&15], hexDigits[r>>8&15], hexDigits[r>>4&15], hexDigits[r&15])
}

// looseEqual implements JavaScript's == on the values' payloads, which is
// what @huggingface/jinja's == and != compare.
func looseEqual(a, b Value) bool {
	an, bn := a.kind == KindUndefined || a.kind == KindNull, b.kind == KindUndefined || b.kind == KindNull
	if an || bn {
		return an && bn
	}
	if a.kind == KindBool {
		a = Value{kind: KindFloat, num: a.num}
	}
	if b.kind == KindBool {
		b = Value{kind: KindFloat, num: b.num}
	}
	switch {
	case a.isNumber() && b.isNumber():
		return a.num == b.num
	case a.kind == KindString && b.kind == KindString:
		return a.str == b.str
	case a.isNumber() && b.kind == KindString:
		return a.num == jsToNumber(b.str)
	case a.kind == KindString && b.isNumber():
		return jsToNumber(a.str) == b.num
	}
	return sameRef(a, b)
}

// pyEqual implements Python's == on the values' payloads (jinja2's
// Undefined equals only another Undefined; bool is an int).
func pyEqual(a, b Value) bool {
	switch {
	case a.kind == KindUndefined || b.kind == KindUndefined,
		a.kind == KindNull || b.kind == KindNull:
		return a.kind == b.kind
	case (a.isNumber() || a.kind == KindBool) && (b.isNumber() || b.kind == KindBool):
		return a.num == b.num
	case a.kind == KindString && b.kind == KindString:
		return a.str == b.str
	}
	return sameRef(a, b)
}

// strictEqual implements JavaScript's === on the values' payloads.
func strictEqual(a, b Value) bool {
	an, bn := a.kind == KindUndefined || a.kind == KindNull, b.kind == KindUndefined || b.kind == KindNull
	if an || bn {
		return an && bn
	}
	switch {
	case a.isNumber() && b.isNumber():
		return a.num == b.num
	case a.kind == KindBool && b.kind == KindBool:
		return a.num == b.num
	case a.kind == KindString && b.kind == KindString:
		return a.str == b.str
	}
	return sameRef(a, b)
}

func sameRef(a, b Value) bool {
	switch {
	case a.isArray() && b.isArray():
		return a.arr == b.arr
	case a.obj != nil && b.obj != nil:
		return a.obj == b.obj
	case a.kind == KindFunc && b.kind == KindFunc:
		return a.fn == b.fn
	}
	return false
}

// jsToNumber implements JavaScript's ToNumber on strings.
func jsToNumber(s string) float64 {
	s = jsTrim(s)
	if s == "" {
		return 0
	}
	switch s {
	case "Infinity", "+Infinity":
		return math.Inf(1)
	case "-Infinity":
		return math.Inf(-1)
	}
	if len(s) > 2 && s[0] == '0' {
		base := 0
		switch s[1] {
		case 'x', 'X':
			base = 16
		case 'o', 'O':
			base = 8
		case 'b', 'B':
			base = 2
		}
		if base != 0 {
			n, err := strconv.ParseUint(s[2:], base, 64)
			if err != nil {
				return math.NaN()
			}
			return float64(n)
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
			return math.NaN()
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// isJSSpace reports whether r is whitespace for JavaScript's \s and trim.
func isJSSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

func jsTrim(s string) string      { return jsTrimRight(jsTrimLeft(s)) }
func jsTrimLeft(s string) string  { return strings.TrimLeftFunc(s, isJSSpace) }
func jsTrimRight(s string) string { return strings.TrimRightFunc(s, isJSSpace) }

// utf16Len returns the length of s in UTF-16 code units (JavaScript's
// String.prototype.length).
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		if r > 0xffff {
			n += 2
		} else {
			n++
		}
	}
	return n
}

// checkJSON reports the error @huggingface/jinja raises when converting v to
// JSON: tuples have no JSON form there.
func checkJSON(v Value, depth int) error {
	budget := 1 << 20
	return checkJSONBudget(v, depth, &budget)
}

func checkJSONBudget(v Value, depth int, budget *int) error {
	*budget--
	if *budget < 0 {
		return limitf("value too large to convert to JSON")
	}
	switch v.kind {
	case KindTuple:
		return errorf("cannot convert to JSON: TupleValue")
	case KindArray:
		if depth > maxJSONDepth {
			return limitf("value nested too deeply")
		}
		for _, it := range v.arr.items {
			if err := checkJSONBudget(it, depth+1, budget); err != nil {
				return err
			}
		}
	case KindObject, KindKwargs, KindNamespace:
		if depth > maxJSONDepth {
			return limitf("value nested too deeply")
		}
		for _, it := range v.obj.vals {
			if err := checkJSONBudget(it, depth+1, budget); err != nil {
				return err
			}
		}
	case KindFunc:
		return errorf("cannot convert to JSON: FunctionValue")
	}
	return nil
}
