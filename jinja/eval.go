package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Template is a parsed template. It is immutable and safe for concurrent use.
type Template struct {
	body []node
	opts Options
	// keepsLoop: the template may hold a loop object past its iteration
	// (loopref.go), so each iteration builds a fresh one.
	keepsLoop bool
	pool      sync.Pool // *state, see arena.go
}

// Options tunes rendering. The zero value matches @huggingface/jinja.
type Options struct {
	// PythonStrip makes str.strip/lstrip/rstrip honour their chars argument
	// as Python does. @huggingface/jinja ignores the argument and strips
	// whitespace, which is the default here.
	PythonStrip bool
	// PythonPrint writes None and booleans as Python's str does ("None",
	// "True", "False") where a value becomes text: output, ~ and +, join
	// and the string filter. @huggingface/jinja writes nothing for null
	// and "true"/"false", which is the default here. Undefined is "" both
	// ways; tojson writes JSON either way. Lists and dicts are written as
	// Python's repr ("['a', None]", "{'k': True}") instead of JSON.
	PythonPrint bool
	// PythonCompare makes == and != compare as Python does: a string never
	// equals a number ('1' == 1 is false), undefined equals only undefined
	// and None only None; numbers and booleans compare by value (True == 1).
	// @huggingface/jinja compares as JavaScript's == does, the default here.
	PythonCompare bool
	// MaxOutput bounds the rendered output and every intermediate string,
	// in bytes. Zero means 16 MiB.
	MaxOutput int
	// MaxSteps bounds the number of evaluated nodes. Zero means 10 million.
	MaxSteps int
	// Now returns the time for strftime_now. Nil means time.Now.
	Now func() time.Time
}

// Parse parses a template with default options.
func Parse(src string) (*Template, error) { return ParseWithOptions(src, Options{}) }

// ParseWithOptions parses a template.
func ParseWithOptions(src string, opts Options) (*Template, error) {
	toks, err := tokenize(src)
	if err != nil {
		return nil, fmt.Errorf("cannot tokenize template: %w", err)
	}
	body, err := parse(toks)
	if err != nil {
		return nil, fmt.Errorf("cannot parse template: %w", err)
	}
	if opts.MaxOutput <= 0 || opts.MaxOutput > 32<<20 {
		opts.MaxOutput = min(max(opts.MaxOutput, 16<<20), 32<<20)
	}
	if opts.MaxSteps <= 0 {
		opts.MaxSteps = 10_000_000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Template{body: body, opts: opts, keepsLoop: keepsLoop(body)}, nil
}

// Error is a template runtime error, including raise_exception.
type Error struct {
	Msg string
	// Limit is set when a resource bound of Options (MaxSteps,
	// MaxOutput) stopped the render, not the template or its data.
	Limit bool
}

func (e *Error) Error() string { return e.Msg }

func errorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// limitf is errorf for a resource bound that stopped the render.
func limitf(format string, args ...any) error {
	return &Error{Msg: fmt.Sprintf(format, args...), Limit: true}
}

// IsLimit reports whether err (or an error it wraps) is a render stopped by
// a resource bound of Options rather than by the template or its data.
func IsLimit(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Limit
}

var (
	errBreak    = errors.New("break outside loop")
	errContinue = errors.New("continue outside loop")
)

const maxCallDepth = 64

type state struct {
	opts   *Options
	steps  int
	depth  int
	strBud int // bytes that string-building operations may still allocate
	mem    int // bytes of arena values, objects and scopes handed out (Options.maxMem)

	keepsLoop  bool      // the template's (Template.keepsLoop)
	spareLoops []*Object // loop objects of finished loops, for the next ones

	// Arenas, reset between renders (arena.go).
	strs  []byte
	vals  []Value
	nvals int
	objs  []*Object
	nobjs int
	arrs  []*arrayData
	narrs int
	envs  []*env
	nenvs int
	bufs  [][]byte
	nbufs int
	// scratch collects values of unknown count before they are copied to
	// the arena; not reentrant.
	scratch []Value
}

func (st *state) step() error {
	st.steps++
	if st.steps > st.opts.MaxSteps || st.mem > st.opts.maxMem() {
		return st.overBudget()
	}
	return nil
}

// charge counts n units of work against the step budget.
func (st *state) charge(n int) error {
	st.steps += n
	if st.steps > st.opts.MaxSteps || st.mem > st.opts.maxMem() {
		return st.overBudget()
	}
	return nil
}

func (st *state) overBudget() error {
	if st.steps > st.opts.MaxSteps {
		return limitf("template exceeded %d evaluation steps", st.opts.MaxSteps)
	}
	return limitf("template held more than %d bytes of values", st.opts.maxMem())
}

// maxMem bounds the bytes of values, objects and scopes a render may hold
// (strings have their own budget, strBudget times MaxOutput): steps alone do not
// bound memory, as one step may build a whole object.
func (o *Options) maxMem() int { return 4 * o.MaxOutput }

// spend charges n bytes of string building to the budget.
func (st *state) spend(n int) error {
	if n > st.opts.MaxOutput {
		return limitf("template string exceeds %d bytes", st.opts.MaxOutput)
	}
	st.strBud -= n
	if st.strBud < 0 {
		return limitf("template built more than %d bytes of strings", strBudget*st.opts.MaxOutput)
	}
	return nil
}

// strBudget is how many times MaxOutput a render may build in strings
// (concatenations, filters, methods), all of them together. Real chat
// templates build at most about 4.5 times their output (67 templates of
// testdata/templates on a 5 MB conversation with tools: LFM2.5-VL 15.4 MB
// for 3.5 MB of output, most about 1-2 times); 16 let a hostile template
// build 256 MiB (1.4 GB allocated, seconds of CPU) on every request.
const strBudget = 4

// fits refuses a string of n bytes about to be built: longer than
// MaxOutput, or past the string budget. Operations whose result may be
// many times their operands (replace, indent, join) check before or while
// they build, not after: a replace of 20 characters by a 10 MB string
// built 200 MB before the budget refused it.
func (st *state) fits(n int) error {
	if n > st.opts.MaxOutput {
		return limitf("template string exceeds %d bytes", st.opts.MaxOutput)
	}
	if n > st.strBud {
		return limitf("template built more than %d bytes of strings", strBudget*st.opts.MaxOutput)
	}
	return nil
}

type env struct {
	parent *env
	names  []string
	vals   []Value
}

func (e *env) lookup(name string) Value {
	for s := e; s != nil; s = s.parent {
		for i := len(s.names) - 1; i >= 0; i-- {
			if s.names[i] == name {
				return s.vals[i]
			}
		}
	}
	return Value{}
}

func (e *env) set(name string, v Value) {
	for i := range e.names {
		if e.names[i] == name {
			e.vals[i] = v
			return
		}
	}
	e.names = append(e.names, name)
	e.vals = append(e.vals, v)
}

// Render appends the template rendered with vars (which may be nil) to dst.
// A warm render (same template, no growth of its pooled arenas) allocates
// nothing beyond what dst needs to grow.
func (t *Template) Render(dst []byte, vars *Object) ([]byte, error) {
	st := t.acquireState()
	defer t.releaseState(st)
	root := st.newEnv(globals)
	if vars != nil {
		root.names = append(root.names, vars.keys...)
		root.vals = append(root.vals, vars.vals...)
	}
	start := len(dst)
	out, err := st.block(dst, t.body, root)
	if err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			err = errorf("%v", err)
		}
		return dst[:start], err
	}
	return out, nil
}

