package config

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// unknownFieldPath finds where in data the key name is unknown to the type
// t, which encoding/json's "unknown field" error does not say: it names the
// key alone, and "enabled" or "ttl" exist in many sections. It walks the
// document beside t's fields (matched as encoding/json matches them: the
// json tag or the field name, case-insensitively) and returns the path of
// the first key named name that matches no field, or "" when there is none
// (a key the decoder of a nested type refused on its own).
func unknownFieldPath(data []byte, t reflect.Type, name string) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return ""
	}
	p, _ := findUnknown(v, t, "", name)
	return p
}

// UnknownFieldPath is unknownFieldPath for a value v of the type data was
// decoded into (the admin API's bodies).
func UnknownFieldPath(data []byte, v any, name string) string {
	return unknownFieldPath(data, reflect.TypeOf(v), name)
}

func findUnknown(v any, t reflect.Type, path, name string) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[string(foldKey(nil, k))]
			if !ok {
				if k == name {
					return joinPath(path, k), true
				}
				continue
			}
			if p, ok := findUnknown(obj[k], ft, joinPath(path, k), name); ok {
				return p, true
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return "", false
		}
		for i, e := range arr {
			if p, ok := findUnknown(e, t.Elem(), path+"["+strconv.Itoa(i)+"]", name); ok {
				return p, true
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, ok := findUnknown(obj[k], t.Elem(), joinPath(path, k), name); ok {
				return p, true
			}
		}
	}
	return "", false
}

// jsonFields maps the folded JSON name of each field of the struct type t
// (embedded structs' fields promoted, as encoding/json does) to its type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		n, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && n == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, ok := m[k]; !ok {
						m[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if n == "" {
			n = f.Name
		}
		m[string(foldKey(nil, n))] = f.Type
	}
	return m
}
