package jinja

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
			msg = toString(args[0])
		}
		return Value{}, &Error{Msg: msg}
	}))
	g.set("range", fn("range", builtinRange))
	g.set("strftime_now", fn("strftime_now", func(st *state, _ *env, args []Value) (Value, error) {
		if len(args) == 0 || args[0].kind != KindString {
			return Value{}, errorf("strftime_now expects a format string")
		}
		return String(strftime(st.opts.Now(), args[0].str)), nil
	}))
	g.set("namespace", fn("namespace", builtinNamespace))
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
	var out []Value
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		if len(out) >= maxRange {
			return Value{}, errorf("range too large")
		}
		out = append(out, Number(i))
	}
	if err := st.charge(len(out)); err != nil {
		return Value{}, err
	}
	return Array(out...), nil
}

func builtinNamespace(_ *state, _ *env, args []Value) (Value, error) {
	pos := args
	var kw *Object
	if len(pos) > 0 && pos[len(pos)-1].kind == KindKwargs {
		kw = pos[len(pos)-1].obj
		pos = pos[:len(pos)-1]
	}
	if len(pos) > 1 {
		return Value{}, errorf("namespace expected at most 1 argument, got %d", len(pos))
	}
	o := NewObject(4)
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

// strftime supports the directives @huggingface/jinja does.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	pad2 := func(n int) {
		if n < 10 {
			b.WriteByte('0')
		}
		b.WriteString(strconv.Itoa(n))
	}
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'm':
			pad2(int(t.Month()))
		case 'd':
			pad2(t.Day())
		case 'b':
			b.WriteString(monthNames[t.Month()-1][:3])
		case 'B':
			b.WriteString(monthNames[t.Month()-1])
		case 'H':
			pad2(t.Hour())
		case 'M':
			pad2(t.Minute())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
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
			return a.kind == KindString && a.str == strings.ToLower(a.str), nil
		},
		"upper": func(a, _ Value) (bool, error) {
			return a.kind == KindString && a.str == strings.ToUpper(a.str), nil
		},
		"defined":   func(a, _ Value) (bool, error) { return a.kind != KindUndefined, nil },
		"undefined": func(a, _ Value) (bool, error) { return a.kind == KindUndefined, nil },
		"equalto":   func(a, b Value) (bool, error) { return strictEqual(a, b), nil },
		"eq":        func(a, b Value) (bool, error) { return strictEqual(a, b), nil },
	}
}

func stringsContains(s, sub string) bool { return strings.Contains(s, sub) }

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
		v, err = objectMethod(obj.obj, name, args)
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
		return String(strings.ToUpper(s)), nil
	case "lower":
		return String(strings.ToLower(s)), nil
	case "strip":
		return String(stripChars(st, s, args, true, true)), nil
	case "lstrip":
		return String(stripChars(st, s, args, true, false)), nil
	case "rstrip":
		return String(stripChars(st, s, args, false, true)), nil
	case "title":
		return String(titleCase(s)), nil
	case "capitalize":
		if s == "" {
			return String(""), nil
		}
		r, size := utf8.DecodeRuneInString(s)
		return String(strings.ToUpper(string(r)) + s[size:]), nil
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
		var parts []string
		switch sep.kind {
		case KindNull:
			text := jsTrimLeft(s)
			for text != "" {
				i := strings.IndexFunc(text, isJSSpace)
				if maxsplit != -1 && len(parts) >= maxsplit {
					parts = append(parts, text)
					break
				}
				if i < 0 {
					parts = append(parts, text)
					break
				}
				parts = append(parts, text[:i])
				text = jsTrimLeft(text[i:])
			}
		case KindString:
			if sep.str == "" {
				return Value{}, errorf("empty separator")
			}
			parts = strings.Split(s, sep.str)
			if maxsplit != -1 && len(parts) > maxsplit {
				rest := strings.Join(parts[maxsplit:], sep.str)
				parts = append(parts[:maxsplit:maxsplit], rest)
			}
		default:
			return Value{}, errorf("sep argument must be a string or null")
		}
		out := make([]Value, len(parts))
		for i, p := range parts {
			out[i] = String(p)
		}
		return Array(out...), nil
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
		var out string
		if oldV.str == "" {
			out = replaceEmpty(s, newV.str, n)
		} else {
			out = strings.Replace(s, oldV.str, newV.str, n)
		}
		if err := st.spend(len(out)); err != nil {
			return Value{}, err
		}
		return String(out), nil
	}
	return Value{}, errorf("unknown string method %s", name)
}

// replaceEmpty inserts repl at every code point boundary, as replacing the
// empty pattern does in JavaScript (with the u flag).
func replaceEmpty(s, repl string, n int) string {
	if n == 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		_ = i
		if n != 0 {
			b.WriteString(repl)
			if n > 0 {
				n--
			}
		}
		b.WriteRune(r)
	}
	if n != 0 {
		b.WriteString(repl)
	}
	return b.String()
}

// titleCase upper-cases every ASCII word character that follows a non-word
// character, as /\b\w/g does.
func titleCase(s string) string {
	b := []byte(s)
	prevWord := false
	for i, c := range b {
		w := isWordByte(c)
		if w && !prevWord && c >= 'a' && c <= 'z' {
			b[i] = c - 32
		}
		prevWord = w
	}
	return string(b)
}

func objectItems(o *Object) Value {
	out := make([]Value, len(o.keys))
	for i, k := range o.keys {
		out[i] = Array(String(k), o.vals[i])
	}
	return Array(out...)
}