func (st *state) block(dst []byte, body []node, e *env) ([]byte, error) {
	start := len(dst)
	for _, n := range body {
		var err error
		if dst, err = st.stmt(dst, n, e); err != nil {
			return dst, err
		}
		if len(dst)-start > st.opts.MaxOutput {
			return dst, limitf("template output exceeds %d bytes", st.opts.MaxOutput)
		}
	}
	return dst, nil
}

// blockString renders body to an arena string.
func (st *state) blockString(body []node, e *env) (string, error) {
	b, err := st.block(st.buf(), body, e)
	defer st.putBuf(b)
	if err != nil {
		return "", err
	}
	if err := st.spend(len(b)); err != nil {
		return "", err
	}
	return st.strBytes(b), nil
}

func (st *state) stmt(dst []byte, n node, e *env) ([]byte, error) {
	if err := st.step(); err != nil {
		return dst, err
	}
	switch n := n.(type) {
	case *textNode:
		return append(dst, n.s...), nil
	case *commentNode, *macroNode, *setNode:
		_, err := st.eval(n, e)
		return dst, err
	case *ifNode:
		test, err := st.eval(n.test, e)
		if err != nil {
			return dst, err
		}
		if test.Truth() {
			return st.block(dst, n.body, e)
		}
		return st.block(dst, n.alt, e)
	case *forNode:
		return st.forLoop(dst, n, e)
	case *breakNode:
		return dst, errBreak
	case *continueNode:
		return dst, errContinue
	}
	v, err := st.eval(n, e)
	if err != nil {
		return dst, err
	}
	if d, ok := st.pyScalar(dst, v); ok {
		return d, nil
	}
	switch v.kind {
	case KindNull, KindUndefined:
		return dst, nil
	case KindArray, KindTuple, KindObject, KindKwargs, KindNamespace:
		if err := checkJSON(v, 0); err != nil {
			return dst, err
		}
	}
	return appendString(dst, v), nil
}

// pyScalar appends None, a boolean, a list or a dict as Python's str writes
// them (a container as its repr, appendPyRepr) when the template was parsed
// with PythonPrint; ok is false for other values (and without the option).
func (st *state) pyScalar(dst []byte, v Value) ([]byte, bool) {
	if !st.opts.PythonPrint {
		return dst, false
	}
	switch v.kind {
	case KindNull:
		return append(dst, "None"...), true
	case KindBool:
		if v.num != 0 {
			return append(dst, "True"...), true
		}
		return append(dst, "False"...), true
	case KindArray, KindTuple, KindObject, KindKwargs, KindNamespace:
		// Up to MaxOutput: more is refused anyway (it printed up to
		// jsonHardLimit, 64 MiB, before the output bound refused it).
		return appendPyRepr(dst, v, 0, len(dst)+st.opts.MaxOutput), true
	}
	return dst, false
}

