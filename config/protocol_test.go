package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestProtocolSectionParsesAndValidates(t *testing.T) {
	ok := func(doc string, check func(p Protocol)) {
		t.Helper()
		c, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		check(c.Protocol)
	}
	ok(`{}`, func(p Protocol) {
		if p.AnthropicPassthrough || p.ResponsesPassthrough || p.ForceStreamUsage || p.PreserveAnthropicSystemPosition {
			t.Errorf("switches must default to off: %+v", p)
		}
	})
	ok(`{"protocol":{"responses_passthrough":true,"anthropic_passthrough":true,"preserve_anthropic_system_position":true,"force_stream_usage":true,"reasoning_effort_mode":"map","reasoning_map":{"target":"both","thinking_off_efforts":["minimal"],"budget_low_max":100,"budget_medium_max":200}}}`, func(p Protocol) {
		if !p.ResponsesPassthrough || !p.AnthropicPassthrough || !p.PreserveAnthropicSystemPosition || !p.ForceStreamUsage {
			t.Errorf("switches not read: %+v", p)
		}
		m := p.ReasoningMap
		if p.ReasoningEffortMode != "map" || m.Target != "both" || len(m.ThinkingOffEfforts) != 1 || m.BudgetLowMax != 100 || m.BudgetMediumMax != 200 {
			t.Errorf("reasoning settings not read: %+v", p)
		}
	})
	bad := func(doc, path, msg string) {
		t.Helper()
		_, err := Parse([]byte(doc))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != path || !strings.Contains(fe.Msg, msg) {
			t.Errorf("%s: got %v, want %s: ...%s...", doc, err, path, msg)
		}
	}
	ok(`{}`, func(p Protocol) {
		if p.ResponsesStateTTL() != 24*time.Hour {
			t.Errorf("the responses state TTL defaults to %v, want a day", p.ResponsesStateTTL())
		}
	})
	ok(`{"protocol":{"responses_state_ttl_s":0}}`, func(p Protocol) {
		if p.ResponsesStateTTL() != 24*time.Hour {
			t.Errorf("a responses state TTL of 0 is %v, want the default", p.ResponsesStateTTL())
		}
	})
	ok(`{"protocol":{"responses_state_ttl_s":3600.5}}`, func(p Protocol) {
		if p.ResponsesStateTTL() != 3600500*time.Millisecond {
			t.Errorf("the responses state TTL: %v", p.ResponsesStateTTL())
		}
	})
	bad(`{"protocol":{"responses_state_ttl_s":59}}`, "protocol.responses_state_ttl_s", "[60, 2592000]")
	bad(`{"protocol":{"responses_state_ttl_s":-1}}`, "protocol.responses_state_ttl_s", "want 0")
	bad(`{"protocol":{"responses_state_ttl_s":2592001}}`, "protocol.responses_state_ttl_s", "[60, 2592000]")
	bad(`{"protocol":{"reasoning_effort_mode":"auto"}}`, "protocol.reasoning_effort_mode", "passthrough, map or drop")
	bad(`{"protocol":{"reasoning_map":{"target":"qwen"}}}`, "protocol.reasoning_map.target", "enable_thinking")
	bad(`{"protocol":{"reasoning_map":{"thinking_off_efforts":["low","max"]}}}`, "protocol.reasoning_map.thinking_off_efforts[1]", "max")
	bad(`{"protocol":{"reasoning_map":{"budget_low_max":-1}}}`, "protocol.reasoning_map.budget_low_max", "must be in")
	bad(`{"protocol":{"reasoning_map":{"budget_low_max":5000,"budget_medium_max":5000}}}`, "protocol.reasoning_map.budget_medium_max", "above budget_low_max")
	bad(`{"protocol":{"reasoning_map":{"budget_low_max":20000}}}`, "protocol.reasoning_map.budget_medium_max", "above budget_low_max")
	// unknown fields are refused (config's decoder names the field)
	if _, err := Parse([]byte(`{"protocol":{"passthrough":true}}`)); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("unknown protocol field accepted: %v", err)
	}
}

func TestDefaultProtocolIsValid(t *testing.T) {
	p := defaultProtocol()
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	if p.ReasoningEffortMode != ReasoningPassthrough || p.ReasoningMap.Target != TargetEnableThinking ||
		p.ReasoningMap.BudgetLowMax != DefaultBudgetLowMax || p.ReasoningMap.BudgetMediumMax != DefaultBudgetMediumMax {
		t.Errorf("defaults: %+v", p)
	}
}
