package jinja

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

var globals = newGlobals()

func newGlobals() *env {
	g := &env{}
	g.set("false", Bool(false))
	g.set("true", Bool(true))
	g.set("none", Null())
	g.set("False", Bool(false))
	g.set("True", Bool(true))
	g.set("None", Null())
	g.set("raise_exception", fn("raise_exception", func(_ *state, _ *env, args []Value) (Value, error) {
		msg := "raise_exception called"
		if len(args) > 0 {
			msg = strings.Clone(toString(args[0])) // may be a view into the render's arena
		}
		return Value{}, &Error{Msg: msg}
	}))
	g.set("range", fn("range", builtinRange))
	g.set("strftime_now", fn("strftime_now", func(st *state, _ *env, args []Value) (Value, error) {
		if len(args) == 0 || args[0].kind != KindString {
			return Value{}, errorf("strftime_now expects a format string")
		}
		mark := len(st.strs)
		st.strs = appendStrftime(st.strs, st.opts.Now(), args[0].str)
		return String(st.view(mark)), nil
	}))
	g.set("namespace", fn("namespace", builtinNamespace))
	// Python's dict, a global of jinja2's default environment: the same
	// arguments as namespace, a plain object.
	g.set("dict", fn("dict", func(st *state, e *env, args []Value) (Value, error) {
		v, err := builtinNamespace(st, e, args)
		v.kind = KindObject
		return v, err
	}))
	return g
}

func fn(name string, f func(st *state, e *env, args []Value) (Value, error)) Value {
	return Value{kind: KindFunc, fn: &function{name: name, call: f}}
}

const maxRange = 1 << 16

func builtinRange(st *state, _ *env, args []Value) (Value, error) {
	var nums [3]float64
	n := 0
	for _, a := range args {
		if a.kind == KindKwargs {
			continue
		}
		if !a.isNumericLike() || n == 3 {
			return Value{}, errorf("range expects up to 3 numbers")
		}
		nums[n] = a.num
		n++
	}
	start, stop, step := 0.0, 0.0, 1.0
	switch n {
	case 0:
		return Value{}, errorf("range expects at least 1 argument")
	case 1:
		stop = nums[0]
	case 2:
		start, stop = nums[0], nums[1]
	case 3:
		start, stop, step = nums[0], nums[1], nums[2]
	}
	if step == 0 {
		return Value{}, errorf("range() step must not be zero")
	}
	count := 0
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		if count >= maxRange {
			return Value{}, limitf("range too large")
		}
		count++
	}
	if err := st.charge(count); err != nil {
		return Value{}, err
	}
	out := st.values(count)
	i := start
	for k := range out {
		out[k] = Number(i)
		i += step
	}
	return st.array(KindArray, out), nil
}

func builtinNamespace(st *state, _ *env, args []Value) (Value, error) {
	pos := args
	var kw *Object
	if len(pos) > 0 && pos[len(pos)-1].kind == KindKwargs {
		kw = pos[len(pos)-1].obj
		pos = pos[:len(pos)-1]
	}
	if len(pos) > 1 {
		return Value{}, errorf("namespace expected at most 1 argument, got %d", len(pos))
	}
	o := st.newObject()
	if len(pos) == 1 {
		src := pos[0]
		switch {
		case src.isObject():
			for i, k := range src.obj.keys {
				o.Set(k, src.obj.vals[i])
			}
		case src.isArray():
			for _, pair := range src.arr.items {
				var kv []Value
				switch {
				case pair.isArray():
					kv = pair.arr.items
				case pair.kind == KindString:
					for _, r := range pair.str {
						kv = append(kv, String(string(r)))
					}
				}
				if len(kv) != 2 {
					return Value{}, errorf("namespace expected an object or an iterable of [key, value] pairs")
				}
				if kv[0].kind != KindString {
					return Value{}, errorf("namespace keys must be strings")
				}
				o.Set(kv[0].str, kv[1])
			}
		default:
			return Value{}, errorf("'%s' object is not iterable", src.kind)
		}
	}
	if kw != nil {
		for i, k := range kw.keys {
			o.Set(k, kw.vals[i])
		}
	}
	return Value{kind: KindNamespace, obj: o}, nil
}

var monthNames = [...]string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}

// appendStrftime appends t formatted with the directives @huggingface/jinja
// supports.
func appendStrftime(b []byte, t time.Time, format string) []byte {
	pad2 := func(n int) {
		if n < 10 {
			b = append(b, '0')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b = append(b, format[i])
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			b = strconv.AppendInt(b, int64(t.Year()), 10)
		case 'm':
			pad2(int(t.Month()))
		case 'd':
			pad2(t.Day())
		case 'b':
			b = append(b, monthNames[t.Month()-1][:3]...)
		case 'B':
			b = append(b, monthNames[t.Month()-1]...)
		case 'H':
			pad2(t.Hour())
		case 'M':
			pad2(t.Minute())
		case '%':
			b = append(b, '%')
		default:
			b = append(b, '%', format[i])
		}
	}
	return b
}

