package jsonscan

// The walkers share three steps: open (the container's opening byte, and
// whether it is empty), member (a key and its colon) and next (what follows
// a value: a comma, or the closing byte). Each walker is one loop over
// them that calls its callback directly: one call per member, no closure
// between the walker and the caller's function.

// WalkObject validates the object at or after d[i] and returns the index
// after it; the object itself may be opened whatever levels is, its members
// get levels-1. When f is non-nil it is called for each member, in order,
// with the decoded key (see Key) and the value's [vs, ve) span; an error
// from f ends the walk and is returned as is.
func WalkObject(d []byte, i, levels int, f func(key []byte, vs, ve int) error) (int, error) {
	i, more, err := open(d, i, '{', '}')
	for more {
		var raw []byte
		var escaped bool
		var vs, ve int
		if raw, escaped, vs, err = member(d, i); err != nil {
			return vs, err
		}
		if ve, err = SkipValue(d, vs, levels-1); err != nil {
			return ve, err
		}
		if f != nil {
			if err = f(decoded(raw, escaped), vs, ve); err != nil {
				return ve, err
			}
		}
		i, more, err = next(d, ve, '}')
	}
	return i, err
}

// WalkObjectInline walks the object at or after d[i] for callers that
// parse some values themselves, so that a large value is scanned once, not
// validated first and parsed again: f gets the decoded key (see Key) and
// the start of the value (never at the end of d); it returns the index
// after the value, having validated what it consumed (as SkipValue does),
// or -1 to let the walker skip and validate the value with levels-1. An
// error from f ends the walk and is returned as is. It returns the index
// after the object.
func WalkObjectInline(d []byte, i, levels int, f func(key []byte, vs int) (int, error)) (int, error) {
	i, more, err := open(d, i, '{', '}')
	for more {
		var raw []byte
		var escaped bool
		var vs, ve int
		if raw, escaped, vs, err = member(d, i); err != nil {
			return vs, err
		}
		if ve, err = f(decoded(raw, escaped), vs); err == nil && ve < 0 {
			ve, err = SkipValue(d, vs, levels-1)
		}
		if err != nil {
			return ve, err
		}
		i, more, err = next(d, ve, '}')
	}
	return i, err
}

// WalkMembers walks the object at or after d[i], validating its structure
// and keys but not its values: for each member, value(raw, vs) gets the
// key's raw contents (escapes kept: decode them with Key) and the start of
// the value (never at the end of d), and must consume the value and return
// the index after it. It serves callers that parse some values themselves,
// so that a large value is scanned once; value must validate what it
// consumes (SkipValue does). It returns the index after the object.
func WalkMembers(d []byte, i int, value func(raw []byte, vs int) (int, error)) (int, error) {
	i, more, err := open(d, i, '{', '}')
	for more {
		var raw []byte
		var vs, ve int
		if raw, _, vs, err = member(d, i); err != nil {
			return vs, err
		}
		if ve, err = value(raw, vs); err != nil {
			return ve, err
		}
		i, more, err = next(d, ve, '}')
	}
	return i, err
}

// WalkArray validates the array at or after d[i] and returns the index
// after it; its elements get levels-1. When f is non-nil it is called for
// each element's [vs, ve) span; an error from f ends the walk.
func WalkArray(d []byte, i, levels int, f func(vs, ve int) error) (int, error) {
	i, more, err := open(d, i, '[', ']')
	for more {
		vs := SkipSpace(d, i)
		var ve int
		if ve, err = SkipValue(d, vs, levels-1); err != nil {
			return ve, err
		}
		if f != nil {
			if err = f(vs, ve); err != nil {
				return ve, err
			}
		}
		i, more, err = next(d, ve, ']')
	}
	return i, err
}

// WalkElements is WalkMembers for an array: value(vs) gets the start of
// each element (white space skipped; never at the end of d) and must
// consume and validate it and return the index after it. It returns the
// index after the array.
func WalkElements(d []byte, i int, value func(vs int) (int, error)) (int, error) {
	i, more, err := open(d, i, '[', ']')
	for more {
		vs := SkipSpace(d, i)
		if vs >= len(d) {
			return vs, ErrSyntax
		}
		var ve int
		if ve, err = value(vs); err != nil {
			return ve, err
		}
		i, more, err = next(d, ve, ']')
	}
	return i, err
}

// open checks the container's opening byte at or after d[i] (white space
// skipped) and returns the index after it, or after the closing byte when
// the container is empty (more false).
func open(d []byte, i int, opening, closing byte) (next int, more bool, err error) {
	i = SkipSpace(d, i)
	if i >= len(d) || d[i] != opening {
		return i, false, ErrSyntax
	}
	i = SkipSpace(d, i+1)
	if i < len(d) && d[i] == closing {
		return i + 1, false, nil
	}
	return i, true, nil
}

// member scans a member's key and colon at or after d[i] (white space
// skipped) and returns the key's raw contents, whether they hold an
// escape, and the start of the value (never at the end of d).
func member(d []byte, i int) (raw []byte, escaped bool, vs int, err error) {
	i = SkipSpace(d, i)
	if i >= len(d) || d[i] != '"' {
		return nil, false, i, ErrSyntax
	}
	raw, i, escaped, err = scanString(d, i)
	if err != nil {
		return nil, false, i, err
	}
	i = SkipSpace(d, i)
	if i >= len(d) || d[i] != ':' {
		return nil, false, i, ErrSyntax
	}
	vs = SkipSpace(d, i+1)
	if vs >= len(d) {
		return nil, false, vs, ErrSyntax
	}
	return raw, escaped, vs, nil
}

// next scans what follows a value that ends at d[i] (white space skipped):
// a comma, another member or element to come (more), or the container's
// closing byte. It returns the index after it.
func next(d []byte, i int, closing byte) (int, bool, error) {
	i = SkipSpace(d, i)
	if i >= len(d) {
		return i, false, ErrSyntax
	}
	switch d[i] {
	case ',':
		return i + 1, true, nil
	case closing:
		return i + 1, false, nil
	}
	return i, false, ErrSyntax
}

// decoded is Key for a key whose scan told whether it holds an escape.
func decoded(raw []byte, escaped bool) []byte {
	if escaped {
		return Unescape(nil, raw)
	}
	return raw
}
