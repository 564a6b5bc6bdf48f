package govern

import "strings"

// modelSet is a user's allowed models (config users[].models), compiled:
// names matched by one map lookup, '*' patterns in order; both lower-cased.
// The nil *modelSet allows every model.
type modelSet struct {
	exact map[string]struct{}
	globs []string
}

func compileModels(patterns []string) *modelSet {
	if len(patterns) == 0 {
		return nil
	}
	m := &modelSet{exact: make(map[string]struct{}, len(patterns))}
	for _, p := range patterns {
		p = strings.ToLower(p)
		if strings.IndexByte(p, '*') >= 0 {
			m.globs = append(m.globs, p)
		} else {
			m.exact[p] = struct{}{}
		}
	}
	return m
}

// maxModelBytes bounds the model names matched without allocating; a
// longer name is lower-cased on the heap (no allowed name is that long,
// but a pattern may match it).
const maxModelBytes = 512

// allows reports whether model (as the client sent it) is allowed.
func (m *modelSet) allows(model string) bool {
	if m == nil {
		return true
	}
	var buf [maxModelBytes]byte
	var low []byte
	if len(model) <= len(buf) {
		low = buf[:len(model)]
	} else {
		low = make([]byte, len(model))
	}
	for i := range len(model) {
		c := model[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		low[i] = c
	}
	if _, ok := m.exact[string(low)]; ok {
		return true
	}
	for _, g := range m.globs {
		if glob(g, low) {
			return true
		}
	}
	return false
}

// glob reports whether pattern p ('*' matches any run, anchored at both
// ends) matches s, in time linear in len(p)*len(s) at worst.
func glob(p string, s []byte) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// AllowsModel reports whether the user may call model (the name the
// client asked for; case does not matter). A nil User (the global key, an
// open router) may call every model.
func (u *User) AllowsModel(model string) bool {
	return u == nil || u.models.allows(model)
}

// LimitsModels reports whether the user has a models list.
func (u *User) LimitsModels() bool { return u != nil && u.models != nil }
