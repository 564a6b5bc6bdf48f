package bench

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

func TestParseTrace(t *testing.T) {
	f := func(in string, wantReqs int, wantBadLines []int) {
		t.Helper()
		reqs, bad, err := ParseTrace(strings.NewReader(in))
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		if len(reqs) != wantReqs {
			t.Fatalf("got %d requests, want %d", len(reqs), wantReqs)
		}
		if len(bad) != len(wantBadLines) {
			t.Fatalf("got bad lines %v, want lines %v", bad, wantBadLines)
		}
		for i, b := range bad {
			if b.Line != wantBadLines[i] {
				t.Fatalf("bad[%d] is line %d (%v), want line %d", i, b.Line, b.Err, wantBadLines[i])
			}
		}
	}
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`
	f("", 0, nil)
	f(good, 1, nil)
	f(good+"\n\n"+good+"\n", 2, nil)
	f(good+"\n{bad json\n"+good, 2, []int{2})
	f(`{"timestamp": 1}`+"\n"+good, 1, []int{1})
	f(good+"\n"+`{"timestamp": 5, "input_length": -3, "output_length": 5, "hash_ids": []}`, 1, []int{2})
	f(`{"timestamp": 5, "input_length": 3, "output_length": 0, "hash_ids": []}`, 0, []int{1})
	f(`{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [-1]}`, 0, []int{1})
	f(`{"timestamp": "x", "input_length": 3, "output_length": 1}`, 0, []int{1})
	f("[]\nnull\n"+good, 1, []int{1, 2})
	// CRLF and a very long line.
	f(good+"\r\n"+good+"\r\n", 2, nil)
	f(strings.Repeat("x", 200_000)+"\n"+good, 1, []int{1})
}

func TestParseTraceSortsAndScales(t *testing.T) {
	in := `{"timestamp": 300, "input_length": 10, "output_length": 1, "hash_ids": [2]}
{"timestamp": 100, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"timestamp": 200, "input_length": 10, "output_length": 1, "hash_ids": [3]}`
	reqs, _, err := ParseTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if reqs[0].Timestamp != 100 || reqs[2].Timestamp != 300 {
		t.Fatalf("not sorted: %+v", reqs)
	}
	s := ScaleTrace(reqs, 2, 0, 0)
	if s[0].Timestamp != 0 || s[1].Timestamp != 50 || s[2].Timestamp != 100 {
		t.Fatalf("bad scaling: %+v", s)
	}
	if reqs[1].Timestamp != 200 {
		t.Fatalf("input modified")
	}
	if n := len(ScaleTrace(reqs, 1, 2, 0)); n != 2 {
		t.Fatalf("max requests: got %d", n)
	}
	if n := len(ScaleTrace(reqs, 1, 0, 150)); n != 2 {
		t.Fatalf("duration: got %d", n)
	}
	// A request due when the run ends is not sent: it is not announced
	// (the report said more were replayed than it counted).
	if n := len(ScaleTrace(reqs, 1, 0, 200)); n != 2 {
		t.Fatalf("duration at a request's time: got %d, want 2", n)
	}
}

func TestWriteTraceRoundTrip(t *testing.T) {
	for _, w := range Workloads {
		c := DefaultGenConfig(w)
		c.Requests = 50
		reqs, err := Generate(c)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := WriteTrace(&buf, reqs); err != nil {
			t.Fatal(err)
		}
		back, bad, err := ParseTrace(&buf)
		if err != nil || len(bad) > 0 {
			t.Fatalf("%s: err %v bad %v", w, err, bad)
		}
		if len(back) != len(reqs) {
			t.Fatalf("%s: %d != %d", w, len(back), len(reqs))
		}
		for i := range back {
			if back[i].InputLength != reqs[i].InputLength || len(back[i].HashIDs) != len(reqs[i].HashIDs) {
				t.Fatalf("%s: request %d differs", w, i)
			}
		}
	}
}

// bench gen wrote lengths up to 1.5 x the mean past the reader's bound
// (--output-tokens 4000000: output_length up to 6,000,000 > 4,194,304) and
// lines past its 16 MiB bound; --trace then skipped them as bad lines. Now
// either the flags are refused or every line written reads back.
func TestGenNeverWritesWhatTheReaderSkips(t *testing.T) {
	f := func(name string, edit func(c *GenConfig), wantRefused string) {
		t.Helper()
		c := DefaultGenConfig(WorkloadUnique)
		c.Requests = 4
		edit(&c)
		reqs, err := Generate(c)
		if err != nil {
			if wantRefused == "" || !strings.Contains(err.Error(), wantRefused) {
				t.Fatalf("%s: %v, want refused naming %q", name, err, wantRefused)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteTrace(&buf, reqs); err != nil {
			if wantRefused == "" || !strings.Contains(err.Error(), wantRefused) {
				t.Fatalf("%s: %v, want refused naming %q", name, err, wantRefused)
			}
			if buf.Len() != 0 {
				t.Fatalf("%s: %d bytes written before the refusal", name, buf.Len())
			}
			return
		}
		back, bad, err := ParseTrace(&buf)
		if err != nil || len(bad) > 0 || len(back) != len(reqs) {
			t.Fatalf("%s: wrote %d requests, read back %d, bad lines %v, err %v", name, len(reqs), len(back), bad, err)
		}
		if wantRefused != "" {
			t.Fatalf("%s: accepted, want refused naming %q", name, wantRefused)
		}
	}
	f("output 4M", func(c *GenConfig) { c.OutputTokens = 4_000_000 }, "output-tokens")
	f("output at the bound", func(c *GenConfig) { c.OutputTokens = 2_796_202 }, "")
	f("unique prompt 3M", func(c *GenConfig) { c.PromptTokens = 3_000_000 }, "prompt-tokens")
	f("shared system 4M", func(c *GenConfig) {
		c.Workload, c.SystemPrompts, c.Users, c.SystemTokens, c.QuestionTokens = WorkloadShared, 1, 1, 4_000_000, 200_000
	}, "question-tokens")
	f("line over 16 MiB", func(c *GenConfig) { // 2.5M one-token blocks: about 21 MB of hash ids
		c.Workload, c.SystemPrompts, c.Users, c.Requests = WorkloadShared, 1, 1, 1
		c.SystemTokens, c.QuestionTokens, c.BlockTokens = 2_500_000, 100, 1
	}, "longer than")
}

func TestRealTraceParses(t *testing.T) {
	const path = "/work/shared/traces/mooncake_conversation_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skip("shared Mooncake trace not present")
	}
	reqs, bad, err := ReadTraceFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) < 10000 || len(bad) != 0 {
		t.Fatalf("got %d requests, %d bad lines", len(reqs), len(bad))
	}
}

func FuzzParseTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`))
	f.Add([]byte("{bad\n\n{\"timestamp\":1}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, _, err := ParseTrace(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if r.InputLength <= 0 || r.OutputLength <= 0 {
				t.Fatalf("invalid request accepted: %+v", r)
			}
		}
	})
}