func (st *state) eval(n node, e *env) (Value, error) {
	if err := st.step(); err != nil {
		return Value{}, err
	}
	switch n := n.(type) {
	case nil:
		return Value{}, nil
	case *textNode:
		return String(n.s), nil
	case *strLit:
		return String(n.s), nil
	case *intLit:
		return Value{kind: KindInt, num: n.v}, nil
	case *floatLit:
		return Value{kind: KindFloat, num: n.v}, nil
	case *commentNode:
		return Null(), nil
	case *ident:
		return e.lookup(n.name), nil
	case *arrayLit, *tupleLit:
		var src []node
		kind := KindArray
		if a, ok := n.(*arrayLit); ok {
			src = a.items
		} else {
			src, kind = n.(*tupleLit).items, KindTuple
		}
		items := st.values(len(src))
		for i, x := range src {
			v, err := st.eval(x, e)
			if err != nil {
				return Value{}, err
			}
			items[i] = v
		}
		return st.array(kind, items), nil
	case *objectLit:
		o := st.newObject()
		for i := range n.keys {
			k, err := st.eval(n.keys[i], e)
			if err != nil {
				return Value{}, err
			}
			if k.kind != KindString {
				return Value{}, errorf("object keys must be strings: got %s", k.kind)
			}
			v, err := st.eval(n.vals[i], e)
			if err != nil {
				return Value{}, err
			}
			o.Set(k.str, v)
		}
		return ObjectValue(o), nil
	case *memberExpr:
		return st.member(n, e)
	case *callExpr:
		return st.call(n, e)
	case *unaryExpr:
		return st.unary(n, e)
	case *binaryExpr:
		return st.binary(n, e)
	case *filterExpr:
		operand, err := st.eval(n.operand, e)
		if err != nil {
			return Value{}, err
		}
		return st.applyFilter(operand, n.filter, e)
	case *testExpr:
		operand, err := st.eval(n.operand, e)
		if err != nil {
			return Value{}, err
		}
		test, ok := tests[n.test]
		if !ok {
			return Value{}, errorf("unknown test: %s", n.test)
		}
		r, err := test(operand, Value{})
		if err != nil {
			return Value{}, err
		}
		return Bool(r != n.negate), nil
	case *selectExpr:
		pred, err := st.eval(n.test, e)
		if err != nil {
			return Value{}, err
		}
		if !pred.Truth() {
			return Value{}, nil
		}
		return st.eval(n.lhs, e)
	case *ternary:
		c, err := st.eval(n.cond, e)
		if err != nil {
			return Value{}, err
		}
		if c.Truth() {
			return st.eval(n.trueExpr, e)
		}
		return st.eval(n.falseExpr, e)
	case *setNode:
		return Null(), st.set(n, e)
	case *macroNode:
		e.set(n.name, n.fn)
		return Null(), nil
	case *callStmt:
		return st.callStatement(n, e)
	case *filterStmt:
		s, err := st.blockString(n.body, e)
		if err != nil {
			return Value{}, err
		}
		return st.applyFilter(String(s), n.filter, e)
	case *ifNode, *forNode:
		return st.stmtValue(n, e)
	case *breakNode:
		return Value{}, errBreak
	case *continueNode:
		return Value{}, errContinue
	case *sliceExpr, *kwArg, *spreadExpr, *kwSpreadExpr:
		return Value{}, errorf("unexpected %T outside a call", n)
	}
	return Value{}, errorf("unknown node type %T", n)
}

// stmtValue renders an if or for statement used as a value to a string.
// Its own function keeps the defer open-coded: a defer in eval would make
// every return of eval, the evaluator's hottest function, run the
// runtime's deferred-call epilogue.
func (st *state) stmtValue(n node, e *env) (Value, error) {
	b, err := st.stmt(st.buf(), n, e)
	defer st.putBuf(b)
	if err != nil {
		return Value{}, err
	}
	if len(b) > st.opts.MaxOutput {
		return Value{}, limitf("template output exceeds %d bytes", st.opts.MaxOutput)
	}
	return String(st.strBytes(b)), nil
}

func (st *state) set(n *setNode, e *env) error {
	var rhs Value
	var err error
	if n.value != nil {
		rhs, err = st.eval(n.value, e)
	} else {
		var s string
		s, err = st.blockString(n.body, e)
		rhs = String(s)
	}
	if err != nil {
		return err
	}
	switch t := n.target.(type) {
	case *ident:
		e.set(t.name, rhs)
	case *tupleLit:
		if !rhs.isArray() {
			return errorf("cannot unpack non-iterable type in set: %s", rhs.kind)
		}
		if len(rhs.arr.items) != len(t.items) {
			return errorf("wrong number of items to unpack in set")
		}
		for i, it := range t.items {
			id, ok := it.(*ident)
			if !ok {
				return errorf("cannot unpack to non-identifier in set")
			}
			e.set(id.name, rhs.arr.items[i])
		}
	case *memberExpr:
		obj, err := st.eval(t.object, e)
		if err != nil {
			return err
		}
		if obj.kind != KindNamespace {
			return errorf("cannot assign attribute on non-namespace object")
		}
		id, ok := t.property.(*ident)
		if !ok || t.computed {
			return errorf("cannot assign to member with non-identifier property")
		}
		obj.obj.Set(id.name, rhs)
	default:
		return errorf("invalid left-hand side in set")
	}
	return nil
}

func (st *state) forLoop(dst []byte, n *forNode, e *env) ([]byte, error) {
	scope := st.newEnv(e)
	var test node
	var iterable Value
	var err error
	if sel, ok := n.iterable.(*selectExpr); ok {
		iterable, err = st.eval(sel.lhs, scope)
		test = sel.test
	} else {
		iterable, err = st.eval(n.iterable, scope)
	}
	if err != nil {
		return dst, err
	}
	var items []Value
	switch {
	case iterable.isArray():
		items = iterable.arr.items
	case iterable.isObject():
		items = st.values(len(iterable.obj.keys))
		for i, k := range iterable.obj.keys {
			items[i] = String(k)
		}
	default:
		return dst, errorf("expected iterable or object type in for loop: got %s", iterable.kind)
	}
	bind := func(s *env, cur Value) error {
		switch lv := n.loopvar.(type) {
		case *ident:
			s.set(lv.name, cur)
		case *tupleLit:
			if !cur.isArray() {
				return errorf("cannot unpack non-iterable type: %s", cur.kind)
			}
			if len(lv.items) != len(cur.arr.items) {
				return errorf("wrong number of items to unpack")
			}
			for j, it := range lv.items {
				id, ok := it.(*ident)
				if !ok {
					return errorf("cannot unpack non-identifier type")
				}
				s.set(id.name, cur.arr.items[j])
			}
		}
		return nil
	}
	if test != nil {
		kept := st.values(len(items))[:0]
		for _, cur := range items {
			ls := st.newEnv(scope)
			if err := bind(ls, cur); err != nil {
				return dst, err
			}
			tv, err := st.eval(test, ls)
			if err != nil {
				return dst, err
			}
			if tv.Truth() {
				kept = append(kept, cur)
			}
		}
		items = kept
	}
	noIteration := true
	var loop *Object
	if !st.keepsLoop && len(items) > 0 {
		// No reference to a loop object outlives its iteration: one object
		// serves them all, and goes back for the next loop when this ends.
		loop = st.loopObject()
		defer func() { st.spareLoops = append(st.spareLoops, loop) }()
	}
	for i, cur := range items {
		if err := st.step(); err != nil {
			return dst, err
		}
		prev, next := Value{}, Value{}
		if i > 0 {
			prev = items[i-1]
		}
		if i < len(items)-1 {
			next = items[i+1]
		}
		if st.keepsLoop {
			// The template may keep references: a fresh object each time.
			loop = st.newObject()
			loop.keys = append(loop.keys, loopKeys...)
			loop.vals = append(loop.vals, make([]Value, len(loopKeys))...)
			st.mem += len(loopKeys) * (stringSize + valueSize)
		}
		setLoop(loop.vals, i, len(items), prev, next)
		// Each iteration starts from the enclosing scope, as in Jinja2: a
		// set in one iteration's body is gone in the next.
		scope.names, scope.vals = scope.names[:0], scope.vals[:0]
		scope.set("loop", ObjectValue(loop))
		if err := bind(scope, cur); err != nil {
			return dst, err
		}
		mark := len(dst)
		dst, err = st.block(dst, n.body, scope)
		if err != nil {
			dst = dst[:mark] // the reference discards a broken iteration's output
			if errors.Is(err, errContinue) {
				continue
			}
			if errors.Is(err, errBreak) {
				break
			}
			return dst, err
		}
		noIteration = false
	}
	if noIteration {
		return st.block(dst, n.elseBody, scope)
	}
	return dst, nil
}

