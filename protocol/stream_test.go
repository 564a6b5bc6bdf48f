package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func chunkLine(delta, finish string) string {
	return "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":" + delta + ",\"finish_reason\":" + finish + "}]}\n\n"
}

const usageLine = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":4},\"completion_tokens_details\":{\"reasoning_tokens\":2}}}\n\n"

// upstreamAll is a vLLM-style stream with reasoning, text and two tool calls.
var upstreamAll = chunkLine(`{"role":"assistant","content":""}`, "null") +
	chunkLine(`{"reasoning_content":"Let me "}`, "null") + chunkLine(`{"reasoning_content":"think."}`, "null") +
	chunkLine(`{"content":"Hel"}`, "null") + chunkLine(`{"content":"lo \"w\"\n"}`, "null") +
	chunkLine(`{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get","arguments":""}}]}`, "null") +
	chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"c\":"}}]}`, "null") +
	chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`, "null") +
	chunkLine(`{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"put","arguments":"{}"}}]}`, "null") +
	chunkLine(`{}`, `"tool_calls"`) + usageLine + "data: [DONE]\n\n"

// convertStream converts upstream whole and in 40 random splits (pieces
// of 1 to 40 bytes), checks every output is identical, and returns it.
func convertStream(t *testing.T, m *Meta, upstream string) []byte {
	t.Helper()
	reseed, restore := deterministicIDs()
	defer restore()
	c := AcquireStreamConverter(m)
	defer ReleaseStreamConverter(c)
	whole := c.Finish(c.Feed(nil, []byte(upstream)))
	for seed := uint64(0); seed < 40; seed++ {
		reseed()
		c.Reset(m)
		c2 := c
		got := feedSplit(c2, []byte(upstream), rand.New(rand.NewPCG(seed, 3)), 1+int(seed))
		reseed()
		c.Reset(m)
		want := c.Finish(c.Feed(nil, []byte(upstream)))
		if !bytes.Equal(got, want) {
			t.Fatalf("split %d changes the output:\n got %s\nwant %s", seed, got, want)
		}
		whole = want
	}
	return whole
}

func eventSummary(evs []sseEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.name)
		if d, ok := ev.data["delta"].(map[string]any); ok {
			if typ, ok := d["type"].(string); ok { // anthropic
				b.WriteString("(" + typ + ")")
			}
		}
		if cb, ok := ev.data["content_block"].(map[string]any); ok {
			b.WriteString("(" + cb["type"].(string) + ")")
		}
		if it, ok := ev.data["item"].(map[string]any); ok {
			b.WriteString("(" + it["type"].(string) + ")")
		}
		b.WriteByte(' ')
	}
	return strings.TrimSpace(b.String())
}

