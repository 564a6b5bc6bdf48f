package jsonscan

// WalkObject validates the object at or after d[i] and returns the index
// after it; the object itself may be opened whatever levels is, its members
// get levels-1. When f is non-nil it is called for each member, in order,
// with the decoded key (see Key) and the value's [vs, ve) span; an error
// from f ends the walk and is returned as is.
func WalkObject(d []byte, i, levels int, f func(key []byte, vs, ve int) error) (int, error) {
	return WalkMembers(d, i, func(raw []byte, vs int) (int, error) {
		ve, err := SkipValue(d, vs, levels-1)
		if err != nil || f == nil {
			return ve, err
		}
		return ve, f(Key(raw), vs, ve)
	})
}

// WalkMembers walks the object at or after d[i], validating its structure
// and keys but not its values: for each member, value(raw, vs) gets the
// key's raw contents (escapes kept: decode them with Key) and the start of
// the value (never at the end of d), and must consume the value and return
// the index after it. It serves callers that parse some values themselves,
// so that a large value is scanned once; value must validate what it
// consumes (SkipValue does). It returns the index after the object.
func WalkMembers(d []byte, i int, value func(raw []byte, vs int) (int, error)) (int, error) {
	i = SkipSpace(d, i)
	if i >= len(d) || d[i] != '{' {
		return i, ErrSyntax
	}
	i = SkipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		i = SkipSpace(d, i)
		if i >= len(d) || d[i] != '"' {
			return i, ErrSyntax
		}
		key, j, err := ScanString(d, i)
		if err != nil {
			return j, err
		}
		i = SkipSpace(d, j)
		if i >= len(d) || d[i] != ':' {
			return i, ErrSyntax
		}
		vs := SkipSpace(d, i+1)
		if vs >= len(d) {
			return vs, ErrSyntax
		}
		ve, err := value(key, vs)
		if err != nil {
			return ve, err
		}
		i = SkipSpace(d, ve)
		if i >= len(d) {
			return i, ErrSyntax
		}
		if d[i] == '}' {
			return i + 1, nil
		}
		if d[i] != ',' {
			return i, ErrSyntax
		}
		i++
	}
}

// WalkArray validates the array at or after d[i] and returns the index
// after it; its elements get levels-1. When f is non-nil it is called for
// each element's [vs, ve) span; an error from f ends the walk.
func WalkArray(d []byte, i, levels int, f func(vs, ve int) error) (int, error) {
	i = SkipSpace(d, i)
	if i >= len(d) || d[i] != '[' {
		return i, ErrSyntax
	}
	i = SkipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		return i + 1, nil
	}
	for {
		vs := SkipSpace(d, i)
		ve, err := SkipValue(d, vs, levels-1)
		if err != nil {
			return ve, err
		}
		if f != nil {
			if err := f(vs, ve); err != nil {
				return ve, err
			}
		}
		i = SkipSpace(d, ve)
		if i >= len(d) {
			return i, ErrSyntax
		}
		if d[i] == ']' {
			return i + 1, nil
		}
		if d[i] != ',' {
			return i, ErrSyntax
		}
		i++
	}
}