// equal implements == as Python's jinja2 does for lists and dicts: by
// value, element by element (charged a step each), where JavaScript's ==
// compares their references. Other values compare as looseEqual (pyEqual
// with PythonCompare).
func (st *state) equal(a, b Value, depth int) (bool, error) {
	if sameRef(a, b) {
		return true, nil
	}
	switch {
	case a.isArray() && b.isArray():
		if a.kind != b.kind || len(a.arr.items) != len(b.arr.items) {
			return false, nil
		}
	case a.kind == KindObject && b.kind == KindObject:
		if a.obj.Len() != b.obj.Len() {
			return false, nil
		}
	default:
		if st.opts.PythonCompare {
			return pyEqual(a, b), nil
		}
		return looseEqual(a, b), nil
	}
	if depth >= maxJSONDepth {
		return false, limitf("values nested more than %d deep compared", maxJSONDepth)
	}
	if a.isArray() {
		if err := st.charge(len(a.arr.items)); err != nil {
			return false, err
		}
		for i := range a.arr.items {
			if eq, err := st.equal(a.arr.items[i], b.arr.items[i], depth+1); !eq || err != nil {
				return false, err
			}
		}
		return true, nil
	}
	if err := st.charge(a.obj.Len()); err != nil {
		return false, err
	}
	for i, k := range a.obj.keys {
		bv, ok := b.obj.Get(k)
		if !ok {
			return false, nil
		}
		if eq, err := st.equal(a.obj.vals[i], bv, depth+1); !eq || err != nil {
			return false, err
		}
	}
	return true, nil
}

var loopKeys = []string{"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"}

// setLoop fills the values of a loop object (in loopKeys' order) for
// iteration i of n.
func setLoop(v []Value, i, n int, prev, next Value) {
	v[0], v[1], v[2], v[3] = Int(int64(i+1)), Int(int64(i)), Int(int64(n-i)), Int(int64(n-i-1))
	v[4], v[5], v[6], v[7], v[8] = Bool(i == 0), Bool(i == n-1), Int(int64(n)), prev, next
}

func (st *state) member(n *memberExpr, e *env) (Value, error) {
	if c, ok := n.object.(*callExpr); ok && n.computed {
		if recv, ok := splitCall(c); ok {
			if _, ok := n.property.(*sliceExpr); !ok {
				if err := st.step(); err != nil { // n.object's, as eval counts it
					return Value{}, err
				}
				return st.splitIndex(n, c, recv, e)
			}
		}
	}
	obj, err := st.eval(n.object, e)
	if err != nil {
		return Value{}, err
	}
	var prop Value
	switch {
	case n.computed:
		if s, ok := n.property.(*sliceExpr); ok {
			return st.slice(obj, s, e)
		}
		return st.index(obj, n, e)
	default:
		switch p := n.property.(type) {
		case *intLit:
			prop = Value{kind: KindInt, num: p.v}
		case *ident:
			prop = String(p.name)
		}
	}
	if obj.kind == KindString {
		if err := st.charge(len(obj.str) / 8); err != nil {
			return Value{}, err
		}
	}
	return getMember(obj, prop, &st.opts.PythonStrip)
}

// index evaluates obj[n.property] (n computed, not a slice).
func (st *state) index(obj Value, n *memberExpr, e *env) (Value, error) {
	prop, err := st.eval(n.property, e)
	if err != nil {
		return Value{}, err
	}
	if obj.kind == KindString {
		if err := st.charge(len(obj.str) / 8); err != nil {
			return Value{}, err
		}
	}
	return getMember(obj, prop, &st.opts.PythonStrip)
}

func getMember(obj, prop Value, pyStrip *bool) (Value, error) {
	switch {
	case obj.isAttrContainer():
		if prop.kind != KindString {
			return Value{}, errorf("cannot access property with non-string: got %s", prop.kind)
		}
		if v, ok := obj.obj.Get(prop.str); ok {
			return v, nil
		}
		if obj.kind != KindNamespace {
			return builtin(obj, prop.str, pyStrip), nil
		}
		return Value{}, nil
	case obj.isArray() || obj.kind == KindString:
		switch prop.kind {
		case KindInt:
			i := int(prop.num)
			if obj.kind == KindString {
				return runeAt(obj.str, i), nil
			}
			items := obj.arr.items
			if i < 0 {
				i += len(items)
			}
			if i < 0 || i >= len(items) {
				return Value{}, nil
			}
			return items[i], nil
		case KindString:
			return builtin(obj, prop.str, pyStrip), nil
		}
		return Value{}, errorf("cannot access property with non-string/non-number: got %s", prop.kind)
	}
	if prop.kind != KindString {
		return Value{}, errorf("cannot access property with non-string: got %s", prop.kind)
	}
	return Value{}, nil
}