func TestAnthropicStreamEventSequence(t *testing.T) {
	m := anthropicMeta(t, `{"model":"claude-client","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	m.PromptTokens = 11
	out := convertStream(t, m, upstreamAll)
	evs, err := checkAnthropicSSE(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "message_start content_block_start(thinking) ping content_block_delta(thinking_delta) content_block_delta(thinking_delta) content_block_stop " +
		"content_block_start(text) content_block_delta(text_delta) content_block_delta(text_delta) content_block_stop " +
		"content_block_start(tool_use) content_block_delta(input_json_delta) content_block_delta(input_json_delta) content_block_stop " +
		"content_block_start(tool_use) content_block_delta(input_json_delta) content_block_stop message_delta message_stop"
	if got := eventSummary(evs); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	for _, s := range []string{
		`{"type":"message_start","message":{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[],"stop_reason":null,"stop_sequence":null,"stop_details":null,"container":null,"diagnostics":null,"usage":{"input_tokens":11,`,
		`"index":1,"delta":{"type":"text_delta","text":"lo \"w\"\n"}}`,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_a","name":"get","input":{},"caller":{"type":"direct"}}}`,
		`"index":2,"delta":{"type":"input_json_delta","partial_json":"{\"c\":"}}`,
		`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null,"stop_details":null,"container":null},"usage":{"input_tokens":8,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":7,"output_tokens_details":null,"server_tool_use":null}}`,
	} {
		if !bytes.Contains(out, []byte(s)) {
			t.Errorf("missing %s", s)
		}
	}
}

func TestAnthropicStreamStopReasons(t *testing.T) {
	m := anthropicMeta(t, `{"model":"c","max_tokens":5,"stream":true,"stop_sequences":["END"],"messages":[{"role":"user","content":"x"}]}`)
	f := func(finish, extra, want string) {
		t.Helper()
		up := chunkLine(`{"content":"a"}`, "null") + strings.Replace(chunkLine(`{}`, finish), "}]}", extra+"}]}", 1) + "data: [DONE]\n\n"
		out := convertStream(t, m, up)
		if _, err := checkAnthropicSSE(out); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("%s: want %s in\n%s", finish, want, out)
		}
	}
	f(`"stop"`, "", `"stop_reason":"end_turn","stop_sequence":null`)
	f(`"stop"`, `,"stop_reason":"END"`, `"stop_reason":"stop_sequence","stop_sequence":"END"`)
	f(`"stop"`, `,"stop_reason":151645`, `"stop_reason":"end_turn"`)
	// SGLang names the matched stop string in matched_stop (a token id, a
	// number, when the stop was a token)
	f(`"stop"`, `,"matched_stop":"END"`, `"stop_reason":"stop_sequence","stop_sequence":"END"`)
	f(`"stop"`, `,"matched_stop":151645`, `"stop_reason":"end_turn","stop_sequence":null`)
	f(`"length"`, "", `"stop_reason":"max_tokens"`)
	f(`"content_filter"`, "", `"stop_reason":"refusal"`)
	// no usage from the engine: output tokens fall back to the delta count
	f(`"stop"`, "", `"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"output_tokens_details":null,"server_tool_use":null}`)
}

func TestResponsesStreamEventSequence(t *testing.T) {
	m := responsesMeta(t, `{"model":"gpt-client","stream":true,"input":"x","instructions":"i","tools":[{"type":"function","name":"get"}]}`)
	out := convertStream(t, m, upstreamAll)
	evs, err := checkResponsesSSE(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "response.created response.in_progress " +
		"response.output_item.added(reasoning) response.content_part.added response.reasoning_text.delta response.reasoning_text.delta response.reasoning_text.done response.content_part.done response.output_item.done(reasoning) " +
		"response.output_item.added(message) response.content_part.added response.output_text.delta response.output_text.delta response.output_text.done response.content_part.done response.output_item.done(message) " +
		"response.output_item.added(function_call) response.function_call_arguments.delta response.function_call_arguments.delta response.function_call_arguments.done response.output_item.done(function_call) " +
		"response.output_item.added(function_call) response.function_call_arguments.delta response.function_call_arguments.done response.output_item.done(function_call) " +
		"response.completed"
	if got := eventSummary(evs); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	final := evs[len(evs)-1].raw
	for _, s := range []string{
		`"status":"completed"`, `"instructions":"i"`, `"model":"gpt-client"`,
		`"content":[{"type":"reasoning_text","text":"Let me think."}]`,
		`"content":[{"type":"output_text","text":"Hello \"w\"\n","annotations":[],"logprobs":[]}]`,
		`"type":"function_call","call_id":"call_a","name":"get","arguments":"{\"c\":1}","status":"completed"`,
		`"type":"function_call","call_id":"call_b","name":"put","arguments":"{}","status":"completed"`,
		`"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":19}`,
	} {
		if !strings.Contains(final, s) {
			t.Errorf("response.completed lacks %s:\n%s", s, final)
		}
	}
	out = convertStream(t, m, chunkLine(`{"content":"a"}`, "null")+chunkLine(`{}`, `"length"`)+"data: [DONE]\n\n")
	if evs, err := checkResponsesSSE(out); err != nil || evs[len(evs)-1].name != "response.incomplete" || !bytes.Contains(out, []byte(`"incomplete_details":{"reason":"max_output_tokens"}`)) {
		t.Errorf("length: %v\n%s", err, out)
	}
	// The item the limit cut is incomplete in its output_item.done and in
	// the final Response; the reasoning before it completed.
	out = convertStream(t, m, chunkLine(`{"reasoning_content":"r"}`, "null")+chunkLine(`{"content":"a"}`, "null")+chunkLine(`{}`, `"length"`)+"data: [DONE]\n\n")
	evs, err = checkResponsesSSE(out)
	if err != nil {
		t.Fatal(err)
	}
	var itemDone []string
	for _, ev := range evs {
		if ev.name == "response.output_item.done" {
			itemDone = append(itemDone, ev.data["item"].(map[string]any)["status"].(string))
		}
	}
	output := evs[len(evs)-1].data["response"].(map[string]any)["output"].([]any)
	if len(output) != 2 || strings.Join(itemDone, ",") != "completed,incomplete" ||
		output[0].(map[string]any)["status"] != "completed" || output[1].(map[string]any)["status"] != "incomplete" ||
		output[1].(map[string]any)["content"].([]any)[0].(map[string]any)["text"] != "a" {
		t.Errorf("item statuses %v, final output %v", itemDone, output)
	}
}

func TestStreamEndingsAndFailures(t *testing.T) {
	am := anthropicMeta(t, `{"model":"c","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	rm := responsesMeta(t, `{"model":"g","stream":true,"input":"x"}`)
	for _, tc := range []struct {
		name, upstream string
		last           string // the last event's name
		contains       string
	}{
		{"finish without [DONE] (Finish ends it)", chunkLine(`{"content":"a"}`, `"stop"`) + usageLine, "", ""},
		{"cut before finish_reason", chunkLine(`{"content":"a"}`, "null"), "error", "ended before the answer was complete"},
		{"[DONE] before finish_reason", chunkLine(`{"content":"a"}`, "null") + "data: [DONE]\n\n", "error", "ended before the answer was complete"},
		{"engine error chunk", chunkLine(`{"content":"a"}`, "null") + `data: {"error":{"message":"out of KV","type":"internal_error"}}` + "\n\n", "error", "out of KV"},
		{"malformed chunk", "data: {\"choices\":[\n\n", "error", "malformed stream chunk"},
		{"comments, event names and CRLF are skipped", ": keepalive\r\nevent: chunk\r\nid: 7\r\n" + strings.ReplaceAll(chunkLine(`{"content":"a"}`, `"stop"`), "\n", "\r\n") + "data: [DONE]\r\n\r\n", "", ""},
		{"bare CR line ends", strings.ReplaceAll(": ping\nevent: chunk\n"+chunkLine(`{"content":"a"}`, "null")+"data:"+strings.TrimPrefix(chunkLine(`{}`, `"stop"`), "data: ")+usageLine+"data: [DONE]\n\n", "\n", "\r"), "", ""},
		{"a multi-line data event with bare CR and CRLF line ends", "data: {\"choices\":[{\"index\":0,\r\ndata: \"delta\":{\"content\":\"a\"},\rdata: \"finish_reason\":\"stop\"}]}\r\r\ndata: [DONE]\r\r", "", ""},
		{"last event without its blank line", chunkLine(`{"content":"a"}`, `"stop"`) + "data: [DONE]", "", ""},
		{"tool arguments before the name", chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]}`, "null") + chunkLine(`{"tool_calls":[{"index":0,"id":"x","function":{"name":"n"}}]}`, `"tool_calls"`) + "data: [DONE]\n\n", "", `{\"a\":1}`},
	} {
		for _, api := range []API{Anthropic, Responses} {
			m, check, end := am, checkAnthropicSSE, "message_stop"
			if api == Responses {
				m, check, end = rm, checkResponsesSSE, "response.completed"
			}
			out := convertStream(t, m, tc.upstream)
			evs, err := check(out)
			if err != nil {
				t.Errorf("%s/%v: %v\n%s", tc.name, api, err, out)
				continue
			}
			want := tc.last
			if want == "" {
				want = end
			}
			if got := evs[len(evs)-1].name; got != want || !bytes.Contains(out, []byte(tc.contains)) {
				t.Errorf("%s/%v: last event %s (want %s), contains %q?\n%s", tc.name, api, got, want, tc.contains, out)
			}
		}
	}
}