type testFunc func(a, b Value) (bool, error)

var tests map[string]testFunc

func init() {
	tests = map[string]testFunc{
		"boolean":  func(a, _ Value) (bool, error) { return a.kind == KindBool, nil },
		"callable": func(a, _ Value) (bool, error) { return a.kind == KindFunc, nil },
		"odd": func(a, _ Value) (bool, error) {
			if a.kind != KindInt {
				return false, errorf("cannot odd on %s", a.kind)
			}
			return math.Mod(a.num, 2) != 0, nil
		},
		"even": func(a, _ Value) (bool, error) {
			if a.kind != KindInt {
				return false, errorf("cannot even on %s", a.kind)
			}
			return math.Mod(a.num, 2) == 0, nil
		},
		"false":    func(a, _ Value) (bool, error) { return a.kind == KindBool && a.num == 0, nil },
		"true":     func(a, _ Value) (bool, error) { return a.kind == KindBool && a.num != 0, nil },
		"none":     func(a, _ Value) (bool, error) { return a.kind == KindNull, nil },
		"string":   func(a, _ Value) (bool, error) { return a.kind == KindString, nil },
		"number":   func(a, _ Value) (bool, error) { return a.isNumber(), nil },
		"integer":  func(a, _ Value) (bool, error) { return a.kind == KindInt, nil },
		"iterable": func(a, _ Value) (bool, error) { return a.kind == KindArray || a.kind == KindString, nil },
		"mapping":  func(a, _ Value) (bool, error) { return a.isObject(), nil },
		"sequence": func(a, _ Value) (bool, error) {
			return a.isArray() || a.isObject() || a.kind == KindString, nil
		},
		"lower": func(a, _ Value) (bool, error) {
			return a.kind == KindString && !hasCase(a.str, 'A', 'Z', strings.ToLower), nil
		},
		"upper": func(a, _ Value) (bool, error) {
			return a.kind == KindString && !hasCase(a.str, 'a', 'z', strings.ToUpper), nil
		},
		"defined":   func(a, _ Value) (bool, error) { return a.kind != KindUndefined, nil },
		"undefined": func(a, _ Value) (bool, error) { return a.kind == KindUndefined, nil },
		"equalto":   func(a, b Value) (bool, error) { return strictEqual(a, b), nil },
		"eq":        func(a, b Value) (bool, error) { return strictEqual(a, b), nil },
	}
}

func stringsContains(s, sub string) bool { return strings.Contains(s, sub) }

// hasCase reports whether conv changes s; for ASCII s, whether s holds a
// byte in [lo, hi] (without converting).
func hasCase(s string, lo, hi byte, conv func(string) string) bool {
	if !isASCII(s) {
		return conv(s) != s
	}
	return hasByteIn(s, lo, hi)
}

func hasByteIn(s string, lo, hi byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= lo && s[i] <= hi {
			return true
		}
	}
	return false
}

var stringMethods = map[string]bool{"upper": true, "lower": true, "strip": true, "title": true, "capitalize": true,
	"rstrip": true, "lstrip": true, "startswith": true, "endswith": true, "split": true, "replace": true}

var objectMethods = map[string]bool{"get": true, "items": true, "keys": true, "values": true, "dictsort": true}

// builtin returns obj's built-in attribute name (a bound method, or a
// string or array length), or undefined.
func builtin(obj Value, name string, pyStrip *bool) Value {
	switch {
	case obj.kind == KindString:
		if name == "length" {
			return Int(int64(utf16Len(obj.str)))
		}
		if !stringMethods[name] {
			return Value{}
		}
	case obj.isArray():
		if name == "length" {
			return Int(int64(len(obj.arr.items)))
		}
		return Value{}
	case obj.isObject():
		if !objectMethods[name] {
			return Value{}
		}
	default:
		return Value{}
	}
	return fn(name, func(st *state, _ *env, args []Value) (Value, error) {
		v, _, err := callMethod(st, obj, name, args)
		return v, err
	})
}

// callMethod calls a built-in method; ok is false when obj has no such
// method.
func callMethod(st *state, obj Value, name string, args []Value) (v Value, ok bool, err error) {
	if obj.kind == KindString {
		if !stringMethods[name] {
			return Value{}, false, nil
		}
		v, err = stringMethod(st, obj.str, name, args)
		return v, true, err
	}
	if obj.isObject() {
		if !objectMethods[name] {
			return Value{}, false, nil
		}
		v, err = objectMethod(st, obj.obj, name, args)
		return v, true, err
	}
	return Value{}, false, nil
}

func stripChars(st *state, s string, args []Value, left, right bool) string {
	if st.opts.PythonStrip && len(args) > 0 && args[0].kind == KindString {
		cs := args[0].str
		if left {
			s = strings.TrimLeft(s, cs)
		}
		if right {
			s = strings.TrimRight(s, cs)
		}
		return s
	}
	if left {
		s = jsTrimLeft(s)
	}
	if right {
		s = jsTrimRight(s)
	}
	return s
}

