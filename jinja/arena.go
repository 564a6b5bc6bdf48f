package jinja

import "unsafe"

// Render-time memory. A render needs strings (concatenations, filters),
// arrays, objects (loop variables, namespaces, keyword arguments) and scopes,
// none of which outlive the call: only the output bytes leave Render. So
// each Template keeps a pool of states whose arenas are reset, not freed,
// between renders, and a warm render of the same template allocates nothing.
//
// The invariant that makes this safe: no Value built during a render is
// reachable after Render returns. Values never escape except as bytes
// appended to the caller's dst, and errors copy what they quote
// (fmt.Sprintf, strings.Clone).
//
// Strings are views into strs: bytes are only ever appended to it, so a view
// never changes while its render runs. When an append outgrows strs, it is
// copied to a larger array (reserve: twice as large) and the old views keep
// the old array alive; the larger one is kept for the next render.

// Retention limits: a state that grew beyond them (a huge or hostile render)
// drops the excess instead of keeping it in the pool.
const (
	maxPooledStrBytes = 1 << 20
	maxPooledValues   = 1 << 14
	maxPooledObjects  = 1 << 12
	maxPooledEnvs     = 1 << 12
	maxPooledBufs     = 8
)

func (t *Template) acquireState() *state {
	if v := t.pool.Get(); v != nil {
		st := v.(*state)
		st.strBud = strBudget * t.opts.MaxOutput
		return st
	}
	return &state{opts: &t.opts, strBud: strBudget * t.opts.MaxOutput, keepsLoop: t.keepsLoop}
}

func (t *Template) releaseState(st *state) {
	st.reset()
	t.pool.Put(st)
}

// reset empties the arenas, dropping references to render values so that
// the pool does not keep callers' data alive.
func (st *state) reset() {
	st.steps, st.depth, st.mem = 0, 0, 0
	clear(st.spareLoops) // pooled objects, reset below
	st.spareLoops = st.spareLoops[:0]
	if cap(st.strs) > maxPooledStrBytes {
		st.strs = nil
	}
	st.strs = st.strs[:0]
	clear(st.vals[:st.nvals])
	st.nvals = 0
	if cap(st.vals) > maxPooledValues {
		st.vals = nil
	}
	for _, o := range st.objs[:st.nobjs] {
		o.reset()
	}
	st.nobjs = 0
	if len(st.objs) > maxPooledObjects {
		st.objs = nil
	}
	for _, a := range st.arrs[:st.narrs] {
		a.items = nil
	}
	st.narrs = 0
	if len(st.arrs) > maxPooledObjects {
		st.arrs = nil
	}
	for _, e := range st.envs[:st.nenvs] {
		e.parent = nil
		clear(e.names)
		clear(e.vals)
		e.names, e.vals = e.names[:0], e.vals[:0]
	}
	st.nenvs = 0
	if len(st.envs) > maxPooledEnvs {
		st.envs = nil
	}
	if len(st.bufs) > maxPooledBufs {
		st.bufs = st.bufs[:maxPooledBufs]
	}
	for i, b := range st.bufs {
		if cap(b) > maxPooledStrBytes {
			st.bufs[i] = nil
		}
	}
	st.nbufs = 0
	clear(st.scratch[:cap(st.scratch)])
	if cap(st.scratch) > maxPooledValues {
		st.scratch = nil
	}
}

// view returns st.strs[mark:] as a string valid until the render ends.
func (st *state) view(mark int) string {
	if mark == len(st.strs) {
		return ""
	}
	return unsafe.String(&st.strs[mark], len(st.strs)-mark)
}

// atTop reports whether s ends where the string arena ends, so appending
// to the arena extends s in place.
func (st *state) atTop(s string) bool {
	n := len(s)
	return n > 0 && n <= len(st.strs) && unsafe.StringData(s) == &st.strs[len(st.strs)-n]
}

