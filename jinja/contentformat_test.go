package jinja

import (
	"encoding/json"
	"os"
	"testing"
)

// TestIteratesMessageContentAsVLLMDetectsIt matches vLLM's
// --chat-template-content-format auto (vllm/renderers/hf.py,
// _detect_content_format, "openai" when a template loops over a message's
// content) on every template of testdata/templates: testdata/
// contentformat.json holds its answers, computed with that rule over
// Python jinja2's AST of each template.
func TestIteratesMessageContentAsVLLMDetectsIt(t *testing.T) {
	data, err := os.ReadFile("testdata/contentformat.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]string
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	for name, format := range want {
		src, err := os.ReadFile("testdata/templates/" + name + ".jinja")
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := Parse(string(src))
		if err != nil {
			continue // refused templates (pyref's departures) render nothing
		}
		if got := tpl.IteratesMessageContent(); got != (format == "openai") {
			t.Errorf("%s: IteratesMessageContent %v, vLLM detects %q", name, got, format)
		}
	}
	f := func(src string, want bool) {
		t.Helper()
		tpl, err := Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		if got := tpl.IteratesMessageContent(); got != want {
			t.Errorf("%s: %v, want %v", src, got, want)
		}
	}
	f(`{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}`, true)
	f(`{% for m in messages %}{% for c in m.content | selectattr('type', 'equalto', 'text') %}{{ c.text }}{% endfor %}{% endfor %}`, true)
	f(`{% set msgs = messages[1:] %}{% set rest = msgs %}{% for m in rest %}{% for c in m.content if c.type == 'text' %}{% endfor %}{% endfor %}`, true)
	f(`{% for m in messages %}{{ m.content }}{% endfor %}`, false)
	f(`{% for m in messages %}{% for c in m.content.split('\n') %}{% endfor %}{% endfor %}`, false)
	f(`{% for c in messages[0]['content'] %}{% endfor %}`, false)
	f(`{% for i, m in messages | enumerate %}{% endfor %}{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}`, false)
}
