package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

// FieldError is a configuration error at one setting. Path is the JSON path
// of the setting ("session_affinity.ttl_s", "workers[2].url"), empty when
// the error concerns the whole document. The admin API returns it as
// {"error":{"path":...,"message":...}}.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

func fieldErr(path, format string, args ...any) error {
	return &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// MaxSeconds bounds every duration setting given in seconds (about 3
// years): larger values would overflow time.Duration (which ends near
// 9.2e9 s) once multiplied out, and make every deadline fire at once.
const MaxSeconds = 1e8

// seconds validates a duration in seconds: finite, within [0, MaxSeconds],
// and positive when required.
func seconds(path string, v float64, positive bool) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fieldErr(path, "must be a finite number of seconds")
	case positive && v <= 0:
		return fieldErr(path, "must be positive")
	case v < 0:
		return fieldErr(path, "must be >= 0")
	case v > MaxSeconds:
		return fieldErr(path, "%g s is too large (max %g)", v, float64(MaxSeconds))
	case v > 0 && v < 1e-6:
		// Shorter than a microsecond is 0 ns once converted, which the
		// settings read as their default or as no limit.
		return fieldErr(path, "%g s is too small: 0, or at least 1e-6 (a microsecond)", v)
	}
	return nil
}

// millis is seconds for settings given in milliseconds.
func millis(path string, v float64) error {
	if v < 0 || math.IsNaN(v) || v > MaxSeconds*1000 {
		return fieldErr(path, "must be in [0, %g] ms", float64(MaxSeconds*1000))
	}
	if v > 0 && v < 1e-3 {
		// 0 ns once converted: the mirror's 1e-7 ms became its 60 s
		// default.
		return fieldErr(path, "%g ms is too small: 0, or at least 0.001 (a microsecond)", v)
	}
	return nil
}

// ValidHeaderName reports whether s is an RFC 9110 token (a header name).
func ValidHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}

// decodeError turns the error of decoding data into a value of type t into
// a FieldError naming the offending field where it can be told: the
// decoder names a mistyped field by its path, an unknown one by its key
// alone, whose path is then looked up in data.
func decodeError(err error, data []byte, t reflect.Type) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &FieldError{Path: te.Field, Msg: fmt.Sprintf("cannot use %s as %s", te.Value, te.Type)}
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &FieldError{Msg: fmt.Sprintf("cannot parse config: %v (at byte %d)", se, se.Offset)}
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		key, _ := strconv.Unquote(f)
		path := unknownFieldPath(data, t, key)
		if path == "" {
			path = key
		}
		return &FieldError{Path: path, Msg: "unknown field " + f}
	}
	return &FieldError{Msg: "cannot parse config: " + msg}
}