// reserve makes room for n more bytes at the top of the string arena. The
// arena doubles, up to the most a render may build (the strings budget,
// plus one string that the budget refuses once built): Go's append grows a
// large slice by a quarter, copying it whole each time, so a render
// filling its 64 MiB budget allocated 385-469 MB. Doubling copies and
// allocates at most about twice what is built. Builders whose result size
// is known (or bounded) reserve it first; the others rely on append.
func (st *state) reserve(n int) {
	if n <= cap(st.strs)-len(st.strs) {
		return
	}
	need := len(st.strs) + n
	c := max(2*cap(st.strs), need, 4096)
	if lim := (strBudget + 1) * st.opts.MaxOutput; c > lim && need <= lim {
		c = lim
	}
	s := make([]byte, len(st.strs), c)
	copy(s, st.strs)
	st.strs = s
}

// strBytes returns an arena copy of b.
func (st *state) strBytes(b []byte) string {
	st.reserve(len(b))
	mark := len(st.strs)
	st.strs = append(st.strs, b...)
	return st.view(mark)
}

// values returns n zeroed values from the arena. The slice's capacity is n:
// appending to it copies it out of the arena.
func (st *state) values(n int) []Value {
	if st.nvals+n > cap(st.vals) {
		// Start a larger chunk; slices of the old one stay valid.
		st.vals = make([]Value, max(2*cap(st.vals), n, 64))
		st.nvals = 0
	}
	s := st.vals[st.nvals : st.nvals+n : st.nvals+n]
	st.nvals += n
	st.mem += n * valueSize
	return s
}

// array returns an array (or tuple) value holding items.
func (st *state) array(kind Kind, items []Value) Value {
	var a *arrayData
	if st.narrs < len(st.arrs) {
		a = st.arrs[st.narrs]
	} else {
		a = &arrayData{}
		st.arrs = append(st.arrs, a)
	}
	st.narrs++
	st.mem += arraySize
	a.items = items
	return Value{kind: kind, arr: a}
}

// newObject returns an empty object from the pool.
func (st *state) newObject() *Object {
	st.mem += objectSize
	if st.nobjs < len(st.objs) {
		o := st.objs[st.nobjs]
		st.nobjs++
		return o
	}
	o := &Object{}
	st.objs = append(st.objs, o)
	st.nobjs++
	return o
}

// newEnv returns an empty scope below parent.
func (st *state) newEnv(parent *env) *env {
	st.mem += envSize
	if st.nenvs < len(st.envs) {
		e := st.envs[st.nenvs]
		st.nenvs++
		e.parent = parent
		return e
	}
	e := &env{parent: parent}
	st.envs = append(st.envs, e)
	st.nenvs++
	return e
}

// loopObject returns a loop object with its keys set, a finished loop's
// if there is one (forLoop).
func (st *state) loopObject() *Object {
	if n := len(st.spareLoops); n > 0 {
		o := st.spareLoops[n-1]
		st.spareLoops = st.spareLoops[:n-1]
		return o
	}
	o := st.newObject()
	o.keys = append(o.keys, loopKeys...)
	o.vals = append(o.vals, make([]Value, len(loopKeys))...)
	st.mem += len(loopKeys) * (stringSize + valueSize)
	return o
}

// Approximate sizes charged to Options.maxMem; an object or scope is
// charged its header and room for two entries.
const (
	valueSize  = int(unsafe.Sizeof(Value{}))
	stringSize = int(unsafe.Sizeof(""))
	arraySize  = int(unsafe.Sizeof(arrayData{}))
	objectSize = int(unsafe.Sizeof(Object{})) + 2*(stringSize+valueSize)
	envSize    = int(unsafe.Sizeof(env{})) + 2*(stringSize+valueSize)
)

// buf returns a scratch byte buffer for rendering a nested block; give it
// back with putBuf (buffers nest like the blocks).
func (st *state) buf() []byte {
	if st.nbufs == len(st.bufs) {
		st.bufs = append(st.bufs, nil)
	}
	b := st.bufs[st.nbufs][:0]
	st.nbufs++
	return b
}

func (st *state) putBuf(b []byte) {
	st.nbufs--
	st.bufs[st.nbufs] = b[:0]
}

// reset empties a pooled object, keeping its storage.
func (o *Object) reset() {
	clear(o.keys)
	clear(o.vals)
	o.keys, o.vals = o.keys[:0], o.vals[:0]
	if o.indexed {
		clear(o.index)
		o.indexed = false
	}
}