func TestWarnOversized(t *testing.T) {
	var b strings.Builder
	lc := DefaultLoadConfig()
	lc.API = "completions" // the prompt as the trace says, no chat template
	reqs := []TraceRequest{{InputLength: 100, OutputLength: 28}, {InputLength: 1000, OutputLength: 24}}
	warnOversized(&b, reqs, &lc, 16, 8) // 8 and 64 blocks needed
	if !strings.Contains(b.String(), "1 of 2 requests") || !strings.Contains(b.String(), "at least 64") {
		t.Fatalf("warning %q", b.String())
	}
	b.Reset()
	warnOversized(&b, reqs, &lc, 16, 64)
	if b.Len() != 0 {
		t.Fatalf("unexpected warning %q", b.String())
	}
}

// The warning counts the prompt as the engines see it: with the chat
// template (13 tokens under the built-in tokenizer) a request of 100 + 28
// tokens needs 9 blocks of 16, not 8. It counted the trace's lengths, so on
// the Mooncake trace it said 545 requests would be refused where 546 were,
// and its "raise --kv-capacity-blocks to at least 7737" still left one
// request refused.
func TestWarnOversizedCountsTheChatTemplate(t *testing.T) {
	var b strings.Builder
	lc := DefaultLoadConfig()
	reqs := []TraceRequest{{InputLength: 100, OutputLength: 28}}
	warnOversized(&b, reqs, &lc, 16, 8)
	if !strings.Contains(b.String(), "1 of 1 requests") || !strings.Contains(b.String(), "at least 9") {
		t.Fatalf("a chat request of 100 + 28 tokens on engines of 8 blocks of 16: warning %q", b.String())
	}
}

