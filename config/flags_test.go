package config

import "testing"

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
