package protocol

import (
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func TestReasoningMappingTable(t *testing.T) {
	mk := func(mode string, target string) Options {
		return NewOptions(&config.Protocol{ReasoningEffortMode: mode, ReasoningMap: config.ReasoningMap{Target: target}})
	}
	type row struct {
		opt          Options
		in, wantTail string // wantTail: the reasoning fields of the chat body
	}
	anth := func(extra string) string {
		return `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]` + extra + `}`
	}
	resp := func(extra string) string { return `{"model":"m","input":"x"` + extra + `}` }
	pass, mapET, mapRE, mapBoth, drop := mk("", ""), mk("map", ""), mk("map", "reasoning_effort"), mk("map", "both"), mk("drop", "")
	base := `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1`
	rbase := `{"model":"m","messages":[{"role":"user","content":"x"}]`
	for i, r := range []row{
		{pass, anth(`,"thinking":{"type":"enabled","budget_tokens":1024}`), base + `,"reasoning_effort":"low"}`},
		{pass, anth(`,"thinking":{"type":"enabled","budget_tokens":8000}`), base + `,"reasoning_effort":"medium"}`},
		{pass, anth(`,"thinking":{"type":"enabled","budget_tokens":32000}`), base + `,"reasoning_effort":"high"}`},
		{pass, anth(`,"thinking":{"type":"disabled"}`), base + `}`},
		{pass, anth(`,"thinking":{"type":"adaptive"},"output_config":{"effort":"max"}`), base + `,"reasoning_effort":"xhigh"}`},
		{pass, anth(`,"output_config":{"effort":"xhigh"}`), base + `,"reasoning_effort":"xhigh"}`},
		{mapET, anth(`,"thinking":{"type":"between_tools"}`), base + `,"chat_template_kwargs":{"enable_thinking":true}}`},
		{mapET, anth(`,"thinking":{"type":"enabled","budget_tokens":1024}`), base + `,"chat_template_kwargs":{"enable_thinking":true}}`},
		{mapET, anth(`,"thinking":{"type":"disabled"}`), base + `,"chat_template_kwargs":{"enable_thinking":false}}`},
		{mapET, anth(`,"thinking":{"type":"adaptive"}`), base + `,"chat_template_kwargs":{"enable_thinking":true}}`},
		{mapET, anth(``), base + `}`},
		{mapRE, anth(`,"thinking":{"type":"enabled","budget_tokens":20000}`), base + `,"reasoning_effort":"high"}`},
		{mapRE, anth(`,"thinking":{"type":"disabled"}`), base + `}`},
		{mapBoth, anth(`,"thinking":{"type":"enabled","budget_tokens":5000}`), base + `,"reasoning_effort":"medium","chat_template_kwargs":{"enable_thinking":true}}`},
		{drop, anth(`,"thinking":{"type":"enabled","budget_tokens":5000}`), base + `}`},
		{pass, resp(`,"reasoning":{"effort":"minimal"}`), rbase + `,"reasoning_effort":"minimal"}`},
		{pass, resp(`,"reasoning":{"effort":"turbo"}`), rbase + `,"reasoning_effort":"turbo"}`},
		{mapET, resp(`,"reasoning":{"effort":"minimal"}`), rbase + `,"chat_template_kwargs":{"enable_thinking":false}}`},
		{mapET, resp(`,"reasoning":{"effort":"none"}`), rbase + `,"chat_template_kwargs":{"enable_thinking":false}}`},
		{mapET, resp(`,"reasoning":{"effort":"low"}`), rbase + `,"chat_template_kwargs":{"enable_thinking":true}}`},
		{mapRE, resp(`,"reasoning":{"effort":"medium"}`), rbase + `,"reasoning_effort":"medium"}`},
		{drop, resp(`,"reasoning":{"effort":"high"}`), rbase + `}`},
	} {
		var m Meta
		var got []byte
		var err error
		if !strings.Contains(r.in, `"input"`) {
			got, err = AnthropicToChat(nil, []byte(r.in), &r.opt, &m)
		} else {
			got, err = ResponsesToChat(nil, []byte(r.in), &r.opt, &m)
		}
		if err != nil || !jsonEqual(got, []byte(r.wantTail)) {
			t.Errorf("row %d %s:\n got %s (%v)\nwant %s", i, r.in, got, err, r.wantTail)
		}
	}
	// configured budgets and off efforts
	o := NewOptions(&config.Protocol{ReasoningEffortMode: "map", ReasoningMap: config.ReasoningMap{Target: "both", ThinkingOffEfforts: []string{"low"}, BudgetLowMax: 100, BudgetMediumMax: 200}})
	var m Meta
	got, _ := AnthropicToChat(nil, []byte(anth(`,"thinking":{"type":"enabled","budget_tokens":150}`)), &o, &m)
	if !jsonEqual(got, []byte(base+`,"reasoning_effort":"medium","chat_template_kwargs":{"enable_thinking":true}}`)) {
		t.Errorf("budgets: %s", got)
	}
	got, _ = ResponsesToChat(nil, []byte(resp(`,"reasoning":{"effort":"low"}`)), &o, &m)
	if !jsonEqual(got, []byte(rbase+`,"reasoning_effort":"low","chat_template_kwargs":{"enable_thinking":false}}`)) {
		t.Errorf("off efforts: %s", got)
	}
}

func TestRewriteChatReasoning(t *testing.T) {
	mk := func(mode, target string) ReasoningOptions {
		return NewOptions(&config.Protocol{ReasoningEffortMode: mode, ReasoningMap: config.ReasoningMap{Target: target}}).Reasoning
	}
	f := func(r ReasoningOptions, in, want string, same bool) {
		t.Helper()
		got, err := RewriteChatReasoning(nil, []byte(in), &r)
		if err != nil || string(got) != want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", in, got, err, want)
		}
		if same && &got[0] != &[]byte(in)[0] && string(got) != in {
			t.Errorf("%s: expected the body unchanged", in)
		}
	}
	body := `{"model":"m","reasoning_effort":"low","messages":[]}`
	f(mk("passthrough", ""), body, body, true)
	f(mk("map", "reasoning_effort"), body, body, true)
	f(mk("map", ""), `{"model":"m","messages":[]}`, `{"model":"m","messages":[]}`, true)
	f(mk("map", ""), body, `{"model":"m","messages":[],"chat_template_kwargs":{"enable_thinking":true}}`, false)
	f(mk("map", ""), `{"reasoning_effort":"minimal","model":"m"}`, `{"model":"m","chat_template_kwargs":{"enable_thinking":false}}`, false)
	f(mk("map", "both"), body, `{"model":"m","messages":[],"reasoning_effort":"low","chat_template_kwargs":{"enable_thinking":true}}`, false)
	f(mk("map", ""), `{"model":"m","chat_template_kwargs":{"x":1},"reasoning_effort":"high"}`, `{"model":"m","chat_template_kwargs":{"enable_thinking":true,"x":1}}`, false)
	f(mk("map", ""), `{"model":"m","chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"high"}`, `{"model":"m","chat_template_kwargs":{"enable_thinking":false}}`, false)
	f(mk("map", ""), `{"model":"m","chat_template_kwargs":{},"reasoning_effort":"high"}`, `{"model":"m","chat_template_kwargs":{"enable_thinking":true}}`, false)
	f(mk("map", ""), `{"reasoning_effort":null,"model":"m"}`, `{"model":"m"}`, false)
	f(mk("drop", ""), `{"reasoning_effort":"low","model":"m","reasoning_effort":"high"}`, `{"model":"m"}`, false)
	f(mk("drop", ""), `{"reasoning_effort":"low"}`, `{}`, false)
	r := mk("drop", "")
	if _, err := RewriteChatReasoning(nil, []byte(`{"reasoning_effort":1}`), &r); err == nil {
		t.Error("a non-string reasoning_effort must be refused")
	}
}

// A reasoning_effort is read decoded, as the engine reads it: "\u006eone"
// is "none". It was compared as raw bytes, so in map mode an escaped
// "none" or "minimal" turned thinking on where the table turns it off.
func TestAnEscapedReasoningEffortIsMappedAsItsValue(t *testing.T) {
	r := NewOptions(&config.Protocol{ReasoningEffortMode: "map"}).Reasoning
	for _, in := range []string{
		`{"reasoning_effort":"\u006eone","model":"m"}`,
		`{"reasoning_effort":"min\u0069mal","model":"m"}`,
	} {
		got, err := RewriteChatReasoning(nil, []byte(in), &r)
		if want := `{"model":"m","chat_template_kwargs":{"enable_thinking":false}}`; err != nil || string(got) != want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", in, got, err, want)
		}
	}
	r = NewOptions(&config.Protocol{ReasoningEffortMode: "map", ReasoningMap: config.ReasoningMap{Target: "both"}}).Reasoning
	got, _ := RewriteChatReasoning(nil, []byte(`{"reasoning_effort":"\u006eone"}`), &r)
	if want := `{"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":false}}`; string(got) != want {
		t.Errorf("target both: got %s, want %s", got, want)
	}
}
