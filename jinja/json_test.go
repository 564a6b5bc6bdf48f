package jinja

import (
	"strings"
	"testing"
)

// FromJSONMax decodes a document within its bound of values, and stops with
// a limit error past it; a document nested past maxJSONDepth is a limit
// error too (the package's bound, not the document's fault), where it was a
// plain error that callers answered as the client's.
func TestFromJSONBoundsAreLimitErrors(t *testing.T) {
	arr := "[" + strings.TrimSuffix(strings.Repeat("0,", 99), ",") + "]" // 100 values and the array
	if v, err := FromJSONMax([]byte(arr), 100); err != nil || len(v.Items()) != 99 {
		t.Fatalf("within the bound: %v", err)
	}
	if _, err := FromJSONMax([]byte(arr), 99); err == nil || !IsLimit(err) {
		t.Fatalf("past the bound: %v, want a limit error", err)
	}
	if _, err := FromJSON([]byte(arr)); err != nil {
		t.Fatalf("no bound: %v", err)
	}
	deep := strings.Repeat("[", maxJSONDepth+2) + strings.Repeat("]", maxJSONDepth+2)
	if _, err := FromJSON([]byte(deep)); err == nil || !IsLimit(err) {
		t.Fatalf("nested past %d: %v, want a limit error", maxJSONDepth, err)
	}
	if _, err := FromJSON([]byte(`[1,`)); err == nil || IsLimit(err) {
		t.Fatalf("broken JSON: %v, want a plain error", err)
	}
}
