package config

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// Parse takes whatever a hand edit, a half-written file or an admin import
// puts in the config file: it never panics, and what it accepts survives
// the round trip the admin API makes (MarshalFile, then Parse again) and
// renders the same the second time.
func FuzzParse(f *testing.F) {
	full, err := MarshalFile(Default())
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"", "null", "[]", "{}", "{} {}", `{"workers":[]}garbage`, "{", "\xff{}",
		string(full),
		`{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":["m"],"role":"prefill","bootstrap_port":8998}],"pd":{"mode":"sglang"}}`,
		`{"timeouts":{"non_stream_total_s":9.3e9}}`, `{"session_affinity":{"ttl_s":1e300}}`,
		`{"load_balancing":{"algorithm":"LEAST-TOKENS"},"session_affinity":{"mode":"Soft"}}`,
		`{"canary":{"rules":[{"model":"*","targets":[{"service":"a","weight":0}]}]}}`,
		`{"split_proxy":{"enabled":true,"proxies":[{"name":"x","url":"http://127.0.0.1:9","api_key":"sk-secret","models":["gpt-*"]}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tm := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("HANG %q", data)) })
		defer tm.Stop()
		c, err := Parse(data)
		if err != nil {
			if c != nil {
				t.Fatalf("a config with the error %v", err)
			}
			return
		}
		out, err := MarshalFile(c)
		if err != nil {
			t.Fatalf("accepted config does not render: %v", err)
		}
		c2, err := Parse(out)
		if err != nil {
			t.Fatalf("rendered config refused: %v\n%s", err, out)
		}
		out2, err := MarshalFile(c2)
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the config (%v):\n%s\n---\n%s", err, out, out2)
		}
	})
}