func (st *state) slice(obj Value, s *sliceExpr, e *env) (Value, error) {
	if !obj.isArray() && obj.kind != KindString {
		return Value{}, errorf("slice object must be an array or string")
	}
	if err := st.charge(len(obj.Items()) + len(obj.str)/8); err != nil {
		return Value{}, err
	}
	var bounds [3]Value
	for i, x := range []node{s.start, s.stop, s.step} {
		v, err := st.eval(x, e)
		if err != nil {
			return Value{}, err
		}
		if v.kind != KindInt && v.kind != KindUndefined {
			return Value{}, errorf("slice bounds must be integers or undefined")
		}
		bounds[i] = v
	}
	start, stop, step := sliceBounds(len(obj.Items()), bounds)
	if obj.isArray() {
		out := st.values(sliceLen(start, stop, step))
		for i, j := 0, start; i < len(out); i, j = i+1, j+step {
			out[i] = obj.arr.items[j]
		}
		return st.array(KindArray, out), nil
	}
	n := utf8.RuneCountInString(obj.str)
	start, stop, step = sliceBounds(n, bounds)
	if step == 1 && isASCII(obj.str) {
		if start >= stop {
			return String(""), nil
		}
		return String(obj.str[start:stop]), nil // ASCII: a substring
	}
	k := sliceLen(start, stop, step)
	st.reserve(min(len(obj.str), k*utf8.UTFMax))
	mark := len(st.strs)
	st.strs = appendRuneSlice(st.strs, obj.str, n, start, step, k)
	return String(st.view(mark)), st.spend(len(st.strs) - mark)
}

// appendRuneSlice appends the k code points of s (n of them) at start,
// start+step, ... (a step other than 0) without a copy of s's code points:
// forwards for a positive step, backwards for a negative one.
func appendRuneSlice(dst []byte, s string, n, start, step, k int) []byte {
	if k <= 0 {
		return dst
	}
	if step > 0 {
		i, next := 0, start
		for _, r := range s {
			if i == next {
				dst = utf8.AppendRune(dst, r)
				if k--; k == 0 {
					break
				}
				next += step
			}
			i++
		}
		return dst
	}
	for i, next := n-1, start; len(s) > 0; i-- {
		r, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
		if i == next {
			dst = utf8.AppendRune(dst, r)
			if k--; k == 0 {
				break
			}
			next += step
		}
	}
	return dst
}

