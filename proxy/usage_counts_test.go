package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// An engine's usage counts are read as its JSON encoder may write them: a
// whole number written with an exponent or a fraction of zeros (1.1e1,
// 0.3E+1, 4.0: what Python's json writes for a float holding a count) is
// that number, on every governed path (chat and completions, streamed or
// not; Anthropic's /v1/messages and Responses passed through, streamed or
// not). A negative count or a fraction is no count: the request keeps the
// router's estimate, in the user's quota, the token metrics and the access
// log. 1.1e1 was read as 1 token (its leading digits), and a negative count
// was skipped, so a usage of -3 completion tokens charged the prompt alone,
// far below the estimate.
func TestUsageCountsAreWholeNumbersInAnyNotationOrTheEstimateStands(t *testing.T) {
	const (
		chatReq = `{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`
		antReq  = `{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`
		respReq = `{"model":"m","max_output_tokens":1000,"input":"hello"}`
	)
	stream := func(req string) string {
		return strings.Replace(req, `{"model":"m",`, `{"model":"m","stream":true,`, 1)
	}
	// The answers, with the counts as placeholders: P prompt (11), I
	// Anthropic's input_tokens (7: 11 with 4 cache reads), C completion
	// (3), K cached (4).
	paths := []struct {
		name, path, body, proto, head, answer string
	}{
		{"chat", "/v1/chat/completions", chatReq, ``, jsonHead,
			`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":P,"total_tokens":14,"completion_tokens":C,"prompt_tokens_details":{"cached_tokens":K}}}`},
		{"chat stream", "/v1/chat/completions", strings.Replace(stream(chatReq), `"messages"`, `"stream_options":{"include_usage":true},"messages"`, 1), ``, sseHead,
			chatText + chatStop + "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":P,\"total_tokens\":14,\"completion_tokens\":C,\"prompt_tokens_details\":{\"cached_tokens\":K}}}\n\n" + sseDone},
		{"completions stream", "/v1/completions", `{"model":"m","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"prompt":"hello"}`, ``, sseHead,
			complText + "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":P,\"total_tokens\":14,\"completion_tokens\":C,\"prompt_tokens_details\":{\"cached_tokens\":K}}}\n\n" + sseDone},
		{"anthropic", "/v1/messages", antReq, `"anthropic_passthrough": true`, jsonHead,
			`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":I,"cache_read_input_tokens":K,"output_tokens":C}}`},
		{"anthropic stream", "/v1/messages", stream(antReq), `"anthropic_passthrough": true`, sseHead,
			strings.NewReplacer(`"input_tokens":7`, `"input_tokens":I`, `"cache_read_input_tokens":4`, `"cache_read_input_tokens":K`).Replace(antStart) +
				strings.Replace(antDelta, `"output_tokens":3`, `"output_tokens":C`, 1) + antStop},
		{"responses", "/v1/responses", respReq, `"responses_passthrough": true`, jsonHead,
			`{"id":"resp_counts1","object":"response","status":"completed","output":[],"usage":{"input_tokens":P,"input_tokens_details":{"cached_tokens":K},"output_tokens":C,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":14}}`},
		{"responses stream", "/v1/responses", stream(respReq), `"responses_passthrough": true`, sseHead,
			respText + strings.NewReplacer(`"input_tokens":11`, `"input_tokens":P`, `"cached_tokens":4`, `"cached_tokens":K`, `"output_tokens":3`, `"output_tokens":C`).Replace(respDone)},
	}
	counts := []struct {
		name       string
		p, i, c, k string
		settled    bool
	}{
		{"whole numbers with exponents and fractions of zeros", "1.1e1", "7E0", "0.3e+1", "4.0", true},
		{"a negative completion count", "11", "7", "-3", "4", false},
		{"a fractional completion count", "11", "7", "25e-1", "4", false},
		{"a negative prompt count", "-11", "-7", "3", "4", false},
	}
	for _, p := range paths {
		for _, n := range counts {
			t.Run(p.name+": "+n.name, func(t *testing.T) {
				answer := strings.NewReplacer("P,", n.p+",", "P}", n.p+"}", "I,", n.i+",", "C,", n.c+",", "C}", n.c+"}", "K}", n.k+"}", "K,", n.k+",").Replace(p.answer)
				if strings.Count(answer, n.c) == 0 {
					t.Fatalf("no count in %q", answer)
				}
				up := startRaw(t, func(_ int, _ string, c net.Conn) {
					fmt.Fprintf(c, "%s%x\r\n%s\r\n0\r\n\r\n", p.head, len(answer), answer)
				})
				sr := startSettleRouter(t, p.proto, up.url)
				req, _ := http.NewRequest("POST", sr.r.url+p.path, strings.NewReader(p.body))
				req.Header.Set("Authorization", "Bearer "+sr.key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), n.c) {
					t.Fatalf("want the engine's answer relayed: %d %q", resp.StatusCode, b)
				}
				sr.check(t, endComplete, n.settled)
			})
		}
	}
}