func TestStreamFailAfterFirstByte(t *testing.T) {
	m := anthropicMeta(t, `{"model":"c","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	c := AcquireStreamConverter(m)
	defer ReleaseStreamConverter(c)
	out := c.Feed(nil, []byte(chunkLine(`{"content":"a"}`, "null")))
	out = c.Fail(out, 504, TypeTimeout, "upstream stream from worker w1 timed out")
	if !bytes.HasSuffix(out, []byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"timeout_error\",\"message\":\"upstream stream from worker w1 timed out\"}}\n\n")) {
		t.Errorf("anthropic: %s", out)
	}
	if !c.Done() || len(c.Feed(nil, []byte(usageLine))) != 0 || len(c.Finish(nil)) != 0 || len(c.Fail(nil, 500, "", "x")) != 0 {
		t.Error("a failed stream must stay silent")
	}
	rm := responsesMeta(t, `{"model":"g","stream":true,"input":"x"}`)
	c.Reset(rm)
	out = c.Feed(nil, []byte(chunkLine(`{"content":"a"}`, "null")))
	out = c.Fail(out, 502, TypeServer, "boom")
	evs, err := checkResponsesSSE(out)
	if err != nil || evs[len(evs)-1].name != "error" || !strings.Contains(evs[len(evs)-1].raw, `"code":"server_error","message":"boom","param":null`) {
		t.Errorf("responses: %v\n%s", err, out)
	}
}

func TestStreamConverterReuseAndUsage(t *testing.T) {
	m := anthropicMeta(t, `{"model":"c","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	c := AcquireStreamConverter(m)
	first := c.Finish(c.Feed(nil, []byte(upstreamAll)))
	if u := c.Usage(); !u.Seen || u.PromptTokens != 12 || u.CompletionTokens != 7 || u.CachedTokens != 4 || u.ReasoningTokens != 2 {
		t.Errorf("usage %+v", u)
	}
	for i := 0; i < 3; i++ {
		c.Reset(m)
		again := c.Finish(c.Feed(nil, []byte(upstreamAll)))
		// ids of tool calls come from the engine, so the bytes repeat
		if !bytes.Equal(first, again) {
			t.Fatalf("reuse %d differs:\n%s\n%s", i, first, again)
		}
	}
	ReleaseStreamConverter(c)
}

func TestStreamBoundsHostileUpstreams(t *testing.T) {
	m := anthropicMeta(t, `{"model":"c","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	c := AcquireStreamConverter(m)
	defer ReleaseStreamConverter(c)
	// an endless line
	big := bytes.Repeat([]byte("a"), 1<<20)
	var out []byte
	for i := 0; i < 9 && !c.Done(); i++ {
		out = c.Feed(out, big)
	}
	if !c.Done() || !bytes.Contains(out, []byte("larger than 8 MiB")) {
		t.Errorf("an endless line must fail the stream: %s", tail(string(out)))
	}
	// too many tool calls
	c.Reset(m)
	var up strings.Builder
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&up, "%s", chunkLine(fmt.Sprintf(`{"tool_calls":[{"index":%d,"id":"c%d","function":{"name":"f","arguments":"{}"}}]}`, i, i), "null"))
	}
	out = c.Feed(nil, []byte(up.String()))
	if evs, err := checkAnthropicSSE(out); err != nil || evs[len(evs)-1].name != "error" {
		t.Errorf("too many tools: %v %s", err, tail(string(out)))
	}
}

// Echoed request settings are compacted: a client that pretty-prints its
// tools (the OpenAI SDK sends them as given) must not break the data lines
// of response.created and response.completed.
func TestResponsesStreamEchoesPrettyPrintedSettingsOnOneLine(t *testing.T) {
	m := responsesMeta(t, "{\"model\":\"g\",\"stream\":true,\"input\":\"x\",\"tools\":[\n  {\n    \"type\": \"function\",\n    \"name\": \"f\",\n    \"description\": \"a b\\nc\"\n  }\n],\"metadata\":{\n\"k\": \"v w\"}}")
	out := convertStream(t, m, chunkLine(`{"content":"a"}`, `"stop"`)+"data: [DONE]\n\n")
	evs, err := checkResponsesSSE(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(evs[0].raw, `"tools":[{"type":"function","name":"f","description":"a b\nc"}]`) || !strings.Contains(evs[0].raw, `"metadata":{"k":"v w"}`) {
		t.Errorf("echo not compacted as expected: %s", evs[0].raw)
	}
}

// Parallel tool calls whose fragments interleave (both opened, then their
// arguments): the first streams, the second is held and sent whole at the
// end, so no fragment follows its call's stop (Messages) or done
// (Responses), and each call is done with all of its arguments.
func TestInterleavedParallelToolCallsAreEachSentWhole(t *testing.T) {
	tc := func(d string) string { return chunkLine(`{"tool_calls":[`+d+`]}`, "null") }
	up := tc(`{"index":0,"id":"call_a","type":"function","function":{"name":"get","arguments":""}}`) +
		tc(`{"index":1,"id":"call_b","type":"function","function":{"name":"put","arguments":""}}`) +
		tc(`{"index":0,"function":{"arguments":"{\"a\":"}}`) +
		tc(`{"index":1,"function":{"arguments":"{\"b\":2}"}}`) +
		tc(`{"index":0,"function":{"arguments":"1}"}}`) +
		chunkLine(`{}`, `"tool_calls"`) + usageLine + "data: [DONE]\n\n"
	want := map[string]string{"get": `{"a":1}`, "put": `{"b":2}`}

	evs, err := checkAnthropicSSE(convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Messages: %v", err)
	}
	names, args := map[int]string{}, map[int]string{}
	for _, ev := range evs {
		switch ev.name {
		case "content_block_start":
			names[num(ev.data["index"])] = ev.data["content_block"].(map[string]any)["name"].(string)
		case "content_block_delta":
			args[num(ev.data["index"])] += ev.data["delta"].(map[string]any)["partial_json"].(string)
		}
	}
	for i, n := range names {
		if args[i] != want[n] {
			t.Errorf("Messages: tool %s got input %q, want %q", n, args[i], want[n])
		}
	}
	if len(names) != 2 {
		t.Errorf("Messages: %d tool blocks", len(names))
	}

	evs, err = checkResponsesSSE(convertStream(t, &Meta{API: Responses, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Responses: %v", err)
	}
	seen := 0
	for _, ev := range evs {
		if ev.name == "response.output_item.done" {
			it := ev.data["item"].(map[string]any)
			if it["type"] == "function_call" {
				seen++
				if n := it["name"].(string); it["arguments"] != want[n] {
					t.Errorf("Responses: %s done with arguments %q, want %q", n, it["arguments"], want[n])
				}
			}
		}
	}
	if seen != 2 {
		t.Errorf("Responses: %d function calls done", seen)
	}
}

// Without the engine's usage, the Responses stream reports the router's
// prompt estimate as input_tokens, as the Messages stream does.
func TestAResponsesStreamWithoutUsageReportsThePromptEstimate(t *testing.T) {
	up := chunkLine(`{"content":"hi"}`, "null") + chunkLine(`{}`, `"stop"`) + "data: [DONE]\n\n"
	evs, err := checkResponsesSSE(convertStream(t, &Meta{API: Responses, Model: []byte("m"), PromptTokens: 42}, up))
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	u := last.data["response"].(map[string]any)["usage"].(map[string]any)
	if num(u["input_tokens"]) != 42 {
		t.Fatalf("%s usage %v, want input_tokens 42", last.name, u)
	}
}

// An engine that omits the tool-call index and repeats the call's id on
// every fragment streams one call, not one per fragment.
func TestToolCallFragmentsWithoutAnIndexButWithTheirIDAreOneCall(t *testing.T) {
	tc := func(d string) string { return chunkLine(`{"tool_calls":[`+d+`]}`, "null") }
	up := tc(`{"id":"call_x","type":"function","function":{"name":"get","arguments":"{\"a\""}}`) +
		tc(`{"id":"call_x","function":{"arguments":":1}"}}`) +
		tc(`{"id":"","function":{"arguments":""}}`) +
		chunkLine(`{}`, `"tool_calls"`) + "data: [DONE]\n\n"
	evs, err := checkAnthropicSSE(convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up))
	if err != nil {
		t.Fatal(err)
	}
	blocks, input := 0, ""
	for _, ev := range evs {
		switch ev.name {
		case "content_block_start":
			blocks++
		case "content_block_delta":
			input += ev.data["delta"].(map[string]any)["partial_json"].(string)
		}
	}
	if blocks != 1 || input != `{"a":1}` {
		t.Fatalf("%d blocks, input %q; want one call with {\"a\":1}", blocks, input)
	}
}

// vLLM may send a call's name and the first part of its arguments, then
// content "\n", then the rest of the arguments (in its finish chunk). The
// text closed the tool block and the late arguments went into the closed
// block (Messages: a delta for a stopped block, whose SDK event had input
// {}; Responses: arguments.done with half the JSON, then a delta for the
// finished item). Text now waits while the live call's arguments are not
// whole. A call held for later whose fragments repeat its name keeps the
// name once (it became "get_timeget_time").
func TestTextBetweenACallsArgumentsWaitsUntilTheyAreWhole(t *testing.T) {
	tc := func(d string) string { return chunkLine(`{"tool_calls":[`+d+`]}`, "null") }
	up := tc(`{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Par"}}`) +
		chunkLine(`{"content":"\n"}`, "null") +
		tc(`{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":"}}`) +
		tc(`{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"\"UTC\"}"}}`) +
		chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"is\"}"}}]}`, `"tool_calls"`) + usageLine + "data: [DONE]\n\n"
	want := map[string]string{"get_weather": `{"city": "Paris"}`, "get_time": `{"tz":"UTC"}`}

	evs, err := checkAnthropicSSE(convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Messages: %v", err)
	}
	names, args, stopped := map[int]string{}, map[int]string{}, map[int]bool{}
	var order []string
	for _, ev := range evs {
		i := -1
		if _, ok := ev.data["index"]; ok {
			i = num(ev.data["index"])
		}
		switch ev.name {
		case "content_block_start":
			cb := ev.data["content_block"].(map[string]any)
			order = append(order, cb["type"].(string))
			if n, ok := cb["name"].(string); ok {
				names[i] = n
			}
		case "content_block_delta":
			if stopped[i] {
				t.Fatalf("Messages: a delta for block %d after its stop", i)
			}
			if pj, ok := ev.data["delta"].(map[string]any)["partial_json"].(string); ok {
				args[i] += pj
			}
		case "content_block_stop":
			stopped[i] = true
		}
	}
	for i, n := range names {
		if args[i] != want[n] {
			t.Errorf("Messages: tool %q got input %q, want %q", n, args[i], want[n])
		}
	}
	if got := strings.Join(order, ","); got != "tool_use,text,tool_use" || len(names) != 2 {
		t.Errorf("Messages: blocks %s, names %v", got, names)
	}

	evs, err = checkResponsesSSE(convertStream(t, &Meta{API: Responses, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Responses: %v", err)
	}
	done := map[string]bool{}
	for _, ev := range evs {
		switch ev.name {
		case "response.function_call_arguments.delta":
			if done[ev.data["item_id"].(string)] {
				t.Fatalf("Responses: an arguments delta after the item was done")
			}
		case "response.output_item.done":
			it := ev.data["item"].(map[string]any)
			if it["type"] == "function_call" {
				done[it["id"].(string)] = true
				if n := it["name"].(string); it["arguments"] != want[n] {
					t.Errorf("Responses: %q done with arguments %q, want %q", n, it["arguments"], want[n])
				}
			}
		}
	}
	if len(done) != 2 {
		t.Errorf("Responses: %d function calls done", len(done))
	}
}

func TestArgsScanTellsAWholeValue(t *testing.T) {
	for _, c := range []struct {
		raw   string
		whole bool
	}{
		{`{\"a\":1}`, true},
		{`{\"a\":\"}\"`, false},
		{`{\"a\":\"x\\\"}\"}`, true}, // an escaped quote inside a string
		{`{\"a\":\"\\\\\"}`, true},   // a backslash at the end of a string
		{`{\"a\":\"\u007d\"`, false}, // an escaped brace inside a string
		{`[1,{\"b\":[2]}]`, true},
		{`{\"a\":[1`, false},
		{``, false},
	} {
		var a argsScan
		for i := 0; i < len(c.raw); i++ { // one byte at a time
			a.feed([]byte{c.raw[i]})
		}
		if a.complete() != c.whole {
			t.Errorf("%s: complete %v, want %v", c.raw, a.complete(), c.whole)
		}
	}
}