// sliceBounds ports @huggingface/jinja's slice helper: the first index,
// the bound and the step of a slice of n items.
func sliceBounds(n int, b [3]Value) (start, stop, step int) {
	step = 1
	if b[2].kind == KindInt {
		step = int(b[2].num)
	}
	if step >= 0 {
		start, stop = 0, n
		if b[0].kind == KindInt {
			start = int(b[0].num)
			if start < 0 {
				start = max(n+start, 0)
			} else {
				start = min(start, n)
			}
		}
		if b[1].kind == KindInt {
			stop = int(b[1].num)
			if stop < 0 {
				stop = max(n+stop, 0)
			} else {
				stop = min(stop, n)
			}
		}
	} else {
		start, stop = n-1, -1
		if b[0].kind == KindInt {
			start = int(b[0].num)
			if start < 0 {
				start = max(n+start, -1)
			} else {
				start = min(start, n-1)
			}
		}
		if b[1].kind == KindInt {
			stop = int(b[1].num)
			if stop < -1 {
				stop = max(n+stop, -1)
			} else {
				stop = min(stop, n-1)
			}
		}
	}
	return start, stop, step
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// sliceLen returns how many indexes start, start+step, ... lie before stop.
func sliceLen(start, stop, step int) int {
	switch {
	case step > 0 && start < stop:
		return (stop - start + step - 1) / step
	case step < 0 && start > stop:
		return (start - stop - step - 1) / -step
	}
	return 0
}

// runeAt returns the i-th code point of s (negative i counts from the end)
// as a string, or undefined when out of range.
func runeAt(s string, i int) Value {
	if i < 0 {
		i += utf8.RuneCountInString(s)
		if i < 0 {
			return Value{}
		}
	}
	for pos, r := range s {
		if i == 0 {
			if r == utf8.RuneError {
				if _, size := utf8.DecodeRuneInString(s[pos:]); size == 1 {
					return String("\uFFFD") // an invalid byte reads as U+FFFD
				}
			}
			_, size := utf8.DecodeRuneInString(s[pos:])
			return String(s[pos : pos+size])
		}
		i--
	}
	return Value{}
}

// args evaluates call arguments. pos has room for one more value (the
// keyword arguments callers append).
func (st *state) args(nodes []node, e *env) ([]Value, *Object, error) {
	pos := st.values(len(nodes) + 1)[:0]
	var kw *Object
	for _, a := range nodes {
		switch a := a.(type) {
		case *spreadExpr:
			v, err := st.eval(a.arg, e)
			if err != nil {
				return nil, nil, err
			}
			if !v.isArray() {
				return nil, nil, errorf("cannot unpack non-iterable type: %s", v.kind)
			}
			pos = append(pos, v.arr.items...)
		case *kwArg, *kwSpreadExpr:
		default:
			v, err := st.eval(a, e)
			if err != nil {
				return nil, nil, err
			}
			pos = append(pos, v)
		}
	}
	add := func(k string, v Value) error {
		if kw == nil {
			kw = st.newObject()
		}
		if _, dup := kw.Get(k); dup {
			return errorf("got multiple values for keyword argument '%s'", k)
		}
		kw.Set(k, v)
		return nil
	}
	for _, a := range nodes {
		switch a := a.(type) {
		case *kwArg:
			v, err := st.eval(a.value, e)
			if err != nil {
				return nil, nil, err
			}
			if err := add(a.key, v); err != nil {
				return nil, nil, err
			}
		case *kwSpreadExpr:
			v, err := st.eval(a.arg, e)
			if err != nil {
				return nil, nil, err
			}
			if !v.isObject() {
				return nil, nil, errorf("argument after ** must be a mapping, not %s", v.kind)
			}
			for i, k := range v.obj.keys {
				if err := add(k, v.obj.vals[i]); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	return pos, kw, nil
}

func (st *state) call(n *callExpr, e *env) (Value, error) {
	pos, kw, err := st.args(n.args, e)
	if err != nil {
		return Value{}, err
	}
	if kw != nil {
		pos = append(pos, Value{kind: KindKwargs, obj: kw})
	}
	// Fast path for method calls on strings, objects and arrays: no bound
	// function value is allocated.
	if m, ok := n.callee.(*memberExpr); ok && !m.computed {
		if id, ok := m.property.(*ident); ok {
			obj, err := st.eval(m.object, e)
			if err != nil {
				return Value{}, err
			}
			return st.callMember(obj, id.name, pos, e)
		}
	}
	fn, err := st.eval(n.callee, e)
	if err != nil {
		return Value{}, err
	}
	return st.invoke(fn, e, pos)
}

// callMember calls obj.name(pos...).
func (st *state) callMember(obj Value, name string, pos []Value, e *env) (Value, error) {
	if obj.kind == KindString || (obj.isObject() && !obj.obj.has(name)) {
		if v, ok, err := callMethod(st, obj, name, pos); ok {
			return v, err
		}
	}
	fn, err := getMember(obj, String(name), &st.opts.PythonStrip)
	if err != nil {
		return Value{}, err
	}
	return st.invoke(fn, e, pos)
}

// splitCall returns the receiver of c when c is a call s.split(sep) with
// one positional argument.
func splitCall(c *callExpr) (node, bool) {
	m, ok := c.callee.(*memberExpr)
	if !ok || m.computed || len(c.args) != 1 {
		return nil, false
	}
	if id, ok := m.property.(*ident); !ok || id.name != "split" {
		return nil, false
	}
	switch c.args[0].(type) {
	case *spreadExpr, *kwArg, *kwSpreadExpr:
		return nil, false
	}
	return m.object, true
}

// splitIndex evaluates s.split(sep)[i], the object of the member
// expression n being the call c on receiver recv. Templates take one part
// of a split (content.split('</think>')[-1]) and a message can hold
// millions of separators: for a string, a string separator and an integer
// index the part is found without building the others. The result and the
// steps counted are those of the general path, which handles the rest (the
// index is evaluated before the split is charged, so of two errors the
// other may be reported).
func (st *state) splitIndex(n *memberExpr, c *callExpr, recv node, e *env) (Value, error) {
	pos, _, err := st.args(c.args, e)
	if err != nil {
		return Value{}, err
	}
	obj, err := st.eval(recv, e)
	if err != nil {
		return Value{}, err
	}
	if obj.kind != KindString || pos[0].kind != KindString || pos[0].str == "" {
		v, err := st.callMember(obj, "split", pos, e)
		if err != nil {
			return Value{}, err
		}
		return st.index(v, n, e)
	}
	prop, err := st.eval(n.property, e)
	if err != nil {
		return Value{}, err
	}
	if prop.kind != KindInt {
		v, err := stringMethod(st, obj.str, "split", pos)
		if err != nil {
			return Value{}, err
		}
		return getMember(v, prop, &st.opts.PythonStrip)
	}
	if err := st.charge(len(obj.str) / 8); err != nil { // as stringMethod does
		return Value{}, err
	}
	part, ok := splitPart(obj.str, pos[0].str, int(prop.num))
	if !ok {
		return Value{}, nil
	}
	return String(part), nil
}

// splitPart returns part i (negative: from the end) of s split on every
// non-overlapping sep, left to right as JavaScript splits, and whether
// there is such a part.
func splitPart(s, sep string, i int) (string, bool) {
	if i < 0 {
		i += strings.Count(s, sep) + 1
		if i < 0 {
			return "", false
		}
	}
	for ; i > 0; i-- {
		j := strings.Index(s, sep)
		if j < 0 {
			return "", false
		}
		s = s[j+len(sep):]
	}
	if j := strings.Index(s, sep); j >= 0 {
		s = s[:j]
	}
	return s, true
}

func (o *Object) has(k string) bool { return o.find(k) >= 0 }

func (st *state) invoke(fn Value, e *env, args []Value) (Value, error) {
	if fn.kind != KindFunc {
		return Value{}, errorf("cannot call something that is not a function: got %s", fn.kind)
	}
	st.depth++
	defer func() { st.depth-- }()
	if st.depth > maxCallDepth {
		return Value{}, limitf("maximum call depth %d exceeded", maxCallDepth)
	}
	return fn.fn.call(st, e, args)
}

// macroFunc returns the function value of a macro definition. It depends
// on the node only, so the parser builds it once.
func macroFunc(n *macroNode) Value {
	special := specialArgs(n.body)
	quoted := "'" + n.name + "'"
	return Value{kind: KindFunc, fn: &function{name: n.name, call: func(st *state, caller *env, args []Value) (Value, error) {
		scope := st.newEnv(caller)
		if err := st.bindArgs(quoted, n.args, special, args, scope); err != nil {
			return Value{}, err
		}
		s, err := st.blockString(n.body, scope)
		return String(s), err
	}}}
}

func (st *state) callStatement(n *callStmt, e *env) (Value, error) {
	special := specialArgs(n.body)
	callerFn := Value{kind: KindFunc, fn: &function{name: "caller", call: func(st *state, _ *env, args []Value) (Value, error) {
		scope := st.newEnv(e)
		if err := st.bindArgs("None", n.callerArgs, special, args, scope); err != nil {
			return Value{}, err
		}
		s, err := st.blockString(n.body, scope)
		return String(s), err
	}}}
	pos, kw, err := st.args(n.call.args, e)
	if err != nil {
		return Value{}, err
	}
	if kw == nil {
		kw = st.newObject()
	}
	pos = append(pos, Value{kind: KindKwargs, obj: kw})
	fn, err := st.eval(n.call.callee, e)
	if err != nil {
		return Value{}, err
	}
	scope := st.newEnv(e)
	scope.set("caller", callerFn)
	return st.invoke(fn, scope, pos)
}

// specialArgs reports which of kwargs/varargs a macro body refers to.
func specialArgs(body []node) map[string]bool {
	out := map[string]bool{}
	var walk func(n node)
	walk = func(n node) {
		switch n := n.(type) {
		case *ident:
			if n.name == "kwargs" || n.name == "varargs" {
				out[n.name] = true
			}
		case *memberExpr:
			walk(n.object)
			if n.computed {
				walk(n.property)
			}
		case *callExpr:
			walk(n.callee)
			for _, a := range n.args {
				walk(a)
			}
		case *binaryExpr:
			walk(n.left)
			walk(n.right)
		case *unaryExpr:
			walk(n.arg)
		case *filterExpr:
			walk(n.operand)
			walk(n.filter)
		case *testExpr:
			walk(n.operand)
		case *selectExpr:
			walk(n.lhs)
			walk(n.test)
		case *ternary:
			walk(n.cond)
			walk(n.trueExpr)
			walk(n.falseExpr)
		case *kwArg:
			walk(n.value)
		case *spreadExpr:
			walk(n.arg)
		case *kwSpreadExpr:
			walk(n.arg)
		case *arrayLit:
			for _, x := range n.items {
				walk(x)
			}
		case *tupleLit:
			for _, x := range n.items {
				walk(x)
			}
		case *objectLit:
			for i := range n.keys {
				walk(n.keys[i])
				walk(n.vals[i])
			}
		case *ifNode:
			walk(n.test)
			for _, x := range n.body {
				walk(x)
			}
			for _, x := range n.alt {
				walk(x)
			}
		case *forNode:
			walk(n.iterable)
			for _, x := range n.body {
				walk(x)
			}
			for _, x := range n.elseBody {
				walk(x)
			}
		case *setNode:
			walk(n.value)
			for _, x := range n.body {
				walk(x)
			}
		case *filterStmt:
			for _, x := range n.body {
				walk(x)
			}
		}
	}
	for _, n := range body {
		walk(n)
	}
	return out
}

func (st *state) bindArgs(name string, params []node, special map[string]bool, args []Value, scope *env) error {
	pos := args
	kw := st.newObject()
	if len(pos) > 0 && pos[len(pos)-1].kind == KindKwargs {
		src := pos[len(pos)-1].obj
		kw.keys = append(kw.keys, src.keys...)
		kw.vals = append(kw.vals, src.vals...)
		kw.rebuildIndex()
		pos = pos[:len(pos)-1]
	}
	type pending struct {
		name string
		def  node
	}
	var defaults []pending
	for i, p := range params {
		var pname string
		var def node
		switch p := p.(type) {
		case *ident:
			pname = p.name
		case *kwArg:
			pname, def = p.key, p.value
		}
		var v Value
		have := false
		if i < len(pos) {
			v, have = pos[i], true
		} else if kv, ok := kw.Get(pname); ok {
			v, have = kv, true
			kw.remove(pname)
		}
		if !have && def != nil {
			defaults = append(defaults, pending{pname, def})
		}
		scope.set(pname, v)
	}
	if special["kwargs"] {
		scope.set("kwargs", ObjectValue(kw))
	} else if kw.Len() > 0 {
		return errorf("macro %s takes no keyword argument '%s'", name, kw.keys[0])
	}
	if special["varargs"] {
		var rest []Value
		if len(pos) > len(params) {
			rest = st.values(len(pos) - len(params))
			copy(rest, pos[len(params):])
		}
		scope.set("varargs", st.array(KindArray, rest))
	} else if len(pos) > len(params) {
		return errorf("macro %s takes not more than %d argument(s)", name, len(params))
	}
	for _, d := range defaults {
		v, err := st.eval(d.def, scope)
		if err != nil {
			return err
		}
		scope.set(d.name, v)
	}
	return nil
}

func (o *Object) remove(k string) {
	i := o.find(k)
	if i < 0 {
		return
	}
	copy(o.keys[i:], o.keys[i+1:])
	copy(o.vals[i:], o.vals[i+1:])
	o.keys[len(o.keys)-1], o.vals[len(o.vals)-1] = "", Value{}
	o.keys, o.vals = o.keys[:len(o.keys)-1], o.vals[:len(o.vals)-1]
	o.rebuildIndex()
}

func (st *state) unary(n *unaryExpr, e *env) (Value, error) {
	v, err := st.eval(n.arg, e)
	if err != nil {
		return Value{}, err
	}
	switch n.op {
	case "not":
		return Bool(!v.Truth()), nil
	case "+", "-":
		if v.isNumericLike() {
			r := v.num
			if n.op == "-" {
				r = -r
			}
			if v.kind == KindFloat {
				return Float(r), nil
			}
			return Value{kind: KindInt, num: r}, nil
		}
		return Value{}, errorf("unknown operator %q for %s", n.op, v.kind)
	}
	return Value{}, errorf("unknown operator %q", n.op)
}

// jsValueString renders v as JavaScript's String(v.value) does, which is
// what + and ~ concatenate.
func jsValueString(dst []byte, v Value) []byte {
	switch v.kind {
	case KindInt:
		return appendInt(dst, v)
	case KindFloat:
		return pyFloat(dst, v.num) // Python's str(1.0) is "1.0"
	case KindArray, KindTuple:
		for i, it := range v.arr.items {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, it)
		}
		return dst
	case KindObject, KindKwargs, KindNamespace:
		return append(dst, "[object Map]"...)
	}
	return appendString(dst, v)
}

func (st *state) concat(a, b Value) (Value, error) {
	for _, v := range [2]Value{a, b} {
		if v.isArray() {
			if err := checkJSON(v, 0); err != nil {
				return Value{}, err
			}
		}
	}
	// A chain a + b + c builds each partial result at the top of the string
	// arena: when a is the latest string, extend it in place.
	if b.kind == KindString {
		if a.kind == KindString && st.atTop(a.str) {
			st.reserve(len(b.str))
		} else {
			st.reserve(len(a.str) + len(b.str))
		}
	}
	mark := len(st.strs)
	if a.kind == KindString && st.atTop(a.str) {
		mark -= len(a.str)
	} else if d, ok := st.pyScalar(st.strs, a); ok {
		st.strs = d
	} else if a.kind != KindUndefined || !st.opts.PythonPrint {
		st.strs = jsValueString(st.strs, a)
	}
	if d, ok := st.pyScalar(st.strs, b); ok {
		st.strs = d
	} else if b.kind != KindUndefined || !st.opts.PythonPrint {
		st.strs = jsValueString(st.strs, b)
	}
	if err := st.spend(len(st.strs) - mark); err != nil {
		return Value{}, err
	}
	return String(st.view(mark)), nil
}

func (st *state) binary(n *binaryExpr, e *env) (Value, error) {
	left, err := st.eval(n.left, e)
	if err != nil {
		return Value{}, err
	}
	op := n.code
	switch op {
	case opAnd:
		if !left.Truth() {
			return left, nil
		}
		return st.eval(n.right, e)
	case opOr:
		if left.Truth() {
			return left, nil
		}
		return st.eval(n.right, e)
	}
	right, err := st.eval(n.right, e)
	if err != nil {
		return Value{}, err
	}
	switch op {
	case opEq, opNe:
		eq, err := st.equal(left, right, 0)
		if err != nil {
			return Value{}, err
		}
		return Bool(eq == (op == opEq)), nil
	}
	if op == opConcat && st.opts.PythonPrint {
		// Python's ~ writes None as "None" and undefined as "".
		return st.concat(left, right)
	}
	switch {
	case left.kind == KindUndefined || right.kind == KindUndefined:
		if right.kind == KindUndefined && (op == opIn || op == opNotIn) {
			return Bool(op == opNotIn), nil
		}
		return Value{}, errorf("cannot perform operation %s on undefined values", n.op)
	case left.kind == KindNull || right.kind == KindNull:
		return Value{}, errorf("cannot perform operation on null values")
	case op == opConcat:
		return st.concat(left, right)
	case op == opPow && left.isNumericLike() && right.isNumericLike():
		a, b := left.num, right.num
		if a == 0 && b < 0 {
			return Value{}, errorf("0.0 cannot be raised to a negative power")
		}
		r := math.Pow(a, b)
		if math.IsInf(r, 0) || math.IsNaN(r) {
			return Value{}, errorf("exponentiation result is not a finite real number")
		}
		if left.kind == KindFloat || right.kind == KindFloat || b < 0 {
			return Float(r), nil
		}
		return Value{kind: KindInt, num: r}, nil
	case left.isNumber() && right.isNumber():
		a, b := left.num, right.num
		isFloat := left.kind == KindFloat || right.kind == KindFloat
		num := func(r float64) Value {
			if isFloat {
				return Float(r)
			}
			return Value{kind: KindInt, num: r}
		}
		switch op {
		case opAdd:
			return num(a + b), nil
		case opSub:
			return num(a - b), nil
		case opMul:
			return num(a * b), nil
		case opDiv:
			return Float(a / b), nil
		case opFloorDiv:
			return num(math.Floor(a / b)), nil
		case opMod:
			return num(math.Mod(a, b)), nil
		case opLt:
			return Bool(a < b), nil
		case opGt:
			return Bool(a > b), nil
		case opGe:
			return Bool(a >= b), nil
		case opLe:
			return Bool(a <= b), nil
		}
	case left.isArray() && right.isArray():
		if op == opAdd {
			if err := st.charge(len(left.arr.items) + len(right.arr.items)); err != nil {
				return Value{}, err
			}
			if len(left.arr.items)+len(right.arr.items) > st.opts.MaxOutput {
				return Value{}, limitf("array too large")
			}
			if err := st.spend(8 * (len(left.arr.items) + len(right.arr.items))); err != nil {
				return Value{}, err
			}
			out := st.values(len(left.arr.items) + len(right.arr.items))
			copy(out[copy(out, left.arr.items):], right.arr.items)
			return st.array(KindArray, out), nil
		}
	case right.isArray():
		if err := st.charge(len(right.arr.items)); err != nil {
			return Value{}, err
		}
		member := false
		for _, x := range right.arr.items {
			if strictEqual(x, left) {
				member = true
				break
			}
		}
		switch op {
		case opIn:
			return Bool(member), nil
		case opNotIn:
			return Bool(!member), nil
		}
	}
	if (left.kind == KindString || right.kind == KindString) && op == opAdd {
		return st.concat(left, right)
	}
	if left.kind == KindString && right.kind == KindString {
		if err := st.charge(len(right.str) / 8); err != nil {
			return Value{}, err
		}
		switch op {
		case opIn:
			return Bool(stringsContains(right.str, left.str)), nil
		case opNotIn:
			return Bool(!stringsContains(right.str, left.str)), nil
		}
	}
	if left.kind == KindString && right.isObject() {
		switch op {
		case opIn:
			return Bool(right.obj.has(left.str)), nil
		case opNotIn:
			return Bool(!right.obj.has(left.str)), nil
		}
	}
	if op == opMul && (left.kind == KindString && right.kind == KindInt || left.kind == KindInt && right.kind == KindString) {
		// Python repeats a string: ' ' * 4 is four spaces.
		s, times := left.str, right.num
		if left.kind == KindInt {
			s, times = right.str, left.num
		}
		if times <= 0 || s == "" {
			return String(""), nil
		}
		if float64(len(s))*times > float64(st.opts.MaxOutput) {
			return Value{}, limitf("template string exceeds %d bytes", st.opts.MaxOutput)
		}
		st.reserve(len(s) * int(times))
		mark := len(st.strs)
		for i := 0; i < int(times); i++ {
			st.strs = append(st.strs, s...)
		}
		return String(st.view(mark)), st.spend(len(st.strs) - mark)
	}
	return Value{}, errorf("unknown operator %q between %s and %s", n.op, left.kind, right.kind)
}
