package protocol

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func TestAnthropicRequestFieldsConvertToChat(t *testing.T) {
	opt := DefaultOptions()
	f := func(name string, opt Options, in, want string) {
		t.Helper()
		var m Meta
		got, err := AnthropicToChat(nil, []byte(in), &opt, &m)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if !jsonEqual(got, []byte(want)) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	f("minimal", opt, `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
	f("system string", opt, `{"model":"m","max_tokens":1,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":1}`)
	f("system blocks joined", opt, `{"model":"m","max_tokens":1,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"ab"},{"role":"user","content":"hi"}],"max_tokens":1}`)
	// Structured outputs (the SDK's messages.parse) become a strict named
	// json_schema; so does the beta's top-level output_format; a tool's
	// strict is kept.
	f("output_config.format", opt, `{"model":"m","max_tokens":1,"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"integer"}}}}},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"response_format":{"type":"json_schema","json_schema":{"name":"output","schema":{"type":"object","properties":{"a":{"type":"integer"}}},"strict":true}}}`)
	f("output_format (beta)", opt, `{"model":"m","max_tokens":1,"output_format":{"type":"json_schema","schema":{"type":"object"}},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"response_format":{"type":"json_schema","json_schema":{"name":"output","schema":{"type":"object"},"strict":true}}}`)
	f("tool strict", opt, `{"model":"m","max_tokens":1,"tools":[{"name":"f","input_schema":{"type":"object"},"strict":true}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}]}`)
	moved := `{"model":"m","max_tokens":1,"system":"top","messages":[{"role":"user","content":"a"},{"role":"system","content":"mid"},{"role":"user","content":"b"}]}`
	f("in-array system moved to the front (the user turns it parted are one)", opt, moved,
		`{"model":"m","messages":[{"role":"system","content":"topmid"},{"role":"user","content":"a\nb"}],"max_tokens":1}`)
	keep := opt
	keep.PreserveSystemPosition = true
	f("in-array system kept in place", keep, moved,
		`{"model":"m","messages":[{"role":"system","content":"top"},{"role":"user","content":"a"},{"role":"system","content":"mid"},{"role":"user","content":"b"}],"max_tokens":1}`)
	f("text blocks, base64 and url images", opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/"}},{"type":"image","source":{"type":"url","url":"https://e.x/a.png"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/"}},{"type":"image_url","image_url":{"url":"https://e.x/a.png"}}]}],"max_tokens":1}`)
	f("text-only blocks become a string", opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a\ndoc"}],"max_tokens":1}`)
	f("assistant tool_use, thinking; user tool_result first", opt, `{"model":"m","max_tokens":1,"messages":[
		{"role":"user","content":"weather?"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"need tool","signature":"x"},{"type":"redacted_thinking","data":"zz"},{"type":"text","text":"checking"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city": "Paris", "q": "a\"b"}}]},
		{"role":"user","content":[{"type":"text","text":"also"},{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"},{"type":"image","source":{"type":"url","url":"u"}}],"is_error":false}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"weather?"},
		{"role":"assistant","content":"checking","reasoning_content":"need tool","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"q\":\"a\\\"b\"}"}}]},
		{"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
		{"role":"user","content":[{"type":"text","text":"also"},{"type":"image_url","image_url":{"url":"u"}}]}],"max_tokens":1}`)
	f("tools, tool_choice any, disable_parallel_tool_use", opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"t","description":"d","input_schema":{"type":"object","properties":{"a":{"type":"string"}}},"cache_control":{"type":"ephemeral"}},{"name":"u","input_schema":{"type":"object"},"type":"custom"}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"tools":[{"type":"function","function":{"name":"t","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}},{"type":"function","function":{"name":"u","parameters":{"type":"object"}}}],"tool_choice":"required","parallel_tool_calls":false}`)
	for choice, want := range map[string]string{
		`{"type":"auto"}`:            `"auto"`,
		`{"type":"none"}`:            `"none"`,
		`{"type":"tool","name":"t"}`: `{"type":"function","function":{"name":"t"}}`,
	} {
		f("tool_choice "+choice, opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"t","input_schema":{}}],"tool_choice":`+choice+`}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"tools":[{"type":"function","function":{"name":"t","parameters":{}}}],"tool_choice":`+want+`}`)
	}
	f("sampling, stop, user, stream", opt, `{"model":"m","max_tokens":7,"stream":true,"temperature":0.3,"top_p":0.9,"top_k":20,"stop_sequences":["END","\n\nHuman:"],"metadata":{"user_id":"user-1"},"messages":[{"role":"user","content":"x"}],"service_tier":"auto"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true},"temperature":0.3,"top_p":0.9,"top_k":20,"stop":["END","\n\nHuman:"],"user":"user-1"}`)
	f("assistant prefill continues the final message", opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}],"max_tokens":1,"add_generation_prompt":false,"continue_final_message":true}`)
	// Consecutive turns of one role are one turn (as the Messages API
	// combines them); chat templates that want roles to alternate refuse
	// them apart.
	f("consecutive user turns merge", opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a\"b"},{"role":"user","content":[{"type":"text","text":"c"}]},{"role":"user","content":"d"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a\"b\nc\nd"}],"max_tokens":1}`)
	f("consecutive assistant turns merge, continuing the final message", opt, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a\nb"}],"max_tokens":1,"add_generation_prompt":false,"continue_final_message":true}`)
	// anthropic_turns_test.go has the cases with images, tool calls and
	// tool results.
	f("turns with images, tool calls or tool results merge as one turn would hold them", opt, `{"model":"m","max_tokens":1,"messages":[
		{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}}]},{"role":"user","content":"a"},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"assistant","content":"b"},
		{"role":"user","content":"c"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]},{"role":"user","content":"d"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"a"}]},
		{"role":"assistant","content":"b","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"t1","content":"r"},{"role":"user","content":"c\nd"}],"max_tokens":1}`)
	f("last duplicate key wins, escapes decoded", opt, `{"model":"a","m\u006fdel":"b","max_tokens":1,"messages":[{"role":"us\u0065r","content":"x"}]}`,
		`{"model":"b","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
}

func TestAnthropicRequestMeta(t *testing.T) {
	opt := DefaultOptions()
	var m Meta
	_, err := AnthropicToChat(nil, []byte(`{"model":"claude-\u00e9","max_tokens":42,"stream":true,"stop_sequences":["A\nB","C"],"messages":[{"role":"user","content":"x"}]}`), &opt, &m)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Model) != "claude-é" || !m.Stream || m.MaxTokens != 42 || m.API != Anthropic || !strings.HasPrefix(string(m.ID), "msg_") || len(m.ID) != 28 {
		t.Errorf("meta %+v", m)
	}
	if !m.isStop([]byte("A\nB")) || !m.isStop([]byte("C")) || m.isStop([]byte("A")) {
		t.Errorf("stop sequences %q %v", m.stops, m.stopEnds)
	}
}

func TestAnthropicRequestErrorsNameTheField(t *testing.T) {
	opt := DefaultOptions()
	f := func(in, param, msg string) {
		t.Helper()
		var m Meta
		out, err := AnthropicToChat([]byte("keep"), []byte(in), &opt, &m)
		e, ok := err.(*Error)
		if !ok || e.Status != 400 || e.Type != TypeInvalidRequest || e.Param != param || !strings.Contains(e.Message, msg) {
			t.Errorf("%s: got %#v, want param %q message ~%q", in, err, param, msg)
		}
		if string(out) != "keep" {
			t.Errorf("%s: dst changed on error: %q", in, out)
		}
	}
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]`, "", "malformed JSON")
	f(`[1]`, "", "must be a JSON object")
	f(`{"max_tokens":1,"messages":[]}`, "model", "model: field required")
	f(`{"model":7,"max_tokens":1,"messages":[]}`, "model", "must be a string")
	f(`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens", "field required")
	f(`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens", ">= 1")
	f(`{"model":"m","max_tokens":1}`, "messages", "field required")
	f(`{"model":"m","max_tokens":1,"messages":[]}`, "messages", "at least one")
	f(`{"model":"m","max_tokens":1,"stream":"yes","messages":[{"role":"user","content":"x"}]}`, "stream", "boolean")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"robot","content":"x"}]}`, "messages", "messages[0].role")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, "messages", "messages[0].content: field required")
	// A number where the effort name goes was ignored (a name not known was refused).
	f(`{"model":"m","max_tokens":1,"thinking":{"type":"adaptive"},"output_config":{"effort":5},"messages":[{"role":"user","content":"x"}]}`, "output_config", "effort must be")
	f(`{"model":"m","max_tokens":1,"output_config":{"format":{"type":"xml"}},"messages":[{"role":"user","content":"x"}]}`, "output_config.format", "json_schema")
	f(`{"model":"m","max_tokens":1,"output_format":"json","messages":[{"role":"user","content":"x"}]}`, "output_format", "must be an object")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"video"}]}]}`, "messages", "messages[1].content: unsupported content block type")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages", "base64 or url")
	// in a run of turns, the error names the turn that holds the bad block
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages", "messages[1].content: image source type must be base64 or url")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[]}]}]}`, "messages", "messages[1].content: tool_use input must be an object")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"video"}]},{"role":"robot","content":"x"}]}`, "messages", "messages[1].content: unsupported content block type")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"},{"role":"system","content":"s"},{"role":"user","content":"d"},{"role":"system","content":"s"},{"role":"user","content":"e"},{"role":"system","content":"s"},{"role":"user","content":[{"type":"text"}]}]}`, "messages", "messages[8].content: a text block needs a string text")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"x"}}]}]}`, "messages", "plain-text documents")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":"s"}]}]}`, "messages", "input must be an object")
	f(`{"model":"m","max_tokens":1,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}`, "system", "only text blocks")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools", "server tools")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"t"}],"tool_choice":{"type":"sometimes"}}`, "tool_choice", "auto, any, tool or none")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, "temperature", "number")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"stop_sequences":[1]}`, "stop_sequences", "array of strings")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled"}}`, "thinking", "budget_tokens")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":5}}`, "metadata.user_id", "string")
	f(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"x":`+strings.Repeat("[", 200)+strings.Repeat("]", 200)+`}`, "", "malformed JSON")
}

func TestCountTokensNeedsNoMaxTokensAndRendersThePrompt(t *testing.T) {
	opt := DefaultOptions()
	var m Meta
	chat, err := AnthropicCountTokensToChat(nil, []byte(`{"model":"m","system":"sys","messages":[{"role":"user","content":"hello"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":10}}`), &opt, &m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hello"},{"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"t1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"reasoning_effort":"low"}`
	if !jsonEqual(chat, []byte(want)) { // the reasoning fields too: mapped to enable_thinking they change the prompt
		t.Fatalf("got %s", chat)
	}
	var arena []byte
	msgs, tools, err := ChatMessages(nil, chat, &arena)
	if err != nil || len(msgs) != 4 || string(tools) != `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]` {
		t.Fatalf("ChatMessages: %v %+v %s", err, msgs, tools)
	}
	if msgs[2].ToolCalls[0].Function.Arguments != `{"a":1}` || msgs[3].ToolCallID != "t1" || msgs[0].Content != "sys" {
		t.Errorf("messages %+v", msgs)
	}
	if got := string(AppendCountTokens(nil, 123)); got != `{"input_tokens":123}` {
		t.Errorf("count answer %s", got)
	}
}

// A Messages request's system prompt reaches the engine as vLLM's own
// Messages API front door writes it (vllm/entrypoints/anthropic/serving.py
// at 0001948b, _convert_system_message): the texts of its text blocks and
// of the in-array system messages moved to the front concatenated, empty
// blocks and Claude Code's billing header block (a per-request hash, which
// would end the engine's cached prefix at the start of every request) left
// out, and no system message when no text remains. The converter joined
// them with "\n" and kept the header: every Claude Code request through the
// router had a prompt of its own from its first system block on.
func TestAMessagesSystemPromptIsWrittenAsVLLMWritesIt(t *testing.T) {
	f := func(name string, opt Options, system, messages, want string) {
		t.Helper()
		var m Meta
		in := `{"model":"m","max_tokens":1,` + system + `"messages":` + messages + `}`
		got, err := AnthropicToChat(nil, []byte(in), &opt, &m)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if want = `{"model":"m","messages":` + want + `,"max_tokens":1}`; !jsonEqual(got, []byte(want)) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	opt := DefaultOptions()
	const hi = `[{"role":"user","content":"hi"}]`
	f("Claude Code's blocks", opt, `"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.3; cch=5f3a;"},`+
		`{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},{"type":"text","text":""},{"type":"text","text":"\nBe brief."}],`, hi,
		`[{"role":"system","content":"You are Claude Code.\nBe brief."},{"role":"user","content":"hi"}]`)
	f("the header escaped", opt, `"system":[{"type":"text","text":"\u0078-anthropic-billing-header\u003a h"},{"type":"text","text":"s"}],`, hi,
		`[{"role":"system","content":"s"},{"role":"user","content":"hi"}]`)
	f("not the header", opt, `"system":[{"type":"text","text":"x-anthropic-billing-heade"},{"type":"text","text":"s"}],`, hi,
		`[{"role":"system","content":"x-anthropic-billing-heades"},{"role":"user","content":"hi"}]`)
	f("the header only", opt, `"system":[{"type":"text","text":"x-anthropic-billing-header: h"}],`, hi, hi)
	f("an empty system", opt, `"system":"",`, hi, hi)
	f("no text but in the array", opt, `"system":[],`, `[{"role":"system","content":[{"type":"text","text":""}]},{"role":"user","content":"hi"},{"role":"system","content":"late"}]`,
		`[{"role":"system","content":"late"},{"role":"user","content":"hi"}]`)
	keep := opt
	keep.PreserveSystemPosition = true
	f("kept in place", keep, `"system":[{"type":"text","text":"x-anthropic-billing-header: h"}],`,
		`[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"system","content":[{"type":"text","text":"s"},{"type":"text","text":"t"}]},{"role":"system","content":""},{"role":"user","content":"c"}]`,
		`[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"system","content":"st"},{"role":"system","content":""},{"role":"user","content":"c"}]`)
	// One with no text still parts the user turns around it.
	f("kept in place, empty", keep, "", `[{"role":"user","content":"a"},{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: h"}]},{"role":"user","content":"c"}]`,
		`[{"role":"user","content":"a"},{"role":"system","content":""},{"role":"user","content":"c"}]`)
}

