package mirror

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/infera/infera/upstream"
)

// MirrorHeader is set ("1") on every mirrored request, so the target can
// tell mirrored traffic from its own.
const MirrorHeader = "X-Infera-Mirror"

// result is what one mirrored request gave.
type result struct {
	status           int
	err              error
	timedOut         bool
	ttfe             time.Duration // first SSE event (streams) or response headers
	bytes            int64
	events           int
	usage            bool
	prompt, complete int
}

// sendHTTP sends one job to the target and reads the answer to its end.
func (m *Mirror) sendHTTP(j *job) {
	cfg := j.cfg
	deadline := j.at.Add(millis(cfg.TimeoutMS))
	ctx, cancel := context.WithDeadline(m.ctx, deadline)
	defer cancel()
	var res result
	start := time.Now()
	m.do(ctx, j, &res)
	end := time.Now()
	if res.err != nil && (ctx.Err() == context.DeadlineExceeded || errors.Is(res.err, context.DeadlineExceeded)) {
		res.timedOut = true
	}
	if m.ctx.Err() != nil && !res.timedOut && res.err != nil {
		return // shut down: not the target's fault, nothing to record
	}
	m.m.duration.UpdateDuration(j.at)
	switch {
	case res.timedOut:
		m.m.timeout.Inc()
	case res.err != nil:
		m.m.failed.Inc()
	case res.status >= 200 && res.status < 300:
		m.m.ok.Inc()
	default:
		m.m.httpError.Inc()
	}
	if res.usage {
		m.m.promptTokens.Add(res.prompt)
		m.m.completionTokens.Add(res.complete)
	}
	if !cfg.LogRecording {
		if res.err != nil && !res.timedOut {
			m.warn.Warn("mirror: request failed", "err", describe(res.err))
		}
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs,
		slog.Uint64("id", m.seq.Add(1)),
		slog.String("path", safePath(j.path)),
		slog.Bool("stream", j.stream),
		slog.String("target_model", cfg.TargetModel),
		slog.Int("status", res.status),
		slog.String("result", resultName(&res)),
		slog.Float64("queue_ms", ms(start.Sub(j.at))),
		slog.Float64("latency_ms", ms(end.Sub(start))),
		slog.Float64("first_event_ms", ms(res.ttfe)),
		slog.Int64("response_bytes", res.bytes),
		slog.Bool("usage", res.usage),
		slog.Int("prompt_tokens", res.prompt),
		slog.Int("completion_tokens", res.complete),
	)
	if j.stream {
		attrs = append(attrs, slog.Int("events", res.events))
	}
	if res.err != nil {
		attrs = append(attrs, slog.String("err", describe(res.err)))
	}
	m.log.LogAttrs(context.Background(), slog.LevelInfo, "mirror", attrs...)
}

func resultName(r *result) string {
	switch {
	case r.timedOut:
		return "timeout"
	case r.err != nil:
		return "error"
	case r.status >= 200 && r.status < 300:
		return "ok"
	}
	return "http_error"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// do builds the mirrored request from the allowed headers only, sends it
// and consumes the answer.
func (m *Mirror) do(ctx context.Context, j *job, res *result) {
	cfg := j.cfg
	ep, err := m.endpoint(cfg.TargetAddress)
	if err != nil {
		res.err = localError("invalid mirror.target_address")
		return
	}
	body := j.body
	if cfg.TargetModel != "" {
		j.scratch = replaceModel(j.scratch[:0], j.body, cfg.TargetModel)
		body = j.scratch
	}
	target := string(ep.AppendURL(nil, j.path))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		res.err = errInvalidPath
		return
	}
	// The whole header list: nothing from the client.
	h := req.Header
	h.Set("Content-Type", "application/json")
	if j.stream {
		h.Set("Accept", "text/event-stream")
	} else {
		h.Set("Accept", "application/json")
	}
	h.Set("User-Agent", "infera-mirror")
	h.Set(MirrorHeader, "1")
	if cfg.AuthToken.IsSet() {
		h.Set("Authorization", string(cfg.AuthToken.AppendBearer(nil)))
	}
	start := time.Now()
	resp, err := m.client.Do(req)
	if err != nil {
		res.err = unwrapURLError(err)
		return
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.ttfe = time.Since(start)
	if j.stream && resp.StatusCode == http.StatusOK {
		m.readStream(resp.Body, start, res)
	} else {
		m.readBody(resp.Body, res)
	}
}

// readBody reads a whole answer (keeping at most MaxResponseBytes) and
// takes the usage from it.
func (m *Mirror) readBody(r io.Reader, res *result) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, int64(m.opts.MaxResponseBytes)))
	res.bytes = n
	if err == nil {
		var rest int64
		rest, err = io.Copy(io.Discard, r)
		res.bytes += rest
	}
	if err != nil {
		res.err = unwrapURLError(err)
		return
	}
	scanUsage(buf.Bytes(), res)
}

// readStream reads an SSE answer to its end (the connection is released
// only then), counting events and taking the usage of the last chunk that
// carries one.
func (m *Mirror) readStream(r io.Reader, start time.Time, res *result) {
	br := bufio.NewReaderSize(r, 16<<10)
	first := true
	var long []byte // a line longer than the buffer, reassembled (bounded)
	for {
		line, err := br.ReadSlice('\n')
		res.bytes += int64(len(line))
		if err == bufio.ErrBufferFull {
			if len(long) < m.opts.MaxResponseBytes {
				long = append(long, line...)
			}
			continue
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if first {
				res.ttfe = time.Since(start)
				first = false
			}
			res.events++
			if bytes.Contains(data, []byte(`"usage"`)) {
				scanUsage(data, res)
			}
		}
		if err != nil {
			if err != io.EOF {
				res.err = unwrapURLError(err)
			}
			return
		}
	}
}

// scanUsage decodes the top-level "usage" of an OpenAI answer or chunk.
func scanUsage(b []byte, res *result) {
	var v struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &v) != nil || v.Usage == nil || v.Usage.PromptTokens < 0 || v.Usage.CompletionTokens < 0 {
		return
	}
	res.usage = true
	res.prompt, res.complete = v.Usage.PromptTokens, v.Usage.CompletionTokens
}

// localError is an error of the mirror itself (not from the network):
// its text is safe to log.
type localError string

func (e localError) Error() string { return string(e) }

const errInvalidPath = localError("invalid request path")

// describe is the log form of a request error.
func describe(err error) string {
	var le localError
	if errors.As(err, &le) {
		return le.Error()
	}
	return upstream.DescribeError(err)
}

// unwrapURLError drops *url.Error's "Post <url>:" prefix: the URL holds
// the client's path, and the cause is what matters.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// safePath returns the request path for a log line: at most 128 bytes of
// [A-Za-z0-9/._-], anything else as '?' (raw client bytes never reach a
// log line).
func safePath(p []byte) string {
	if len(p) > 128 {
		p = p[:128]
	}
	b := make([]byte, len(p))
	for i, c := range p {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '.' || c == '_' || c == '-' {
			b[i] = c
		} else {
			b[i] = '?'
		}
	}
	return string(b)
}
