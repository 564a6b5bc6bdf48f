package govern

import (
	"errors"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func TestGovernanceSettingsAreValidatedWithTheirPath(t *testing.T) {
	f := func(js, wantPath string) {
		t.Helper()
		_, err := config.Parse([]byte(js))
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Path != wantPath {
			t.Fatalf("%s: got %v, want an error at %s", js, err, wantPath)
		}
	}
	f(`{"rate_limit":{"scope":"pod"}}`, "rate_limit.scope")
	f(`{"rate_limit":{"overlimit":"wait"}}`, "rate_limit.overlimit")
	f(`{"rate_limit":{"prefill_concurrency":-1}}`, "rate_limit.prefill_concurrency")
	f(`{"rate_limit":{"overlimit":"queue","queue_size":0,"queue_timeout_ms":10}}`, "rate_limit.queue_size")
	f(`{"rate_limit":{"overlimit":"queue","queue_size":5,"queue_timeout_ms":0}}`, "rate_limit.queue_timeout_ms")
	f(`{"rate_limit":{"on_state_error":"maybe"}}`, "rate_limit.on_state_error")
	f(`{"user_limit":{"timezone":"Mars/Olympus"}}`, "user_limit.timezone")
	f(`{"user_limit":{"metrics_max_users":-1}}`, "user_limit.metrics_max_users")
	f(`{"user_limit":{"templates":[{"name":"a","default":true},{"name":"b","default":true}]}}`, "user_limit.templates[1].default")
	f(`{"user_limit":{"templates":[{"name":"a"},{"name":"a"}]}}`, "user_limit.templates[1].name")
	f(`{"user_limit":{"templates":[{}]}}`, "user_limit.templates[0].name")
	f(`{"user_limit":{"templates":[{"name":"a","periods":{"segments":[{"start":"22:00","end":"02:00"}]}}]}}`, "user_limit.templates[0].periods.segments[0].end")
	f(`{"user_limit":{"templates":[{"name":"a","periods":{"segments":[{"start":"24:00","end":"23:00"}]}}]}}`, "user_limit.templates[0].periods.segments[0].start")
	f(`{"user_limit":{"templates":[{"name":"a","periods":{"segments":[{"days":["funday"],"start":"01:00","end":"02:00"}]}}]}}`, "user_limit.templates[0].periods.segments[0].days[0]")
	f(`{"user_limit":{"templates":[{"name":"a","quota":{"windows":[{"period":"hour"}]}}]}}`, "user_limit.templates[0].quota.windows[0].period")
	f(`{"user_limit":{"templates":[{"name":"a","quota":{"windows":[{"period":"day"},{"period":"day"}]}}]}}`, "user_limit.templates[0].quota.windows[1].period")
	f(`{"user_limit":{"templates":[{"name":"a","quota":{"windows":[{"period":"day","max_tokens":-5}]}}]}}`, "user_limit.templates[0].quota.windows[0].max_tokens")
	f(`{"user_limit":{"templates":[{"name":"a","quota":{"weights":{"input":-1}}}]}}`, "user_limit.templates[0].quota.weights.input")
	f(`{"user_limit":{"templates":[{"name":"a","concurrency":{"enabled":true}}]}}`, "user_limit.templates[0].concurrency.limit")
	f(`{"user_limit":{"templates":[{"name":"a","concurrency":{"overlimit":"queue","queue_size":0}}]}}`, "user_limit.templates[0].concurrency.queue_size")
	f(`{"user_limit":{"templates":[{"name":"a","rate":{"rpm":-1}}]}}`, "user_limit.templates[0].rate.rpm")
	f(`{"user_limit":{"templates":[{"name":"a","rate":{"bogus":1}}]}}`, "user_limit.templates[0].rate.bogus")

	// Defaults of omitted template fields, and a disabled capability keeps its settings.
	c, err := config.Parse([]byte(`{"user_limit":{"templates":[{"name":"a","rate":{"enabled":false,"rpm":5}}]},"users":[{"name":"u"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	tm := c.UserLimit.Templates[0]
	if tm.Rate.RPM != 5 || tm.Rate.DefaultOutputTokens != 1024 || tm.Quota.Weights != (config.TokenWeights{Input: 1, Output: 1, Cached: 1}) ||
		tm.Concurrency.Overlimit != "reject" || tm.Concurrency.QueueSize != 100 || tm.Concurrency.QueueTimeoutMS != 30000 || !c.Users[0].Enabled {
		t.Fatalf("defaults: %+v %+v", tm, c.Users[0])
	}
	// The documented defaults of the sections validate.
	d := config.Default()
	d.RateLimit, d.UserLimit = config.DefaultRateLimit(), config.DefaultUserLimit()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	// A config marshalled back to the file parses to the same thing.
	b, err := config.MarshalFile(c)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := config.Parse(b)
	if err != nil || c2.UserLimit.Templates[0].Rate != tm.Rate {
		t.Fatalf("round trip: %v", err)
	}
}

// "Local" is no IANA zone: time.LoadLocation takes it as the host's zone,
// so the windows and periods followed the process's TZ (a router started
// with TZ=Asia/Tokyo began its day at 15:00 UTC, one beside it at 00:00).
func TestTheTimezoneLocalIsRefused(t *testing.T) {
	_, err := config.Parse([]byte(`{"user_limit":{"timezone":"Local"}}`))
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Path != "user_limit.timezone" {
		t.Fatalf("got %v, want an error at user_limit.timezone", err)
	}
	for _, tz := range []string{"", "UTC", "Europe/Berlin"} {
		if _, err := config.Parse([]byte(`{"user_limit":{"timezone":"` + tz + `"}}`)); err != nil {
			t.Fatalf("%q: %v", tz, err)
		}
	}
}

func TestPerUserSeriesAreBounded(t *testing.T) {
	_, h1 := mintKey(t)
	_, h2 := mintKey(t)
	c := parseConfig(t, `{"user_limit":{"metrics_max_users":1},"users":[{"name":"a","keys":["`+h1+`"]},{"name":"b","keys":["`+h2+`"]}]}`)
	g := newGov(t, Options{}, c)
	names := g.userSet.ListMetricNames()
	if len(names) != 3 {
		t.Fatalf("series %v, want the 3 of user a", names)
	}
	for _, n := range names {
		if !strings.Contains(n, `user="a"`) {
			t.Fatalf("series %s", n)
		}
	}
	// Reordering moves the series to the new first user.
	c.Users[0], c.Users[1] = c.Users[1], c.Users[0]
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	for _, n := range g.userSet.ListMetricNames() {
		if !strings.Contains(n, `user="b"`) {
			t.Fatalf("series %s after reorder", n)
		}
	}
}