// A chat refusal (message.refusal, delta.refusal) was dropped: an empty
// Message with end_turn, a Response with no output. It is the text of the
// Message with stop_reason refusal, and in a Response a message item with
// a refusal part (streamed with response.refusal.delta / .done).
func TestARefusalIsKeptInBothProtocols(t *testing.T) {
	const why = `I can't help with that.`
	ans := `{"choices":[{"message":{"role":"assistant","content":null,"refusal":"` + why + `"},"finish_reason":"stop"}]}`
	a, err := ChatToAnthropic(nil, []byte(ans), &Meta{API: Anthropic, Model: []byte("m")})
	if err != nil || !bytes.Contains(a, []byte(`"content":[{"type":"text","text":"`+why+`","citations":null}],"stop_reason":"refusal","stop_sequence":null,"stop_details":{"type":"refusal","category":null,"explanation":null}`)) {
		t.Fatalf("Message: %v %s", err, a)
	}
	r, err := ChatToResponses(nil, []byte(ans), &Meta{API: Responses, Model: []byte("m")})
	if err != nil || !bytes.Contains(r, []byte(`"content":[{"type":"refusal","refusal":"`+why+`"}]`)) || !bytes.Contains(r, []byte(`"status":"completed"`)) {
		t.Fatalf("Response: %v %s", err, r)
	}

	up := chunkLine(`{"role":"assistant","refusal":"I can't "}`, "null") + chunkLine(`{"refusal":"help with that."}`, "null") +
		chunkLine(`{}`, `"stop"`) + usageLine + "data: [DONE]\n\n"
	out := convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up)
	if _, err := checkAnthropicSSE(out); err != nil || !bytes.Contains(out, []byte(`"stop_reason":"refusal","stop_sequence":null,"stop_details":{"type":"refusal","category":null,"explanation":null}`)) || !bytes.Contains(out, []byte(`"text":"help with that."`)) {
		t.Fatalf("Messages stream: %v\n%s", err, out)
	}
	out = convertStream(t, &Meta{API: Responses, Model: []byte("m")}, up)
	evs, err := checkResponsesSSE(out)
	if err != nil {
		t.Fatalf("Responses stream: %v\n%s", err, out)
	}
	var names []string
	for _, ev := range evs {
		names = append(names, ev.name)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added response.refusal.delta response.refusal.delta response.refusal.done response.content_part.done response.output_item.done response.completed"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("Responses stream events:\n got %s\nwant %s", got, want)
	}
	done := evs[len(evs)-4].data
	if done["refusal"] != why {
		t.Fatalf("response.refusal.done: %v", done)
	}
	last := evs[len(evs)-1].data["response"].(map[string]any)["output"].([]any)[0].(map[string]any)
	if part := last["content"].([]any)[0].(map[string]any); part["type"] != "refusal" || part["refusal"] != why {
		t.Fatalf("completed output: %v", last)
	}
}