func stringMethod(st *state, s, name string, args []Value) (Value, error) {
	if err := st.charge(len(s) / 8); err != nil {
		return Value{}, err
	}
	switch name {
	case "upper":
		return st.built(st.mapCase(s, 'a', 'z', unicode.ToUpper), s)
	case "lower":
		return st.built(st.mapCase(s, 'A', 'Z', unicode.ToLower), s)
	case "strip":
		return String(stripChars(st, s, args, true, true)), nil
	case "lstrip":
		return String(stripChars(st, s, args, true, false)), nil
	case "rstrip":
		return String(stripChars(st, s, args, false, true)), nil
	case "title":
		return st.built(st.titleCase(s), s)
	case "capitalize":
		if s == "" {
			return String(""), nil
		}
		r, size := utf8.DecodeRuneInString(s)
		st.reserve(len(s) + utf8.UTFMax)
		mark := len(st.strs)
		st.strs = utf8.AppendRune(st.strs, unicode.ToUpper(r))
		st.strs = append(st.strs, s[size:]...)
		return String(st.view(mark)), st.spend(len(st.strs) - mark)
	case "startswith", "endswith":
		if len(args) == 0 {
			return Value{}, errorf("%s() requires at least one argument", name)
		}
		has := strings.HasPrefix
		if name == "endswith" {
			has = strings.HasSuffix
		}
		p := args[0]
		switch {
		case p.kind == KindString:
			return Bool(has(s, p.str)), nil
		case p.isArray():
			for _, it := range p.arr.items {
				if it.kind != KindString {
					return Value{}, errorf("%s() tuple elements must be strings", name)
				}
				if has(s, it.str) {
					return Bool(true), nil
				}
			}
			return Bool(false), nil
		}
		return Value{}, errorf("%s() argument must be a string or tuple of strings", name)
	case "split":
		sep := Null()
		if len(args) > 0 {
			sep = args[0]
		}
		maxsplit := -1
		if len(args) > 1 {
			if args[1].kind != KindInt {
				return Value{}, errorf("maxsplit argument must be a number")
			}
			maxsplit = int(args[1].num)
		}
		var parts []Value
		switch sep.kind {
		case KindNull:
			parts = st.scratch[:0]
			text := jsTrimLeft(s)
			for text != "" {
				i := strings.IndexFunc(text, isJSSpace)
				if maxsplit != -1 && len(parts) >= maxsplit {
					parts = append(parts, String(text))
					break
				}
				if i < 0 {
					parts = append(parts, String(text))
					break
				}
				parts = append(parts, String(text[:i]))
				text = jsTrimLeft(text[i:])
			}
			st.scratch = parts[:0]
			if err := st.charge(len(parts)); err != nil { // one step a part built
				return Value{}, err
			}
		case KindString:
			if sep.str == "" {
				return Value{}, errorf("empty separator")
			}
			// JavaScript: split all, then splice(maxsplit) the tail back
			// together (a negative maxsplit counts from the end).
			total := strings.Count(s, sep.str) + 1
			k := total
			if maxsplit != -1 && total > maxsplit {
				k = maxsplit
				if k < 0 {
					k = max(total+maxsplit, 0)
				}
			}
			cuts := min(k, total-1)
			if err := st.charge(cuts); err != nil { // one step a part built
				return Value{}, err
			}
			parts = st.values(cuts + 1)
			rest := s
			for i := 0; i < cuts; i++ {
				j := strings.Index(rest, sep.str)
				parts[i] = String(rest[:j])
				rest = rest[j+len(sep.str):]
			}
			parts[cuts] = String(rest)
			return st.array(KindArray, parts), nil
		default:
			return Value{}, errorf("sep argument must be a string or null")
		}
		out := st.values(len(parts))
		copy(out, parts)
		return st.array(KindArray, out), nil
	case "replace":
		if len(args) < 2 {
			return Value{}, errorf("replace() requires at least two arguments")
		}
		oldV, newV := args[0], args[1]
		if oldV.kind != KindString || newV.kind != KindString {
			return Value{}, errorf("replace() arguments must be strings")
		}
		count := Null()
		if len(args) > 2 {
			if args[2].kind == KindKwargs {
				if c, ok := args[2].obj.Get("count"); ok {
					count = c
				}
			} else {
				count = args[2]
			}
		}
		if count.kind != KindInt && count.kind != KindNull {
			return Value{}, errorf("replace() count argument must be a number or null")
		}
		n := -1
		if count.kind == KindInt && count.num >= 0 {
			n = int(count.num)
		}
		rn := replacedLen(s, oldV.str, newV.str, n)
		if err := st.fits(rn); err != nil {
			return Value{}, err
		}
		st.reserve(rn)
		mark := len(st.strs)
		if oldV.str == "" {
			st.strs = appendReplaceEmpty(st.strs, s, newV.str, n)
		} else {
			st.strs = appendReplace(st.strs, s, oldV.str, newV.str, n)
		}
		if err := st.spend(len(st.strs) - mark); err != nil {
			return Value{}, err
		}
		return String(st.view(mark)), nil
	}
	return Value{}, errorf("unknown string method %s", name)
}

