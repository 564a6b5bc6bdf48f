package upstream

import "testing"

func TestEndpointJoinsPathsWithoutDoublingV1(t *testing.T) {
	f := func(base, path, wantURL, wantAddr string) {
		t.Helper()
		e, err := ParseEndpoint(base)
		if err != nil {
			t.Fatalf("ParseEndpoint(%q): %v", base, err)
		}
		if got := e.URL(path); got != wantURL {
			t.Fatalf("%q + %q = %q, want %q", base, path, got, wantURL)
		}
		if e.Addr != wantAddr {
			t.Fatalf("%q: addr %q, want %q", base, e.Addr, wantAddr)
		}
	}
	f("http://127.0.0.1:8000", "/v1/chat/completions", "http://127.0.0.1:8000/v1/chat/completions", "127.0.0.1:8000")
	f("http://127.0.0.1:8000/", "/v1/chat/completions", "http://127.0.0.1:8000/v1/chat/completions", "127.0.0.1:8000")
	f("https://api.example.com/v1", "/v1/chat/completions", "https://api.example.com/v1/chat/completions", "api.example.com:443")
	f("https://api.example.com/v1/", "/v1/completions", "https://api.example.com/v1/completions", "api.example.com:443")
	f("https://x.example.com/compatible-mode/v1", "/v1/chat/completions", "https://x.example.com/compatible-mode/v1/chat/completions", "x.example.com:443")
	f("https://x.example.com/openai", "/v1/chat/completions", "https://x.example.com/openai/v1/chat/completions", "x.example.com:443")
	f("http://x.example.com/v1", "/v10/x", "http://x.example.com/v1/v10/x", "x.example.com:80")
	f("http://x.example.com/v1", "/v1", "http://x.example.com/v1", "x.example.com:80")
	f("http://[::1]:9/p", CapacityPath, "http://[::1]:9/p/infera/v1/capacity", "[::1]:9")
	f("http://h", "x", "http://h/x", "h:80")
	// A member given as an OpenAI-style base URL has its capacity endpoint
	// at the gateway's root (it polled /v1/infera/v1/capacity: 404, and the
	// member was never used).
	for base, want := range map[string]string{
		"http://127.0.0.1:8000/v1":      "http://127.0.0.1:8000/infera/v1/capacity",
		"http://127.0.0.1:8000/v1/":     "http://127.0.0.1:8000/infera/v1/capacity",
		"http://127.0.0.1:8000":         "http://127.0.0.1:8000/infera/v1/capacity",
		"https://gw.example.com/eu/v1":  "https://gw.example.com/eu/infera/v1/capacity",
		"https://gw.example.com/eu/v10": "https://gw.example.com/eu/v10/infera/v1/capacity",
	} {
		e, err := ParseEndpoint(base)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.RootURL(CapacityPath); got != want {
			t.Fatalf("RootURL of %q: %q, want %q", base, got, want)
		}
	}
	for _, bad := range []string{"", "ftp://x", "http://", "http://u:p@x", "http://x?q=1", "http://x#f", "://x"} {
		if _, err := ParseEndpoint(bad); err == nil {
			t.Fatalf("ParseEndpoint(%q) accepted", bad)
		}
	}
}
