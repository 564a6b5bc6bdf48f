package admin

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// FuzzImport feeds arbitrary uploads to the import parser: it must never
// panic, and whatever it accepts must be a valid config that survives a
// write-back round trip.
func FuzzImport(f *testing.F) {
	seal := newSealer("", testKey)
	c := config.Default()
	c.Canary = config.Canary{Enabled: true, Rules: []config.CanaryRule{{Model: "*", Targets: []config.CanaryTarget{{Service: "a", Weight: 1}}}}}
	good, err := seal.encodeSnapshot(c, 3, kindManual, time.Unix(0, 0))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"format":"infera-snapshot","format_version":1,"config":{"split_proxy":{"proxies":[{"api_key":"enc:v1:AAAA"}]}}}`))
	f.Add([]byte(`{"format":"infera-snapshot","format_version":1,"config":{"workers":[{"url":"http://x","block_size":1e3}]}}`))
	f.Add([]byte(`{"format":"infera-snapshot","format_version":1,"sha256":"00","config":{}}`))
	f.Add([]byte(`{"format":"infera-snapshot","format_version":1,"config":{"users":[{"name":"a","keys":["ifr1$x"]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, _, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		c, err := seal.parseConfig(cfg, nil)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
		out, err := config.MarshalFile(c)
		if err != nil {
			t.Fatalf("accepted config does not encode: %v", err)
		}
		if _, err := config.Parse(out); err != nil {
			t.Fatalf("accepted config does not parse back: %v\n%s", err, out)
		}
	})
}

// FuzzSectionWrite applies arbitrary bodies as PUT and PATCH of a section:
// the typed walk and the parser must never panic, and an error must name a
// path inside the section (or none).
func FuzzSectionWrite(f *testing.F) {
	f.Add("session_affinity", []byte(`{"enabled":true,"ttl_s":-1}`), false)
	f.Add("canary", []byte(`{"rules":[{"model":"*","targets":[{"service":"a","weight":"x"}]}]}`), true)
	f.Add("split_proxy", []byte(`{"proxies":[{"api_key":"***deadbeef"},{"api_key":"***"}]}`), false)
	f.Add("workers", []byte(`[{"url":"http://a","models":[1]}]`), false)
	f.Add("user_limit", []byte(`{"templates":[{"name":"t","periods":{"segments":[{"days":["xyz"]}]}}]}`), true)
	f.Add("users", []byte(`[{"name":"u","keys":[null]}]`), false)
	seal := newSealer("", testKey)
	cur := config.Default()
	base, err := encodeClear(cur)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, section string, body []byte, patch bool) {
		if !isSection(section) {
			return
		}
		in, err := decodeAny(body)
		if err != nil {
			return
		}
		doc, err := decodeDoc(base)
		if err != nil {
			t.Fatal(err)
		}
		if patch {
			doc[section] = mergePatch(doc[section], in)
		} else {
			doc[section] = in
		}
		c, err := seal.parseDoc(doc, cur)
		if err != nil {
			var fe *config.FieldError
			if e, ok := err.(*config.FieldError); ok {
				fe = e
			}
			if fe == nil {
				t.Fatalf("not a FieldError: %T %v", err, err)
			}
			return
		}
		if _, err := json.Marshal(c); err != nil {
			t.Fatal(err)
		}
	})
}