// replacedLen is the length of s with the first n (all if n < 0)
// occurrences of old replaced by repl (appendReplace, appendReplaceEmpty).
func replacedLen(s, old, repl string, n int) int {
	var k int
	if old == "" {
		k = utf8.RuneCountInString(s) + 1
	} else {
		k = strings.Count(s, old)
	}
	if n >= 0 && n < k {
		k = n
	}
	return len(s) + k*(len(repl)-len(old))
}

// appendReplace appends s with the first n (all if n < 0) occurrences of
// old replaced by repl, as strings.Replace does.
func appendReplace(dst []byte, s, old, repl string, n int) []byte {
	for n != 0 {
		i := strings.Index(s, old)
		if i < 0 {
			break
		}
		dst = append(dst, s[:i]...)
		dst = append(dst, repl...)
		s = s[i+len(old):]
		if n > 0 {
			n--
		}
	}
	return append(dst, s...)
}

// appendReplaceEmpty inserts repl at every code point boundary, as
// replacing the empty pattern does in JavaScript (with the u flag).
func appendReplaceEmpty(dst []byte, s, repl string, n int) []byte {
	if n == 0 {
		return append(dst, s...)
	}
	for _, r := range s {
		if n != 0 {
			dst = append(dst, repl...)
			if n > 0 {
				n--
			}
		}
		dst = utf8.AppendRune(dst, r)
	}
	if n != 0 {
		dst = append(dst, repl...)
	}
	return dst
}

// built returns out, a string built from in, charged to the strings
// budget unless it is in itself (nothing was built).
func (st *state) built(out, in string) (Value, error) {
	if len(out) > 0 && unsafe.StringData(out) == unsafe.StringData(in) {
		return String(out), nil
	}
	return String(out), st.spend(len(out))
}

// mapCase returns s with every code point mapped by conv, as strings.ToUpper
// and strings.ToLower do; for ASCII s, changing only bytes in [lo, hi].
func (st *state) mapCase(s string, lo, hi byte, conv func(rune) rune) string {
	if isASCII(s) {
		if !hasByteIn(s, lo, hi) {
			return s
		}
		st.reserve(len(s))
		mark := len(st.strs)
		st.strs = append(st.strs, s...)
		b := st.strs[mark:]
		for i, c := range b {
			if c >= lo && c <= hi {
				b[i] = c ^ 0x20
			}
		}
		return st.view(mark)
	}
	st.reserve(len(s))
	mark := len(st.strs)
	for _, r := range s {
		st.strs = utf8.AppendRune(st.strs, conv(r))
	}
	return st.view(mark)
}

// titleCase upper-cases every ASCII word character that follows a non-word
// character, as /\b\w/g does.
func (st *state) titleCase(s string) string {
	st.reserve(len(s))
	mark := len(st.strs)
	st.strs = append(st.strs, s...)
	b := st.strs[mark:]
	prevWord := false
	for i, c := range b {
		w := isWordByte(c)
		if w && !prevWord && c >= 'a' && c <= 'z' {
			b[i] = c - 32
		}
		prevWord = w
	}
	return st.view(mark)
}

func (st *state) objectItems(o *Object) Value {
	out := st.values(len(o.keys))
	pairs := st.values(2 * len(o.keys))
	for i, k := range o.keys {
		pair := pairs[2*i : 2*i+2 : 2*i+2]
		pair[0], pair[1] = String(k), o.vals[i]
		out[i] = st.array(KindArray, pair)
	}
	return st.array(KindArray, out)
}

func objectMethod(st *state, o *Object, name string, args []Value) (Value, error) {
	switch name {
	case "get":
		if len(args) == 0 || args[0].kind != KindString {
			return Value{}, errorf("object key must be a string")
		}
		if v, ok := o.Get(args[0].str); ok {
			return v, nil
		}
		if len(args) > 1 {
			return args[1], nil
		}
		return Null(), nil
	case "items":
		return st.objectItems(o), nil
	case "keys":
		out := st.values(len(o.keys))
		for i, k := range o.keys {
			out[i] = String(k)
		}
		return st.array(KindArray, out), nil
	case "values":
		out := st.values(len(o.vals))
		copy(out, o.vals)
		return st.array(KindArray, out), nil
	case "dictsort":
		var kw *Object
		pos := st.values(len(args))[:0]
		for _, a := range args {
			if a.kind == KindKwargs {
				kw = a.obj
			} else {
				pos = append(pos, a)
			}
		}
		arg := func(i int, name string, def Value) Value {
			if i < len(pos) {
				return pos[i]
			}
			if v, ok := kw.Get(name); ok {
				return v
			}
			return def
		}
		cs := arg(0, "case_sensitive", Bool(false))
		by := arg(1, "by", String("key"))
		rev := arg(2, "reverse", Bool(false))
		if cs.kind != KindBool || rev.kind != KindBool || by.kind != KindString || (by.str != "key" && by.str != "value") {
			return Value{}, errorf("bad dictsort arguments")
		}
		all := st.objectItems(o)
		items := all.arr.items
		idx := 0
		if by.str == "value" {
			idx = 1
		}
		var cmpErr error
		slices.SortStableFunc(items, func(a, b Value) int {
			r, err := compareValues(a.arr.items[idx], b.arr.items[idx], cs.num != 0)
			if err != nil {
				cmpErr = err
			}
			if rev.num != 0 {
				r = -r
			}
			return r
		})
		if cmpErr != nil {
			return Value{}, cmpErr
		}
		return all, nil
	}
	return Value{}, errorf("unknown object method %s", name)
}

