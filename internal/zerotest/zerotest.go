// Package zerotest checks the Reset of pooled per-request state (fasthttp's
// Acquire/Release-with-Reset discipline): Fill sets every field a request
// could have set, Reset runs, and Dirty lists what it left. A field added
// later is filled and checked too, so a Reset that forgets it fails its
// test instead of leaking one request's state into the next.
//
// It is for tests only; it reaches unexported fields through unsafe.
package zerotest

import (
	"reflect"
	"strings"
	"unsafe"
)

// Fill sets every field reachable from p (a pointer to a struct), through
// nested structs and arrays, to a value that is not zero: booleans true,
// numbers 7, strings "x", slices one filled element, nil pointers a new
// zero value (not descended: no cycles). Interfaces, functions, channels,
// maps and the sync and sync/atomic types are left alone (a locked mutex
// or a state word would make Reset's own checks fail, not tell a leak),
// as are the fields whose dotted path (from the struct p points to, as
// "lease.state") is in skip.
func Fill(p any, skip ...string) {
	fill(addressable(p), "", set(skip))
}

// Dirty lists the dotted paths of the fields reachable from p that are not
// zero, but for empty slices (a kept buffer: its length is 0 and it may
// hold capacity), the sync and sync/atomic types, and the paths in keep
// (a field every request sets before it reads it, a buffer whose stale
// bytes past a kept length are never read) and everything under them.
func Dirty(p any, keep ...string) []string {
	var out []string
	dirty(addressable(p), "", set(keep), &out)
	return out
}

func addressable(p any) reflect.Value {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic("zerotest: want a pointer to a struct")
	}
	return v.Elem()
}

func set(paths []string) map[string]bool {
	m := make(map[string]bool, len(paths))
	for _, p := range paths {
		m[p] = true
	}
	return m
}

// settable is v made settable when it is an unexported field.
func settable(v reflect.Value) reflect.Value {
	if v.CanSet() {
		return v
	}
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// syncType reports the types Fill and Dirty leave alone: mutexes,
// sync.Once, atomic values.
func syncType(t reflect.Type) bool {
	p := t.PkgPath()
	return p == "sync" || p == "sync/atomic"
}

func fill(v reflect.Value, path string, skip map[string]bool) {
	if skip[path] {
		return
	}
	v = settable(v)
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(7)
	case reflect.String:
		v.SetString("x")
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), path+"[]", skip)
		v.Set(s)
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), path+"[]", skip)
		}
	case reflect.Struct:
		if syncType(v.Type()) {
			return
		}
		for i := range v.NumField() {
			fill(v.Field(i), join(path, v.Type().Field(i).Name), skip)
		}
	}
}

func dirty(v reflect.Value, path string, keep map[string]bool, out *[]string) {
	if keep[path] {
		return
	}
	switch v.Kind() {
	case reflect.Slice:
		if v.Len() > 0 {
			*out = append(*out, path)
		}
	case reflect.Array:
		for i := range v.Len() {
			n := len(*out)
			dirty(v.Index(i), path+"[]", keep, out)
			if len(*out) > n {
				return // the array's first dirty element names it
			}
		}
	case reflect.Struct:
		if syncType(v.Type()) {
			return
		}
		for i := range v.NumField() {
			dirty(v.Field(i), join(path, v.Type().Field(i).Name), keep, out)
		}
	default:
		if !v.IsZero() {
			*out = append(*out, path)
		}
	}
}

// String joins paths for a failure message.
func String(paths []string) string { return strings.Join(paths, ", ") }
