package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// KongOptions are the parser options every infera command uses: durations
// accept Go syntax ("90s", "15m") and plain seconds ("900", "0.5"), as the
// routing doc writes them (INFERA_NATS_REQ_IDLE_TIMEOUT=900).
func KongOptions() []kong.Option {
	return []kong.Option{kong.TypeMapper(reflect.TypeOf(time.Duration(0)), durationMapper{})}
}

type durationMapper struct{}

func (durationMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	var s string
	if err := ctx.Scan.PopValueInto("duration", &s); err != nil {
		return err
	}
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	target.SetInt(int64(d))
	return nil
}

// ParseDuration parses a Go duration or a plain number of seconds. Values
// that do not fit time.Duration are refused.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || f > MaxSeconds {
			return 0, fmt.Errorf("duration %q: want 0..%g seconds", s, float64(MaxSeconds))
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want seconds (900) or a Go duration (15m)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %q must not be negative", s)
	}
	return d, nil
}