// compareValues ports compareRuntimeValues.
func compareValues(a, b Value, caseSensitive bool) (int, error) {
	if a.kind == KindNull && b.kind == KindNull || a.kind == KindUndefined && b.kind == KindUndefined {
		return 0, nil
	}
	if a.kind == KindNull || b.kind == KindNull || a.kind == KindUndefined || b.kind == KindUndefined {
		return 0, errorf("cannot compare %s with %s", a.kind, b.kind)
	}
	if a.isNumericLike() && b.isNumericLike() {
		switch {
		case a.num < b.num:
			return -1, nil
		case a.num > b.num:
			return 1, nil
		}
		return 0, nil
	}
	if a.kind != b.kind {
		return 0, errorf("cannot compare different types: %s and %s", a.kind, b.kind)
	}
	if a.kind == KindString {
		x, y := a.str, b.str
		if !caseSensitive {
			x, y = strings.ToLower(x), strings.ToLower(y)
		}
		return strings.Compare(x, y), nil
	}
	return 0, errorf("cannot compare type: %s", a.kind)
}

// attrPath ports getAttributeValue.
func attrPath(item Value, path string) Value {
	v := item
	for more := true; more; {
		var part string
		part, path, more = strings.Cut(path, ".")
		switch {
		case v.isAttrContainer():
			x, ok := v.obj.Get(part)
			if !ok {
				return Value{}
			}
			v = x
		case v.isArray():
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(v.arr.items) {
				return Value{}
			}
			v = v.arr.items[i]
		default:
			return Value{}
		}
	}
	return v
}

func (st *state) applyFilter(operand Value, f node, e *env) (Value, error) {
	switch f := f.(type) {
	case *ident:
		return st.simpleFilter(operand, f.name)
	case *callExpr:
		id, ok := f.callee.(*ident)
		if !ok {
			return Value{}, errorf("unknown filter")
		}
		return st.callFilter(operand, id.name, f.args, e)
	}
	return Value{}, errorf("unknown filter")
}