// promptTokens is the length of the prompt render sends, for every API and
// --bytes-per-token.
func TestPromptTokensMatchesRender(t *testing.T) {
	for _, api := range []string{"chat", "completions"} {
		for _, bpt := range []int{0, 1, 2, 3, 4, 5, 7} {
			lc := DefaultLoadConfig()
			lc.API, lc.Prompt.BytesPerToken = api, bpt
			pr := newPromptRenderer(&lc)
			for _, in := range []int{1, 2, 3, 5, 100, 511, 512, 513, 2000} {
				r := TraceRequest{InputLength: in, OutputLength: 1, HashIDs: []int64{1, 2}}
				_, toks := pr.render(7, &r)
				if got := pr.promptTokens(&r); got != len(toks) {
					t.Fatalf("api %s, %d bytes per token, %d input tokens: promptTokens %d, render %d", api, bpt, in, got, len(toks))
				}
			}
		}
	}
}

// A line past the reader's bound was reported as "bad JSON: unexpected
// end of JSON input" (its first 16 MB, cut): the report now says what is
// wrong, with its line number and the bound, and the lines after it keep
// their numbers.
func TestParseTraceNamesALineTooLong(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`
	long := `{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [` + strings.Repeat("1, ", maxTraceLine/3) + `1]}`
	in := good + "\n" + long + "\n{bad\n" + good + "\n" + long // the last without a newline
	reqs, bad, err := ParseTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || len(bad) != 3 || bad[0].Line != 2 || bad[1].Line != 3 || bad[2].Line != 5 {
		t.Fatalf("got %d requests, bad lines %v", len(reqs), bad)
	}
	for _, i := range []int{0, 2} {
		if msg := bad[i].Error(); !strings.Contains(msg, "longer than 16777216 bytes") || strings.Contains(msg, "JSON") {
			t.Fatalf("bad line %d reported as %q", bad[i].Line, msg)
		}
	}
}

// bench gen --workload chat --question-tokens 4194304 (in the accepted
// range) spun forever writing nothing: every session's first turn was past
// the longest turn a session may have, so no session yielded a request and
// the generator never reached --requests. Such a value is refused; the
// largest one accepted generates.
func TestGenerateRefusesSessionsWhoseFirstTurnCannotFit(t *testing.T) {
	gen := func(w string, q int) error {
		t.Helper()
		c := DefaultGenConfig(w)
		c.Requests, c.QuestionTokens = 5, q
		done := make(chan error, 1)
		go func() {
			reqs, err := Generate(c)
			if err == nil && len(reqs) != c.Requests {
				err = fmt.Errorf("generated %d requests of %d", len(reqs), c.Requests)
			}
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("%s --question-tokens %d: Generate still running after 10s", w, q)
			return nil
		}
	}
	largest := (maxTraceTokens/2 - TraceBlockTokens) * 2 / 3
	for _, w := range []string{WorkloadChat, WorkloadAgent} {
		if err := gen(w, maxTraceTokens); err == nil || !strings.Contains(err.Error(), "question-tokens") {
			t.Fatalf("%s --question-tokens %d: %v, want a question-tokens error", w, maxTraceTokens, err)
		}
		if err := gen(w, largest); err != nil {
			t.Fatalf("%s --question-tokens %d: %v", w, largest, err)
		}
	}
}

// --question-tokens, --turns and --output-tokens take 0 for the
// workload's default; a negative value was taken as 0 without a word
// (bench gen --output-tokens -5 wrote answers of about 48 tokens).
func TestGenFlagsRefuseNegativeLengths(t *testing.T) {
	for _, cmd := range []string{"gen", "replay", "simulate", "compare"} {
		for _, flag := range []string{"--question-tokens", "--turns", "--output-tokens"} {
			var cli struct {
				Bench Cmd `cmd:""`
			}
			p, err := kong.New(&cli)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Parse([]string{"bench", cmd, flag + "=-5"}); err == nil || !strings.Contains(err.Error(), flag+" must not be negative") {
				t.Fatalf("bench %s %s=-5: %v", cmd, flag, err)
			}
			if _, err := p.Parse([]string{"bench", cmd, flag + "=0"}); err != nil {
				t.Fatalf("bench %s %s=0: %v", cmd, flag, err)
			}
		}
	}
}
