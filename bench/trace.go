package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
)

// TraceBlockTokens is the number of tokens one Mooncake hash id stands for.
const TraceBlockTokens = 512

// TraceRequest is one request of a Mooncake-format trace.
type TraceRequest struct {
	// Timestamp is the arrival time in milliseconds from the trace start.
	Timestamp int64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int `json:"input_length"`
	// OutputLength is the number of tokens to generate.
	OutputLength int `json:"output_length"`
	// HashIDs holds one id per TraceBlockTokens-token prompt block;
	// requests sharing a leading run of ids share that prefix.
	HashIDs []int64 `json:"hash_ids"`
}

// LineError is a trace line that was skipped.
type LineError struct {
	Line int
	Err  error
}

func (e LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Limits on a trace line's values; larger values are rejected as bad lines.
const (
	maxTraceTokens = 1 << 22
	maxTraceLine   = 16 << 20
)

// maxScheduleMS bounds a workload's schedule: the time from its first
// request to its last, in ms, after --speedup, or a generated or Poisson
// schedule at --rate (about 31.7 years). Timestamps become time.Durations
// (ns, at most about 292 years), and simulated service times are added to
// them: a longer schedule overflowed, into negative times that sent every
// request at once.
const maxScheduleMS = 1e12

// ParseTrace reads a Mooncake JSONL trace from r. Bad lines are skipped and
// returned as LineErrors (1-based line numbers); blank lines are ignored.
// The returned requests are sorted by timestamp (stable). err is only set
// for read errors.
func ParseTrace(r io.Reader) (reqs []TraceRequest, bad []LineError, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	line := 0
	var buf []byte
	for {
		buf = buf[:0]
		var rerr error
		long := false // the line is longer than maxTraceLine: the rest is skipped
		for {
			chunk, isPrefix, e := br.ReadLine()
			if long || len(buf)+len(chunk) > maxTraceLine {
				long = true
			} else {
				buf = append(buf, chunk...)
			}
			if e != nil {
				rerr = e
				break
			}
			if !isPrefix {
				break
			}
		}
		if rerr != nil && rerr != io.EOF {
			return reqs, bad, fmt.Errorf("cannot read trace at line %d: %w", line+1, rerr)
		}
		if rerr == io.EOF && len(buf) == 0 && !long {
			break
		}
		line++
		if long {
			// Its start alone was no line to parse: it was reported as
			// bad JSON (unexpected end of input).
			bad = append(bad, LineError{Line: line, Err: fmt.Errorf("line longer than %d bytes (the longest a trace line may be)", maxTraceLine)})
		} else if b := bytes.TrimSpace(buf); len(b) > 0 {
			var tr TraceRequest
			if e := parseTraceLine(b, &tr); e != nil {
				bad = append(bad, LineError{Line: line, Err: e})
			} else {
				reqs = append(reqs, tr)
			}
		}
		if rerr == io.EOF {
			break
		}
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Timestamp < reqs[j].Timestamp })
	return reqs, bad, nil
}

func parseTraceLine(b []byte, tr *TraceRequest) error {
	if len(b) > maxTraceLine {
		return fmt.Errorf("line longer than %d bytes", maxTraceLine)
	}
	var raw struct {
		Timestamp    *float64 `json:"timestamp"`
		InputLength  *int     `json:"input_length"`
		OutputLength *int     `json:"output_length"`
		HashIDs      []int64  `json:"hash_ids"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("bad JSON: %w", err)
	}
	switch {
	case raw.Timestamp == nil:
		return fmt.Errorf("missing timestamp")
	case raw.InputLength == nil:
		return fmt.Errorf("missing input_length")
	case raw.OutputLength == nil:
		return fmt.Errorf("missing output_length")
	case *raw.Timestamp < 0 || *raw.Timestamp > 1e15:
		return fmt.Errorf("timestamp %v out of range", *raw.Timestamp)
	case *raw.InputLength <= 0 || *raw.InputLength > maxTraceTokens:
		return fmt.Errorf("input_length %d out of range (1..%d)", *raw.InputLength, maxTraceTokens)
	case *raw.OutputLength <= 0 || *raw.OutputLength > maxTraceTokens:
		return fmt.Errorf("output_length %d out of range (1..%d)", *raw.OutputLength, maxTraceTokens)
	}
	for _, id := range raw.HashIDs {
		if id < 0 {
			return fmt.Errorf("negative hash id %d", id)
		}
	}
	*tr = TraceRequest{
		Timestamp:    int64(*raw.Timestamp),
		InputLength:  *raw.InputLength,
		OutputLength: *raw.OutputLength,
		HashIDs:      raw.HashIDs,
	}
	return nil
}

// ReadTraceFile parses the trace at path (see ParseTrace).
func ReadTraceFile(path string) ([]TraceRequest, []LineError, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot open trace: %w", err)
	}
	defer f.Close()
	reqs, bad, err := ParseTrace(f)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot parse trace %q: %w", path, err)
	}
	return reqs, bad, nil
}

// appendTraceLine appends r as one Mooncake JSONL line, without the newline.
func appendTraceLine(line []byte, r *TraceRequest) []byte {
	line = fmt.Appendf(line, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [`, r.Timestamp, r.InputLength, r.OutputLength)
	for j, id := range r.HashIDs {
		if j > 0 {
			line = append(line, ", "...)
		}
		line = strconv.AppendInt(line, id, 10)
	}
	return append(line, "]}"...)
}

// WriteTrace writes reqs as Mooncake JSONL. It refuses, before writing
// anything, a request ParseTrace would skip as a bad line (a length out of
// range, a line longer than maxTraceLine, ...): a trace it writes reads back
// whole.
func WriteTrace(w io.Writer, reqs []TraceRequest) error {
	var line []byte
	for i := range reqs {
		line = appendTraceLine(line[:0], &reqs[i])
		var tr TraceRequest
		if err := parseTraceLine(line, &tr); err != nil {
			return fmt.Errorf("cannot write trace: request %d (timestamp %d ms) would be skipped by the trace reader: %w", i, reqs[i].Timestamp, err)
		}
	}
	bw := bufio.NewWriter(w)
	for i := range reqs {
		line = append(appendTraceLine(line[:0], &reqs[i]), '\n')
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("cannot write trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("cannot write trace: %w", err)
	}
	return nil
}

// ScaleTrace returns reqs with timestamps divided by speedup (> 0), capped to
// maxRequests (> 0) and to requests arriving within duration ms (> 0) after
// scaling. The input is not modified.
func ScaleTrace(reqs []TraceRequest, speedup float64, maxRequests int, durationMS int64) []TraceRequest {
	out := make([]TraceRequest, 0, len(reqs))
	var t0 int64
	if len(reqs) > 0 {
		t0 = reqs[0].Timestamp
	}
	for _, r := range reqs {
		if maxRequests > 0 && len(out) >= maxRequests {
			break
		}
		ts := r.Timestamp - t0
		if speedup > 0 {
			ts = int64(float64(ts) / speedup)
		}
		if durationMS > 0 && ts >= durationMS {
			break // the run ends at durationMS: a request due then is not sent
		}
		r.Timestamp = ts
		out = append(out, r)
	}
	return out
}