func (st *state) simpleFilter(v Value, name string) (Value, error) {
	switch name {
	case "safe":
		return v, nil
	case "tojson":
		return st.jsonString(v, jsonOptions{})
	case "string":
		if st.opts.PythonPrint && v.kind == KindNull {
			return String("None"), nil
		}
		if st.opts.PythonPrint && (v.isArray() || v.isObject()) {
			// Python's str: the container's repr.
			s := st.toString(v)
			return String(s), st.spend(len(s))
		}
	}
	switch {
	case v.isArray():
		items := v.arr.items
		switch name {
		case "list":
			return v, nil
		case "first":
			if len(items) == 0 {
				return Value{}, nil
			}
			return items[0], nil
		case "last":
			if len(items) == 0 {
				return Value{}, nil
			}
			return items[len(items)-1], nil
		case "length":
			return Int(int64(len(items))), nil
		case "reverse":
			// A copy: charged an element a step, as a[::-1] is.
			if err := st.charge(len(items)); err != nil {
				return Value{}, err
			}
			out := st.values(len(items))
			for i, x := range items {
				out[len(items)-1-i] = x
			}
			return st.array(KindArray, out), nil
		case "sort":
			return st.sortValues(items, false, false, Null())
		case "join":
			mark := len(st.strs)
			for _, x := range items {
				st.reserve(len(x.str))
				st.strs = st.joinItem(st.strs, x)
				if err := st.fits(len(st.strs) - mark); err != nil {
					return Value{}, err
				}
			}
			return String(st.view(mark)), st.spend(len(st.strs) - mark)
		case "string":
			if err := checkJSON(v, 0); err != nil {
				return Value{}, err
			}
			mark := len(st.strs)
			st.strs = appendJSONUpTo(st.strs, v, jsonOptions{}, 0, false, mark+st.opts.MaxOutput)
			return String(st.view(mark)), st.spend(len(st.strs) - mark)
		case "unique":
			if err := st.charge(len(items)); err != nil {
				return Value{}, err
			}
			type key struct {
				class uint8
				num   float64
				str   string
				ref   any
			}
			seen := make(map[key]bool, len(items))
			out := st.values(len(items))[:0]
			for _, x := range items {
				var k key
				switch {
				case x.kind == KindUndefined || x.kind == KindNull:
				case x.isNumber():
					k = key{class: 1, num: x.num}
				case x.kind == KindBool:
					k = key{class: 2, num: x.num}
				case x.kind == KindString:
					k = key{class: 3, str: x.str}
				case x.isArray():
					k = key{class: 4, ref: x.arr}
				case x.obj != nil:
					k = key{class: 4, ref: x.obj}
				default:
					k = key{class: 4, ref: x.fn}
				}
				if x.isNumber() && math.IsNaN(x.num) {
					out = append(out, x) // NaN !== NaN
					continue
				}
				if !seen[k] {
					seen[k] = true
					out = append(out, x)
				}
			}
			return st.array(KindArray, out), nil
		}
		return Value{}, errorf("unknown ArrayValue filter: %s", name)
	case v.kind == KindString:
		switch name {
		case "length":
			return Int(int64(utf16Len(v.str))), nil
		case "upper", "lower", "title", "capitalize":
			return stringMethod(st, v.str, name, nil)
		case "trim":
			return String(jsTrim(v.str)), nil
		case "indent":
			if err := st.fits(len(v.str) + strings.Count(v.str, "\n")*4); err != nil {
				return Value{}, err
			}
			out := st.indent(v.str, 4, false, false)
			return String(out), st.spend(len(out))
		case "join", "string":
			return v, nil
		case "int":
			return Int(parseIntPrefix(v.str)), nil
		case "float":
			f := parseFloatPrefix(v.str)
			if math.IsNaN(f) {
				f = 0
			}
			return Float(f), nil
		}
		return Value{}, errorf("unknown StringValue filter: %s", name)
	case v.isNumber():
		switch name {
		case "abs":
			if v.kind == KindInt {
				return Value{kind: KindInt, num: math.Abs(v.num)}, nil
			}
			return Float(math.Abs(v.num)), nil
		case "int":
			return Value{kind: KindInt, num: math.Floor(v.num)}, nil
		case "float":
			return Float(v.num), nil
		case "string":
			return String(st.toString(v)), nil
		}
		return Value{}, errorf("unknown NumericValue filter: %s", name)
	case v.isObject():
		switch name {
		case "items":
			return st.objectItems(v.obj), nil
		case "length":
			return Int(int64(v.obj.Len())), nil
		}
		if objectMethods[name] {
			return objectMethod(st, v.obj, name, nil)
		}
		return Value{}, errorf("unknown ObjectValue filter: %s", name)
	case v.kind == KindBool:
		switch name {
		case "bool":
			return v, nil
		case "int":
			return Int(int64(v.num)), nil
		case "float":
			return Float(v.num), nil
		case "string":
			return String(st.toString(v)), nil
		}
		return Value{}, errorf("unknown BooleanValue filter: %s", name)
	case v.kind == KindUndefined:
		// Python's Undefined is an empty string to the string filters and
		// an empty sequence to length.
		switch name {
		case "trim", "upper", "lower", "title", "capitalize", "string":
			return String(""), nil
		case "length":
			return Int(0), nil
		}
	}
	return Value{}, errorf("cannot apply filter %q to type: %s", name, v.kind)
}

func (st *state) jsonString(v Value, o jsonOptions) (Value, error) {
	if err := checkJSON(v, 0); err != nil {
		return Value{}, err
	}
	mark := len(st.strs)
	st.strs = appendJSONUpTo(st.strs, v, o, 0, true, mark+st.opts.MaxOutput)
	if err := st.spend(len(st.strs) - mark); err != nil {
		return Value{}, err
	}
	return String(st.view(mark)), nil
}

// toString returns v as @huggingface/jinja's toString renders it (None and
// booleans as Python's str, with PythonPrint).
func (st *state) toString(v Value) string {
	if v.kind == KindString {
		return v.str
	}
	mark := len(st.strs)
	if d, ok := st.pyScalar(st.strs, v); ok {
		st.strs = d
	} else {
		st.strs = appendString(st.strs, v)
	}
	return st.view(mark)
}

// joinItem appends an item of a join (jsPrimitiveString, or None and
// booleans as Python's str with PythonPrint).
func (st *state) joinItem(dst []byte, v Value) []byte {
	if d, ok := st.pyScalar(dst, v); ok {
		return d
	}
	return jsPrimitiveString(dst, v)
}

// indent indents the lines of s by width spaces: the first line only when
// first is set, empty lines only when blank is set.
func (st *state) indent(s string, width int, first, blank bool) string {
	mark := len(st.strs)
	for i := 0; ; i++ {
		line, rest, more := strings.Cut(s, "\n")
		if (first || i > 0) && (blank || line != "") {
			for k := 0; k < width; k++ {
				st.strs = append(st.strs, ' ')
			}
		}
		st.strs = append(st.strs, line...)
		if !more {
			break
		}
		st.strs = append(st.strs, '\n')
		s = rest
	}
	return st.view(mark)
}

// parseIntPrefix implements parseInt(s, 10) with NaN mapped to 0.
func parseIntPrefix(s string) int64 {
	s = jsTrimLeft(s)
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	j := i
	for j < len(s) && isDigit(s[j]) {
		j++
	}
	if j == i {
		return 0
	}
	n, err := strconv.ParseFloat(s[:j], 64)
	if err != nil {
		return 0
	}
	return int64(n)
}

