package govern

import (
	"strings"
	"testing"
)

func TestModelListsMatchNamesAndPatternsWithoutCase(t *testing.T) {
	m := compileModels([]string{"Qwen/Qwen3-8B", "llama-*-instruct", "*-mini", "gpt-4o"})
	long := strings.Repeat("x", 600) + "-mini"
	for model, want := range map[string]bool{
		"qwen/qwen3-8b": true, "QWEN/QWEN3-8B": true, "Qwen/Qwen3-8B-FP8": false,
		"llama-3-70b-instruct": true, "Llama--Instruct": true, "llama-3-70b": false,
		"o4-mini": true, "-mini": true, "mini": false, long: true, strings.Repeat("y", 600): false,
		"gpt-4o": true, "gpt-4o-mini": true, "gpt-4": false, "": false,
	} {
		if got := m.allows(model); got != want {
			t.Errorf("%.40q: %v, want %v", model, got, want)
		}
	}
	var none *modelSet
	if !none.allows("anything") || compileModels(nil) != nil {
		t.Fatal("no list must allow every model")
	}
	var u *User
	if !u.AllowsModel("anything") {
		t.Fatal("the global key (nil user) may call every model")
	}
}
