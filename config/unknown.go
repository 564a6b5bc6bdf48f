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
	case reflect.Struct, reflect.Map:
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
			var ft reflect.Type
			if t.Kind() == reflect.Map {
				ft = t.Elem()
			} else if ft, ok = FieldType(t, k); !ok {
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
	}
	return "", false
}

// FieldType finds the field of struct t that JSON key k decodes into:
// an exact name first, then a case-insensitive one, as encoding/json does.
func FieldType(t reflect.Type, k string) (reflect.Type, bool) {
	var fold reflect.Type
	var found bool
	var visit func(t reflect.Type) bool
	visit = func(t reflect.Type) bool {
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
				if visit(sf.Type) {
					return true
				}
				continue
			}
			if !sf.IsExported() {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			if name == k {
				fold, found = sf.Type, true
				return true
			}
			if !found && strings.EqualFold(name, k) {
				fold, found = sf.Type, true
			}
		}
		return false
	}
	visit(t)
	return fold, found
}