// parseFloatPrefix implements parseFloat(s).
func parseFloatPrefix(s string) float64 {
	s = jsTrimLeft(s)
	for _, inf := range []string{"Infinity", "+Infinity"} {
		if strings.HasPrefix(s, inf) {
			return math.Inf(1)
		}
	}
	if strings.HasPrefix(s, "-Infinity") {
		return math.Inf(-1)
	}
	best := math.NaN()
	// The longest prefix that parses as a decimal literal.
	end := 0
	for end < len(s) && strings.IndexByte("0123456789+-.eE", s[end]) >= 0 {
		end++
	}
	for j := end; j > 0; j-- {
		if f, err := strconv.ParseFloat(s[:j], 64); err == nil {
			return f
		}
	}
	return best
}

func (st *state) sortValues(items []Value, reverse, caseSensitive bool, attr Value) (Value, error) {
	if err := st.charge(len(items) * 16); err != nil {
		return Value{}, err
	}
	out := st.values(len(items))
	copy(out, items)
	path, byPath := attr.str, attr.kind == KindString
	if attr.kind == KindInt {
		path, byPath = strconv.Itoa(int(attr.num)), true
	}
	key := func(v Value) Value {
		if byPath {
			return attrPath(v, path)
		}
		return v
	}
	var cmpErr error
	slices.SortStableFunc(out, func(a, b Value) int {
		r, err := compareValues(key(a), key(b), caseSensitive)
		if err != nil {
			cmpErr = err
		}
		if reverse {
			r = -r
		}
		return r
	})
	if cmpErr != nil {
		return Value{}, cmpErr
	}
	return st.array(KindArray, out), nil
}

