package config

import (
	"math"
	"strings"
	"testing"
	"time"
)

// --cors-allow-origins takes serialized origins (scheme://host[:port]) or
// *; a path, a query, credentials or another scheme is refused at start.
// --tls-cert-file and --tls-key-file go together.
func TestServeFlagsRefuseBadOriginsAndHalfATLSPair(t *testing.T) {
	base := func() *Serve {
		return &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16}
	}
	for _, o := range []string{"https://app.example.com", "http://127.0.0.1:3000", "*", "https://[::1]:8443"} {
		f := base()
		f.CORSAllowOrigins = []string{o}
		if err := f.Validate(); err != nil {
			t.Fatalf("%q refused: %v", o, err)
		}
	}
	for _, o := range []string{"app.example.com", "https://app.example.com/", "https://app.example.com/x", "ftp://a.example",
		"https://u:p@app.example.com", "https://app.example.com?q", "null", ""} {
		f := base()
		f.CORSAllowOrigins = []string{o}
		if err := f.Validate(); err == nil {
			t.Fatalf("%q accepted", o)
		}
	}
	f := base()
	f.TLSCertFile = "cert.pem"
	if err := f.Validate(); err == nil {
		t.Fatal("a certificate without a key accepted")
	}
}

// --kv-block-size must be a positive token count: 0 or a negative one was
// accepted at start and hashed prompts into blocks no engine reports.
func TestServeFlagsRefuseABadKVBlockSize(t *testing.T) {
	for _, n := range []int{0, -4, 1 << 20} {
		f := &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: n}
		if err := f.Validate(); err == nil {
			t.Errorf("--kv-block-size %d accepted", n)
		}
	}
}

// The NATS request controls refuse negative values at start, as the
// worker's flags and --request-max-retries do (-1 was accepted).
func TestServeFlagsRefuseNegativeNATSRequestControls(t *testing.T) {
	base := func() *Serve {
		return &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16}
	}
	for _, f := range []func(s *Serve){
		func(s *Serve) { s.NatsReqMaxPending = -1 },
		func(s *Serve) { s.NatsReqIdleTimeout = -time.Second },
		func(s *Serve) { s.NatsReqMaxDuration = -time.Second },
	} {
		s := base()
		f(s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "--nats-req") {
			t.Errorf("accepted: %v", err)
		}
	}
	if err := base().Validate(); err != nil {
		t.Fatal(err)
	}
}

// NaN and Inf are refused for every number flag of the router: NaN passes
// every comparison, and --kv-overlap-weight=Inf (or NaN) was accepted and
// routed as 0, on predicted time to first token alone.
func TestServeFlagsRefuseNaNAndInf(t *testing.T) {
	base := func() *Serve {
		return &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16}
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		for name, f := range map[string]func(s *Serve){
			"--kv-overlap-weight":      func(s *Serve) { s.KVOverlapWeight = v },
			"--kv-load-bound":          func(s *Serve) { s.KVLoadBound = v },
			"--router-temperature":     func(s *Serve) { s.RouterTemperature = v },
			"--breaker-cooldown-s":     func(s *Serve) { s.BreakerCooldownS = v },
			"--breaker-max-cooldown-s": func(s *Serve) { s.BreakerMaxCooldownS = v },
		} {
			s := base()
			f(s)
			if err := s.Validate(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s %v: %v", name, v, err)
			}
		}
	}
}

// A negative value of a setting that must be positive is told "must be
// positive": "must be >= 0" sent the user to 0, refused next.
func TestANegativeValueOfAPositiveSettingIsToldItMustBePositive(t *testing.T) {
	if err := seconds("x", -5, true); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Fatalf("positive: %v", err)
	}
	if err := seconds("x", -5, false); err == nil || !strings.Contains(err.Error(), "must be >= 0") {
		t.Fatalf("non-negative: %v", err)
	}
}

// --state-end-delay is bounded: lease renewals of the seats a router holds
// in Redis wait with the ends, so a delay near the lease TTL (15 s) would
// let them lapse while the requests still run; a negative one is refused
// too.
func TestServeFlagsRefuseAStateEndDelayPastOneSecond(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, MaxStateEndDelay + time.Millisecond, 14 * time.Second} {
		f := &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16, StateEndDelay: d}
		if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "--state-end-delay") {
			t.Errorf("--state-end-delay %v accepted: %v", d, err)
		}
	}
	for _, d := range []time.Duration{0, 2 * time.Millisecond, MaxStateEndDelay} {
		f := &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16, StateEndDelay: d}
		if err := f.Validate(); err != nil {
			t.Errorf("--state-end-delay %v refused: %v", d, err)
		}
	}
}

// --trusted-proxies takes IP addresses and CIDR networks of either family;
// anything else refuses the start with a message naming the flag and the
// entry.
func TestServeFlagsRefuseMalformedTrustedProxies(t *testing.T) {
	base := func(list ...string) *Serve {
		return &Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16,
			TrustedProxies: list}
	}
	if err := base("10.0.0.0/8", " 192.0.2.7", "2001:db8::/32", "::1", "").Validate(); err != nil {
		t.Fatalf("good list refused: %v", err)
	}
	for _, bad := range []string{"lb.internal", "10.0.0.1/8", "10.0.0", "fe80::1%eth0", "10.0.0.0/33", "[::1]", "10.0.0.1:80"} {
		err := base("10.0.0.0/8", bad).Validate()
		if err == nil || !strings.Contains(err.Error(), "--trusted-proxies") || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: %v; want an error naming --trusted-proxies and the entry", bad, err)
		}
	}
}

// --max-inflight-body-bytes below --max-body-bytes is refused at start: a
// body between the two can never be read (the budget is all requests'
// bodies together), yet it was accepted and every such body got 503
// "overloaded; retry later", which the SDKs retry, uploading it again.
func TestServeFlagsRefuseABodyBudgetBelowTheBodyLimit(t *testing.T) {
	f := &Serve{Port: 8000, MaxBodyBytes: 2000, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1000, KVBlockSize: 16}
	err := f.Validate()
	if err == nil || !strings.Contains(err.Error(), "--max-inflight-body-bytes") || !strings.Contains(err.Error(), "--max-body-bytes") {
		t.Fatalf("a budget of 1000 bytes under --max-body-bytes 2000: %v", err)
	}
	f.MaxInflightBodyBytes = 2000
	if err := f.Validate(); err != nil {
		t.Fatalf("a budget as large as --max-body-bytes refused: %v", err)
	}
}
