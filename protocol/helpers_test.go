package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/infera/infera/config"
)

// deterministicIDs makes ids repeatable until the returned func restores
// the random source. Call reseed before each conversion to compare.
func deterministicIDs() (reseed, restore func()) {
	old := idSource
	var r *rand.Rand
	reseed = func() { r = rand.New(rand.NewPCG(7, 7)) }
	reseed()
	idSource = func() uint64 { return r.Uint64() }
	return reseed, func() { idSource = old }
}

type sseEvent struct {
	name string
	data map[string]any
	raw  string
}

// parseClientSSE splits converter output into events, each with exactly
// one event: line and one data: line holding a JSON object whose type is
// the event name. A comment (":", an engine's keep-alive passed on) is a
// block of its own, skipped as SSE parsers skip it.
func parseClientSSE(out []byte) ([]sseEvent, error) {
	var evs []sseEvent
	s := string(out)
	if s == "" {
		return nil, nil
	}
	if !strings.HasSuffix(s, "\n\n") {
		return nil, fmt.Errorf("output does not end with a blank line: %q", tail(s))
	}
	for _, block := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		if block == ":" {
			continue
		}
		lines := strings.Split(block, "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
			return nil, fmt.Errorf("malformed event %q", block)
		}
		ev := sseEvent{name: lines[0][7:], raw: lines[1][6:]}
		dec := json.NewDecoder(strings.NewReader(ev.raw))
		dec.UseNumber()
		if err := dec.Decode(&ev.data); err != nil || dec.More() {
			return nil, fmt.Errorf("event %s: data is not one JSON object: %v: %s", ev.name, err, ev.raw)
		}
		if ev.data["type"] != ev.name {
			return nil, fmt.Errorf("event %s has data type %v", ev.name, ev.data["type"])
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

func tail(s string) string {
	if len(s) > 80 {
		return s[len(s)-80:]
	}
	return s
}

func num(v any) int {
	n, _ := v.(json.Number).Int64()
	return int(n)
}

// checkAnthropicSSE checks the Anthropic event grammar: message_start,
// content blocks with consecutive indexes, each started before its deltas
// and stopped once, then message_delta and message_stop; or an error event
// ending the stream anywhere.
func checkAnthropicSSE(out []byte) ([]sseEvent, error) {
	evs, err := parseClientSSE(out)
	if err != nil || len(evs) == 0 {
		return evs, err
	}
	if evs[0].name != "message_start" && evs[0].name != "error" {
		return evs, fmt.Errorf("first event %s", evs[0].name)
	}
	started, stopped := map[int]string{}, map[int]bool{}
	open := -1
	for i, ev := range evs {
		last := i == len(evs)-1
		switch ev.name {
		case "message_start":
			if i != 0 {
				return evs, fmt.Errorf("message_start at %d", i)
			}
		case "ping":
		case "content_block_start":
			idx := num(ev.data["index"])
			if idx != len(started) || open >= 0 {
				return evs, fmt.Errorf("content_block_start index %d with %d started, %d open", idx, len(started), open)
			}
			started[idx] = ev.data["content_block"].(map[string]any)["type"].(string)
			open = idx
		case "content_block_delta":
			idx := num(ev.data["index"])
			typ, ok := started[idx]
			if !ok {
				return evs, fmt.Errorf("delta for block %d before its start", idx)
			}
			if idx != open {
				return evs, fmt.Errorf("delta for block %d while block %d is open (stopped: %v)", idx, open, stopped[idx])
			}
			want := map[string]string{"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}[typ]
			if dt := ev.data["delta"].(map[string]any)["type"]; dt != want {
				return evs, fmt.Errorf("block %d (%s) got %v", idx, typ, dt)
			}
		case "content_block_stop":
			idx := num(ev.data["index"])
			if idx != open || stopped[idx] {
				return evs, fmt.Errorf("content_block_stop %d, open %d", idx, open)
			}
			stopped[idx], open = true, -1
		case "message_delta":
			if open >= 0 || i != len(evs)-2 || evs[i+1].name != "message_stop" {
				return evs, fmt.Errorf("message_delta at %d of %d (open block %d)", i, len(evs), open)
			}
			d := ev.data["delta"].(map[string]any)
			switch d["stop_reason"] {
			case "end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal":
			default:
				return evs, fmt.Errorf("stop_reason %v", d["stop_reason"])
			}
		case "message_stop":
			if !last {
				return evs, fmt.Errorf("message_stop at %d of %d", i, len(evs))
			}
		case "error":
			if !last {
				return evs, fmt.Errorf("error event at %d of %d", i, len(evs))
			}
			e := ev.data["error"].(map[string]any)
			if e["type"] == nil || e["message"] == nil {
				return evs, fmt.Errorf("error event without type or message: %s", ev.raw)
			}
		default:
			return evs, fmt.Errorf("unknown event %s", ev.name)
		}
	}
	return evs, nil
}

// checkResponsesSSE checks the Responses event grammar: consecutive
// sequence numbers from 0, created and in_progress first, items added
// before their events with consecutive output indexes, and completed or
// incomplete (or error) last, with every item done.
func checkResponsesSSE(out []byte) ([]sseEvent, error) {
	evs, err := parseClientSSE(out)
	if err != nil || len(evs) == 0 {
		return evs, err
	}
	added, done := map[int]string{}, map[int]bool{}
	for i, ev := range evs {
		if num(ev.data["sequence_number"]) != i {
			return evs, fmt.Errorf("event %d (%s) has sequence_number %v", i, ev.name, ev.data["sequence_number"])
		}
		last := i == len(evs)-1
		oi := -1
		if v, ok := ev.data["output_index"]; ok {
			oi = num(v)
			if ev.name != "response.output_item.added" {
				if _, ok := added[oi]; !ok {
					return evs, fmt.Errorf("%s for output %d before it was added", ev.name, oi)
				}
			}
		}
		switch ev.name {
		case "response.created", "response.in_progress":
			if (ev.name == "response.created") != (i == 0) || (ev.name == "response.in_progress" && i != 1) {
				return evs, fmt.Errorf("%s at %d", ev.name, i)
			}
		case "response.output_item.added":
			if oi != len(added) {
				return evs, fmt.Errorf("output_item.added index %d, want %d", oi, len(added))
			}
			added[oi] = ev.data["item"].(map[string]any)["type"].(string)
		case "response.output_item.done":
			if done[oi] {
				return evs, fmt.Errorf("output %d done twice", oi)
			}
			done[oi] = true
		case "response.content_part.added", "response.content_part.done", "response.output_text.delta",
			"response.output_text.done", "response.reasoning_text.delta", "response.reasoning_text.done",
			"response.function_call_arguments.delta", "response.function_call_arguments.done",
			"response.refusal.delta", "response.refusal.done":
			if oi := num(ev.data["output_index"]); done[oi] {
				return evs, fmt.Errorf("%s for output %d after it was done", ev.name, oi)
			}
		case "response.completed", "response.incomplete":
			if !last || len(done) != len(added) {
				return evs, fmt.Errorf("%s at %d of %d with %d/%d items done", ev.name, i, len(evs), len(done), len(added))
			}
			resp := ev.data["response"].(map[string]any)
			if n := len(resp["output"].([]any)); n != len(added) {
				return evs, fmt.Errorf("final output has %d items, %d were added", n, len(added))
			}
		case "error":
			if !last {
				return evs, fmt.Errorf("error event at %d of %d", i, len(evs))
			}
		default:
			return evs, fmt.Errorf("unknown event %s", ev.name)
		}
	}
	return evs, nil
}

// feedSplit runs upstream through c in pieces cut by r and finishes it.
func feedSplit(c *StreamConverter, upstream []byte, r *rand.Rand, max int) []byte {
	var out []byte
	for _, p := range splitRandom(r, upstream, max) {
		out = c.Feed(out, p)
	}
	return c.Finish(out)
}

// validJSONObject reports whether b is exactly one JSON object.
func validJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

func nilProtocol() *config.Protocol { return &config.Protocol{} }