func objectMethod(o *Object, name string, args []Value) (Value, error) {
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
		return objectItems(o), nil
	case "keys":
		out := make([]Value, len(o.keys))
		for i, k := range o.keys {
			out[i] = String(k)
		}
		return Array(out...), nil
	case "values":
		return Array(append([]Value(nil), o.vals...)...), nil
	case "dictsort":
		var kw *Object
		var pos []Value
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
		items := objectItems(o).arr.items
		idx := 0
		if by.str == "value" {
			idx = 1
		}
		var cmpErr error
		sort.SliceStable(items, func(a, b int) bool {
			r, err := compareValues(items[a].arr.items[idx], items[b].arr.items[idx], cs.num != 0)
			if err != nil {
				cmpErr = err
			}
			if rev.num != 0 {
				r = -r
			}
			return r < 0
		})
		if cmpErr != nil {
			return Value{}, cmpErr
		}
		return Array(items...), nil
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
	for _, part := range strings.Split(path, ".") {
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
			out := make([]Value, len(items))
			for i, x := range items {
				out[len(items)-1-i] = x
			}
			return Array(out...), nil
		case "sort":
			return st.sortValues(items, false, false, Null())
		case "join":
			var b []byte
			for _, x := range items {
				b = jsPrimitiveString(b, x)
			}
			return String(string(b)), st.spend(len(b))
		case "string":
			if err := checkJSON(v, 0); err != nil {
				return Value{}, err
			}
			b := appendJSON(nil, v, jsonOptions{}, 0, false)
			return String(string(b)), st.spend(len(b))
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
			var out []Value
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
			return Array(out...), nil
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
			return String(indent(v.str, 4, false, false)), nil
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
			return String(toString(v)), nil
		}
		return Value{}, errorf("unknown NumericValue filter: %s", name)
	case v.isObject():
		switch name {
		case "items":
			return objectItems(v.obj), nil
		case "length":
			return Int(int64(v.obj.Len())), nil
		}
		if objectMethods[name] {
			return objectMethod(v.obj, name, nil)
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
			return String(toString(v)), nil
		}
		return Value{}, errorf("unknown BooleanValue filter: %s", name)
	}
	return Value{}, errorf("cannot apply filter %q to type: %s", name, v.kind)
}

func (st *state) jsonString(v Value, o jsonOptions) (Value, error) {
	if err := checkJSON(v, 0); err != nil {
		return Value{}, err
	}
	b := appendJSON(nil, v, o, 0, true)
	if err := st.spend(len(b)); err != nil {
		return Value{}, err
	}
	return String(string(b)), nil
}

func indent(s string, width int, first, blank bool) string {
	lines := strings.Split(s, "\n")
	pad := strings.Repeat(" ", max(width, 0))
	for i, l := range lines {
		if (!first && i == 0) || (!blank && l == "") {
			continue
		}
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
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
	out := append([]Value(nil), items...)
	key := func(v Value) Value {
		switch attr.kind {
		case KindString:
			return attrPath(v, attr.str)
		case KindInt:
			return attrPath(v, strconv.Itoa(int(attr.num)))
		}
		return v
	}
	var cmpErr error
	sort.SliceStable(out, func(a, b int) bool {
		r, err := compareValues(key(out[a]), key(out[b]), caseSensitive)
		if err != nil {
			cmpErr = err
		}
		if reverse {
			r = -r
		}
		return r < 0
	})
	if cmpErr != nil {
		return Value{}, cmpErr
	}
	return Array(out...), nil
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
				return Value{}, errorf("indent too large")
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
		var parts []Value
		switch {
		case v.kind == KindString:
			for _, r := range v.str {
				parts = append(parts, String(string(r)))
			}
		case v.isArray():
			parts = v.arr.items
		default:
			return Value{}, errorf("cannot apply filter \"join\" to type: %s", v.kind)
		}
		sep := arg(0, "separator", String(""))
		if sep.kind != KindString {
			return Value{}, errorf("separator must be a string")
		}
		var b []byte
		for i, x := range parts {
			if i > 0 {
				b = append(b, sep.str...)
			}
			b = jsPrimitiveString(b, x)
		}
		return String(string(b)), st.spend(len(b))
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
			var out []Value
			for _, it := range items {
				r := false
				if a, ok := it.obj.Get(attr.str); ok {
					if r, err = test(a, val); err != nil {
						return Value{}, err
					}
				}
				if r == (name == "selectattr") {
					out = append(out, it)
				}
			}
			return Array(out...), nil
		case "map":
			attr, ok := kwGet("attribute")
			if !ok {
				return Value{}, errorf("`map` expressions without `attribute` set are not currently supported")
			}
			if attr.kind != KindString {
				return Value{}, errorf("attribute must be a string")
			}
			def, _ := kwGet("default")
			out := make([]Value, len(items))
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
			return Array(out...), nil
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
				return Value{}, errorf("indent width too large")
			}
			first := arg(1, "first", Bool(false))
			blank := arg(2, "blank", Bool(false))
			out := indent(v.str, int(w.num), first.Truth(), blank.Truth())
			return String(out), st.spend(len(out))
		case "replace":
			args := pos
			if kw != nil {
				args = append(args, Value{kind: KindKwargs, obj: kw})
			} else {
				args = append(args, Value{kind: KindKwargs, obj: NewObject(0)})
			}
			return stringMethod(st, v.str, "replace", args)
		}
		return Value{}, errorf("unknown StringValue filter: %s", name)
	case v.isObject():
		if objectMethods[name] {
			if kw != nil {
				pos = append(pos, Value{kind: KindKwargs, obj: kw})
			}
			return objectMethod(v.obj, name, pos)
		}
		return Value{}, errorf("unknown ObjectValue filter: %s", name)
	}
	return Value{}, errorf("cannot apply filter %q to type: %s", name, v.kind)
}
