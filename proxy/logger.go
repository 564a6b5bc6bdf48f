package proxy

import (
	"strings"
	"time"

	"github.com/infera/infera/internal/logx"
)

// serverLogger receives fasthttp's own log lines. Their arguments can hold
// raw request bytes (credentials included): only the format's fixed text
// before its first verb is logged, throttled.
type serverLogger struct{}

var serverLog = &logx.Throttle{Every: 5 * time.Second}

func (serverLogger) Printf(format string, args ...any) {
	mClientErrors.Inc()
	msg := format
	if i := strings.IndexByte(msg, '%'); i >= 0 {
		msg = msg[:i]
	}
	serverLog.Warn("http server: " + strings.TrimSpace(strings.TrimRight(msg, ": ")))
}