func (st *state) callFilter(v Value, name string, argNodes []node, e *env) (Value, error) {
	pos, kw, err := st.args(argNodes, e)
	if err != nil {
		return Value{}, err
	}
	kwGet := func(k string) (Value, bool) { return kw.Get(k) }
	arg := func(i int, k string, def Value) Value {
		if i >= 0 && i < len(pos) {
			return pos[i]
		}
		if x, ok := kwGet(k); ok {
			return x
		}
		return def
	}
	switch name {
	case "tojson":
		var o jsonOptions
		ind := arg(-1, "indent", Null())
		if ind.kind != KindInt && ind.kind != KindNull {
			return Value{}, errorf("if set, indent must be a number")
		}
		if ind.kind == KindInt {
			o.indent = int(ind.num)
			if o.indent > 64 {
				return Value{}, limitf("indent too large")
			}
		}
		ea := arg(-1, "ensure_ascii", Bool(false))
		sk := arg(-1, "sort_keys", Bool(false))
		if ea.kind != KindBool || sk.kind != KindBool {
			return Value{}, errorf("if set, ensure_ascii and sort_keys must be booleans")
		}
		o.ensureASCII, o.sortKeys = ea.num != 0, sk.num != 0
		seps := arg(-1, "separators", Null())
		switch {
		case seps.isArray():
			it := seps.arr.items
			if len(it) != 2 || it[0].kind != KindString || it[1].kind != KindString {
				return Value{}, errorf("separators must be a tuple of two strings")
			}
			o.haveSeps, o.itemSep, o.keySep = true, it[0].str, it[1].str
		case seps.kind != KindNull:
			return Value{}, errorf("if set, separators must be a tuple of two strings")
		}
		return st.jsonString(v, o)
	case "join":
		if v.kind != KindString && !v.isArray() {
			return Value{}, errorf("cannot apply filter \"join\" to type: %s", v.kind)
		}
		sep := arg(0, "separator", String(""))
		if sep.kind != KindString {
			return Value{}, errorf("separator must be a string")
		}
		mark := len(st.strs)
		if v.kind == KindString { // the code points, joined
			first := true
			for _, r := range v.str {
				if !first {
					st.strs = append(st.strs, sep.str...)
				}
				first = false
				st.strs = utf8.AppendRune(st.strs, r)
				if err := st.fits(len(st.strs) - mark); err != nil {
					return Value{}, err
				}
			}
			return String(st.view(mark)), st.spend(len(st.strs) - mark)
		}
		for i, x := range v.arr.items {
			st.reserve(len(sep.str) + len(x.str))
			if i > 0 {
				st.strs = append(st.strs, sep.str...)
			}
			st.strs = st.joinItem(st.strs, x)
			if err := st.fits(len(st.strs) - mark); err != nil {
				return Value{}, err // refused as it grows, not once built
			}
		}
		return String(st.view(mark)), st.spend(len(st.strs) - mark)
	case "int", "float":
		def := Int(0)
		if name == "float" {
			def = Float(0)
		}
		def = arg(0, "default", def)
		switch {
		case v.kind == KindString:
			if name == "int" {
				s := jsTrimLeft(v.str)
				if s == "" || !(isDigit(s[0]) || len(s) > 1 && (s[0] == '-' || s[0] == '+') && isDigit(s[1])) {
					return def, nil
				}
				return Int(parseIntPrefix(v.str)), nil
			}
			f := parseFloatPrefix(v.str)
			if math.IsNaN(f) {
				return def, nil
			}
			return Float(f), nil
		case v.isNumber():
			return v, nil
		case v.kind == KindBool:
			if name == "int" {
				return Int(int64(v.num)), nil
			}
			return Float(v.num), nil
		}
		return Value{}, errorf("cannot apply filter %q to type: %s", name, v.kind)
	case "default":
		def := String("")
		if len(pos) > 0 {
			def = pos[0]
		}
		boolean := arg(1, "boolean", Bool(false))
		if boolean.kind != KindBool {
			return Value{}, errorf("`default` filter flag must be a boolean")
		}
		if v.kind == KindUndefined || (boolean.num != 0 && !v.Truth()) {
			return def, nil
		}
		return v, nil
	}
	switch {
	case v.isArray():
		items := v.arr.items
		switch name {
		case "sort":
			rev := arg(0, "reverse", Bool(false))
			cs := arg(1, "case_sensitive", Bool(false))
			attr := arg(2, "attribute", Null())
			if rev.kind != KindBool || cs.kind != KindBool {
				return Value{}, errorf("reverse and case_sensitive must be booleans")
			}
			if attr.kind != KindString && attr.kind != KindInt && attr.kind != KindNull {
				return Value{}, errorf("attribute must be a string, integer, or null")
			}
			return st.sortValues(items, rev.num != 0, cs.num != 0, attr)
		case "selectattr", "rejectattr", "map":
			if err := st.charge(len(items)); err != nil {
				return Value{}, err
			}
		}
		switch name {
		case "selectattr", "rejectattr":
			for _, it := range items {
				if !it.isAttrContainer() {
					return Value{}, errorf("`%s` can only be applied to array of objects", name)
				}
			}
			for _, a := range argNodes {
				if _, ok := a.(*strLit); !ok {
					return Value{}, errorf("arguments of `%s` must be strings", name)
				}
			}
			if len(pos) == 0 {
				return Value{}, errorf("`%s` needs an attribute name", name)
			}
			attr := pos[0]
			var test testFunc = func(a, _ Value) (bool, error) { return a.Truth(), nil }
			if len(pos) > 1 {
				t, ok := tests[pos[1].str]
				if !ok {
					return Value{}, errorf("unknown test: %s", pos[1].str)
				}
				test = t
			}
			var val Value
			if len(pos) > 2 {
				val = pos[2]
			}
			out := st.values(len(items))[:0]
			for _, it := range items {
				// A missing attribute is undefined, and tested as such:
				// selectattr("tool_calls", "undefined") keeps the items
				// without one.
				a, _ := it.obj.Get(attr.str)
				r, err := test(a, val)
				if err != nil {
					return Value{}, err
				}
				if r == (name == "selectattr") {
					out = append(out, it)
				}
			}
			return st.array(KindArray, out), nil
		case "map":
			attr, ok := kwGet("attribute")
			if !ok {
				return Value{}, errorf("`map` expressions without `attribute` set are not currently supported")
			}
			if attr.kind != KindString {
				return Value{}, errorf("attribute must be a string")
			}
			def, _ := kwGet("default")
			out := st.values(len(items))
			for i, it := range items {
				if !it.isAttrContainer() {
					return Value{}, errorf("items in map must be an object")
				}
				x := attrPath(it, attr.str)
				if x.kind == KindUndefined {
					x = def
				}
				out[i] = x
			}
			return st.array(KindArray, out), nil
		}
		return Value{}, errorf("unknown ArrayValue filter: %s", name)
	case v.kind == KindString:
		switch name {
		case "indent":
			w := arg(0, "width", Int(4))
			if w.kind != KindInt {
				return Value{}, errorf("width must be a number")
			}
			if w.num > 1024 {
				return Value{}, limitf("indent width too large")
			}
			first := arg(1, "first", Bool(false))
			blank := arg(2, "blank", Bool(false))
			// At most width spaces a line: refused before it is built
			// (10 million newlines indented by 100 built 1 GB first).
			if err := st.fits(len(v.str) + (strings.Count(v.str, "\n")+1)*max(int(w.num), 0)); err != nil {
				return Value{}, err
			}
			out := st.indent(v.str, int(w.num), first.Truth(), blank.Truth())
			return String(out), st.spend(len(out))
		case "replace":
			args := pos
			if kw != nil {
				args = append(args, Value{kind: KindKwargs, obj: kw})
			} else {
				args = append(args, Value{kind: KindKwargs, obj: st.newObject()})
			}
			return stringMethod(st, v.str, "replace", args)
		}
		return Value{}, errorf("unknown StringValue filter: %s", name)
	case v.isObject():
		if objectMethods[name] {
			if kw != nil {
				pos = append(pos, Value{kind: KindKwargs, obj: kw})
			}
			return objectMethod(st, v.obj, name, pos)
		}
		return Value{}, errorf("unknown ObjectValue filter: %s", name)
	}
	return Value{}, errorf("cannot apply filter %q to type: %s", name, v.kind)
}