// A tool_result may return references to deferred tools (Claude Code's
// tool search answers with {"type": "tool_reference", "tool_name": ...}
// blocks). vLLM's Messages front door (vllm/entrypoints/anthropic/serving.py
// at 0001948b, _convert_user_tool_result) writes them as one more tool
// message for the call, its content tool_reference parts named by
// tool_name, else name, for the chat template to expand; a tool_reference
// block outside a tool_result is left out. The converter answered 400
// ("unsupported block type in tool_result content").
func TestToolReferencesInAToolResultBecomeAToolMessageAsVLLMWritesThem(t *testing.T) {
	opt := DefaultOptions()
	var m Meta
	in := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"find a tool"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"tool_search","input":{"q":"weather"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"found"},` +
		`{"type":"tool_reference","tool_name":"get_weather"},{"type":"tool_reference","tool_name":"","name":"get_time"},{"type":"tool_reference"}]},` +
		`{"type":"tool_reference","tool_name":"dropped"},{"type":"text","text":"go on"}]}]}`
	got, err := AnthropicToChat(nil, []byte(in), &opt, &m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"user","content":"find a tool"},` +
		`{"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function","function":{"name":"tool_search","arguments":"{\"q\":\"weather\"}"}}]},` +
		`{"role":"tool","tool_call_id":"t1","content":"found"},` +
		`{"role":"tool","tool_call_id":"t1","content":[{"type":"tool_reference","name":"get_weather"},{"type":"tool_reference","name":"get_time"}]},` +
		`{"role":"user","content":"go on"}],"max_tokens":1}`
	if !jsonEqual(got, []byte(want)) {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

// A Messages turn's text and thinking blocks are joined as vLLM's
// Messages front door joins them (vllm/entrypoints/anthropic/serving.py at
// 0001948b, _convert_block and _convert_message_content): an empty text
// block adds nothing (`block.type == "text" and block.text`), and the
// thinking blocks of an assistant turn are concatenated
// ("".join(reasoning_parts)). The converter wrote "a\n\nb" for an empty
// block between two texts (vLLM renders "a\nb") and joined thinking
// blocks with "\n".
func TestMessagesTextAndThinkingBlocksAreJoinedAsVLLMJoinsThem(t *testing.T) {
	opt := DefaultOptions()
	f := func(name, messages, want string) {
		t.Helper()
		var m Meta
		got, err := AnthropicToChat(nil, []byte(`{"model":"m","max_tokens":1,"messages":`+messages+`}`), &opt, &m)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if want = `{"model":"m","messages":` + want + `,"max_tokens":1}`; !jsonEqual(got, []byte(want)) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	f("empty text blocks", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}]}]`,
		`[{"role":"user","content":"a\nb"}]`)
	f("empty text blocks beside an image", `[{"role":"user","content":[{"type":"text","text":""},{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"b"}]}]`,
		`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"b"}]}]`)
	f("thinking blocks", `[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"s"},`+
		`{"type":"thinking","thinking":"y","signature":"s"},{"type":"text","text":""},{"type":"text","text":"t"}]},{"role":"user","content":"more"}]`,
		`[{"role":"user","content":"q"},{"role":"assistant","content":"t","reasoning_content":"xy"},{"role":"user","content":"more"}]`)
}