// A refusal that arrives while text is held (the streaming call's
// arguments not yet whole) waits too: it closed the tool block, and the
// late arguments went into the stopped block again.
func TestARefusalBetweenACallsArgumentsWaitsLikeText(t *testing.T) {
	tc := func(d string) string { return chunkLine(`{"tool_calls":[`+d+`]}`, "null") }
	up := tc(`{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"a\":"}}`) +
		chunkLine(`{"refusal":"no"}`, "null") +
		tc(`{"index":0,"function":{"arguments":"1}"}}`) +
		chunkLine(`{}`, `"tool_calls"`) + usageLine + "data: [DONE]\n\n"
	evs, err := checkAnthropicSSE(convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Messages: %v", err)
	}
	stopped, args := map[int]bool{}, ""
	for _, ev := range evs {
		switch ev.name {
		case "content_block_delta":
			i := num(ev.data["index"])
			if stopped[i] {
				t.Fatalf("Messages: a delta for block %d after its stop", i)
			}
			if pj, ok := ev.data["delta"].(map[string]any)["partial_json"].(string); ok {
				args += pj
			}
		case "content_block_stop":
			stopped[num(ev.data["index"])] = true
		}
	}
	if args != `{"a":1}` {
		t.Fatalf("Messages: tool input %q", args)
	}
	if _, err := checkResponsesSSE(convertStream(t, &Meta{API: Responses, Model: []byte("m")}, up)); err != nil {
		t.Fatalf("Responses: %v", err)
	}
}

