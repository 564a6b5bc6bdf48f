package config

import (
	"bytes"
	"encoding/json"
	"slices"
)

// ChangedSections names the top-level sections of the config file
// (load_balancing, users, ...) whose settings differ between old and cur,
// sorted: what a reload changed, for the debug log (never a value: a
// section may hold keys). Nil when either cannot be encoded.
func ChangedSections(old, cur *Config) []string {
	a, err := sectionsOf(old)
	if err != nil {
		return nil
	}
	b, err := sectionsOf(cur)
	if err != nil {
		return nil
	}
	var out []string
	for k, v := range b {
		if w, ok := a[k]; !ok || !bytes.Equal(v, w) {
			out = append(out, k)
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// sectionsOf is c's file encoding by top-level key.
func sectionsOf(c *Config) (map[string]json.RawMessage, error) {
	data, err := compactOf(c, nil)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	err = json.Unmarshal(data, &m)
	return m, err
}