// parseCount reads a JSON number as a token count: whole numbers in any
// notation, capped; negative numbers, fractions and other values are no
// count; null is none.
func TestParseCountReadsWholeNumbersInAnyNotation(t *testing.T) {
	f := func(in string, want int, st uint8) {
		t.Helper()
		if n, s := parseCount([]byte(in)); n != want || s != st {
			t.Errorf("parseCount(%q) = %d, %d; want %d, %d", in, n, s, want, st)
		}
	}
	f("1500,", 1500, countOK)
	f("1.5e3}", 1500, countOK)
	f("1.5E+3", 1500, countOK)
	f("15000e-1", 1500, countOK)
	f("1500.000", 1500, countOK)
	f("0", 0, countOK)
	f("-0", 0, countOK)
	f("0.0e9", 0, countOK)
	f("1e400", maxUsageCount, countOK)
	f("123456789012345678901234567890", maxUsageCount, countOK)
	f("1099511627777", maxUsageCount, countOK)
	f("null", 0, countAbsent)
	f("-3", 0, countBad)
	f("-1.5e3", 0, countBad)
	f("2.5", 0, countBad)
	f("25e-1", 0, countBad)
	f("1e-400", 0, countBad)
	f(`"12"`, 0, countBad)
	f("true", 0, countBad)
	f("1e", 0, countBad)
	f("", 0, countBad)
}

// FuzzParseCountAgreesWithTheNumberParser: parseCount's plain-digits
// path reads every input as parseNumberCount, the parser of any value,
// does.
func FuzzParseCountAgreesWithTheNumberParser(f *testing.F) {
	for _, s := range []string{"1500,", "1500", "1500}", "15.0,", "1e3 ", "000012,", "999999999999,", "9999999999999,",
		"1099511627777}", "12-", "12+", "7\n", "0,", "-3,", "null", `"12"`, ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		n, st := parseCount(p)
		wn, wst := parseNumberCount(p)
		if n != wn || st != wst {
			t.Fatalf("parseCount(%q) = %d, %d; parseNumberCount = %d, %d", p, n, st, wn, wst)
		}
	})
}

// A usage object is read alone: a chat answer whose usage leaves out
// completion_tokens but counts them in total_tokens is charged the total
// (it was charged the prompt alone), and a cached_tokens key after the
// usage object (an engine's own metrics) is not the usage's (it was taken
// for the cached share of the prompt, which a cached weight below the
// input weight charges less).
func TestAUsageObjectIsReadAloneAndWhole(t *testing.T) {
	const req = `{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`
	head := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],`
	for _, tc := range []struct {
		name, answer string
		cached       int
	}{
		{"no completion_tokens", head + `"usage":{"prompt_tokens":11,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":4}}}`, 4},
		{"a cached_tokens after the usage", head + `"usage":{"prompt_tokens":11,"total_tokens":14,"completion_tokens":3},"engine_metrics":{"cached_tokens":11}}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(_ int, _ string, c net.Conn) {
				fmt.Fprintf(c, "%s%x\r\n%s\r\n0\r\n\r\n", jsonHead, len(tc.answer), tc.answer)
			})
			sr := startSettleRouter(t, ``, up.url)
			r, _ := http.NewRequest("POST", sr.r.url+"/v1/chat/completions", strings.NewReader(req))
			r.Header.Set("Authorization", "Bearer "+sr.key)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			sr.checkCached(t, endComplete, true, tc.cached)
		})
	}
}