// An engine that numbers every parallel call 0 and tells them apart by id
// streams two calls, not one whose arguments run together ({"x":1}{"y":2}
// broke the SDK's final message).
func TestParallelToolCallsSharingAnIndexWithTheirOwnIDsAreTwoCalls(t *testing.T) {
	tc := func(d string) string { return chunkLine(`{"tool_calls":[`+d+`]}`, "null") }
	up := tc(`{"index":0,"id":"call_a","type":"function","function":{"name":"f1","arguments":"{\"x\": "}}`) +
		tc(`{"index":0,"function":{"arguments":"1}"}}`) +
		tc(`{"index":0,"id":"call_b","type":"function","function":{"name":"f2","arguments":"{\"y\": "}}`) +
		tc(`{"index":0,"function":{"arguments":"2}"}}`) +
		chunkLine(`{}`, `"tool_calls"`) + usageLine + "data: [DONE]\n\n"
	evs, err := checkAnthropicSSE(convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up))
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	var names []string
	for _, ev := range evs {
		switch ev.name {
		case "content_block_start":
			if b := ev.data["content_block"].(map[string]any); b["type"] == "tool_use" {
				names = append(names, b["name"].(string))
			}
		case "content_block_delta":
			if d := ev.data["delta"].(map[string]any); d["type"] == "input_json_delta" {
				args[names[len(names)-1]] += d["partial_json"].(string)
			}
		}
	}
	if len(names) != 2 || args["f1"] != `{"x": 1}` || args["f2"] != `{"y": 2}` {
		t.Fatalf("calls %v, arguments %v; want f1 {\"x\": 1} and f2 {\"y\": 2}", names, args)
	}
	evs, err = checkResponsesSSE(convertStream(t, &Meta{API: Responses, Model: []byte("m")}, up))
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	for _, ev := range evs {
		if ev.name == "response.output_item.done" {
			if it := ev.data["item"].(map[string]any); it["type"] == "function_call" {
				calls = append(calls, it["name"].(string)+" "+it["arguments"].(string))
			}
		}
	}
	if len(calls) != 2 || calls[0] != `f1 {"x": 1}` || calls[1] != `f2 {"y": 2}` {
		t.Fatalf("Responses calls %q", calls)
	}
}

