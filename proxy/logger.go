package proxy

import (
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/logx"
)

// serverLogger receives fasthttp's own log lines. Their arguments can hold
// raw request bytes (credentials included): only the format's fixed text
// before its first verb is logged, throttled. The one exception is a panic
// of a response body's writer (the relay, a converted stream), which
// fasthttp recovers and reports here as an error: its text is the runtime's
// or ours, not the client's, and without it a bug in the relay shows only
// as streams cut for no reason.
type serverLogger struct{}

var serverLog = &logx.Throttle{Every: 5 * time.Second}

func (serverLogger) Printf(format string, args ...any) {
	for _, a := range args {
		var p *fasthttp.ErrBodyStreamWritePanic
		if err, ok := a.(error); ok && errors.As(err, &p) {
			mBodyPanics.Inc()
			slog.Error("http server: a response body's writer panicked; the answer was cut", "err", p.Error())
			return
		}
	}
	mClientErrors.Inc()
	msg := format
	if i := strings.IndexByte(msg, '%'); i >= 0 {
		msg = msg[:i]
	}
	serverLog.Warn("http server: " + strings.TrimSpace(strings.TrimRight(msg, ": ")))
}