// An engine answering in OpenAI's deprecated function_call format (one
// call, no id) gets its call converted like a tool_calls entry: a
// tool_use block on Messages, a function_call item on Responses, streamed
// or not (they were dropped: stop_reason tool_use with no tool_use block,
// a completed Response with no output).
func TestADeprecatedFunctionCallAnswerBecomesAToolCall(t *testing.T) {
	const args = `{"city":"Paris"}`
	body := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},"finish_reason":"function_call"}],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`
	out, err := ChatToAnthropic(nil, []byte(body), &Meta{API: Anthropic, Model: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	var msg struct {
		Content []struct {
			Type, ID, Name string
			Input          map[string]any
		}
		StopReason string `json:"stop_reason"`
	}
	if err := json.Unmarshal(out, &msg); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" || msg.Content[0].Name != "get_weather" ||
		msg.Content[0].Input["city"] != "Paris" || msg.Content[0].ID == "" || msg.StopReason != "tool_use" {
		t.Errorf("Messages: %s", out)
	}
	out, err = ChatToResponses(nil, []byte(body), &Meta{API: Responses, Model: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Output []struct {
			Type, Name, Arguments string
			CallID                string `json:"call_id"`
		}
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "function_call" || resp.Output[0].Name != "get_weather" ||
		resp.Output[0].Arguments != args || resp.Output[0].CallID == "" {
		t.Errorf("Responses: %s", out)
	}

	up := chunkLine(`{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":""}}`, "null") +
		chunkLine(`{"function_call":{"arguments":"{\"city\":"}}`, "null") +
		chunkLine(`{"function_call":{"arguments":"\"Paris\"}"}}`, "null") +
		chunkLine(`{}`, `"function_call"`) + usageLine + "data: [DONE]\n\n"
	evs, err := checkAnthropicSSE(convertStream(t, &Meta{API: Anthropic, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Messages stream: %v", err)
	}
	name, input := "", ""
	for _, ev := range evs {
		switch ev.name {
		case "content_block_start":
			if b := ev.data["content_block"].(map[string]any); b["type"] == "tool_use" {
				name = b["name"].(string)
			}
		case "content_block_delta":
			if d := ev.data["delta"].(map[string]any); d["type"] == "input_json_delta" {
				input += d["partial_json"].(string)
			}
		}
	}
	if name != "get_weather" || input != args {
		t.Errorf("Messages stream: tool %q input %q", name, input)
	}
	evs, err = checkResponsesSSE(convertStream(t, &Meta{API: Responses, Model: []byte("m")}, up))
	if err != nil {
		t.Fatalf("Responses stream: %v", err)
	}
	done := 0
	for _, ev := range evs {
		if ev.name == "response.output_item.done" {
			if it := ev.data["item"].(map[string]any); it["type"] == "function_call" && it["name"] == "get_weather" && it["arguments"] == args {
				done++
			}
		}
	}
	if done != 1 {
		t.Errorf("Responses stream: %d function calls done", done)
	}
}

// An engine's error chunk inside a stream carries the HTTP status it stands
// for (vLLM's and SGLang's "code"): the client's error event is typed by it
// as an error answer of that status is, not always as a server error.
func TestStreamEngineErrorChunkIsTypedByItsCode(t *testing.T) {
	am := anthropicMeta(t, `{"model":"c","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	rm := responsesMeta(t, `{"model":"g","stream":true,"input":"x"}`)
	f := func(chunk, anthropicType, responsesCode string) {
		t.Helper()
		up := chunkLine(`{"content":"a"}`, "null") + "data: " + chunk + "\n\n"
		out := convertStream(t, am, up)
		if want := `event: error` + "\n" + `data: {"type":"error","error":{"type":"` + anthropicType + `",`; !bytes.Contains(out, []byte(want)) {
			t.Errorf("anthropic, %s: want %s\n%s", chunk, want, out)
		}
		out = convertStream(t, rm, up)
		if want := `"code":"` + responsesCode + `"`; !bytes.Contains(out, []byte(want)) {
			t.Errorf("responses, %s: want %s\n%s", chunk, want, out)
		}
	}
	f(`{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}`, "invalid_request_error", "invalid_request_error")
	f(`{"error":{"object":"error","message":"busy","type":"ServiceUnavailableError","param":null,"code":503}}`, "overloaded_error", "service_unavailable")
	f(`{"object":"error","message":"slow down","type":"RateLimitError","code":429}`, "rate_limit_error", "rate_limit_error")
	f(`{"error":{"message":"x","code":529}}`, "overloaded_error", "server_error")
	f(`{"error":{"message":"x","code":413}}`, "request_too_large", "invalid_request_error")
	f(`{"error":{"message":"boom","type":"InternalServerError","code":500}}`, "api_error", "server_error")
	f(`{"error":{"message":"out of KV","type":"internal_error"}}`, "api_error", "server_error")
	f(`{"error":{"message":"x","code":"bad_thing"}}`, "api_error", "server_error")
	f(`{"error":{"message":"x","code":200}}`, "api_error", "server_error")
}
