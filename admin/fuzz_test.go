package admin

import (
	"bytes"
	"encoding/json"
	"reflect"
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

// parseDecoded is parseRefs as it was before it walked the bytes: the
// document decoded as generic JSON, its secrets replaced by walkDoc, the
// map encoded again for config.Parse. The model FuzzParseAgreesWithTheDecodedWalk
// holds parseRefs to.
func parseDecoded(s *sealer, data []byte, cur, refs *config.Config) (*config.Config, error) {
	doc, err := decodeDoc(data)
	if err != nil {
		return nil, err
	}
	take := secretTaker{s: s, cur: cur, refs: refs, held: newHeldSecrets()}
	resolved, err := walkDoc(doc, reflect.TypeFor[config.Config](), "", func(path string, t reflect.Type, v any) (any, error) {
		str, ok := v.(string)
		if t != secretType || !ok {
			return v, nil
		}
		return take.secret(path, str)
	})
	if err != nil {
		return nil, err
	}
	data2, _ := json.Marshal(resolved)
	c, err := config.Parse(data2)
	if err != nil {
		again, derr := decodeDoc(data2)
		if derr != nil {
			return nil, err
		}
		return nil, refineError(again, err)
	}
	if len(take.held.byKey) > 0 {
		if err := take.held.resolve(s, c, cur, refs); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// FuzzParseAgreesWithTheDecodedWalk holds parseRefs, which finds the
// secrets in the document's bytes and decodes it once, to the generic
// walk it replaced (parseDecoded): on any config document without a
// repeated key (an import's and a snapshot's were refused before), both
// accept it with the same config or both refuse it.
func FuzzParseAgreesWithTheDecodedWalk(f *testing.F) {
	seal := newSealer("", testKey)
	cur := config.Default()
	cur.SplitProxy.Proxies = []config.Proxy{{Local: true, Name: "local", Weight: 1}, {Name: "a", Address: "http://127.0.0.1:9", APIKey: config.NewSecret("sk-aaa"), Weight: 1}}
	cur.SplitProxy.Enabled = true
	red := seal.redacted("sk-aaa")
	sealed, _ := seal.seal("split_proxy.proxies/a", "http://127.0.0.1:9", "sk-aaa")
	carried := carrier.seal("mirror", "http://m", "sk-m")
	for _, d := range []string{
		`{}`,
		`{"split_proxy":{"enabled":true,"proxies":[{"name":"local","local":true,"weight":1},{"name":"a","address":"http://127.0.0.1:9","api_key":"` + red + `","weight":1}]}}`,
		`{"split_proxy":{"enabled":true,"proxies":[{"name":"local","local":true,"weight":1},{"name":"a","address":"http://127.0.0.1:9","API_KEY":"` + sealed + `","weight":1}]}}`,
		`{"mirror":{"enabled":true,"target_address":"http://m","auth_token":"` + carried + `"}}`,
		`{"mirror":{"target_address":"http://m","auth_token":"env:HOME"},"users":[{"name":"u","keys":[]}]}`,
		`{"mirror":{"auth_token":7},"workers":[{"url":"http://x"}]}`,
		`{"global_scheduling":{"members":[{"name":"m","url":"http://m","api_key":"k"}]},"smart_model_selection":{"classifier_api_key":"***"}}`,
		`{"Mirror":{"Auth_Token":"x"},"mirror":{"auth_token":"y"}}`,
		`{"split_proxy":{"proxies":{"a":1}},"mirror":{"auth_token":"env:HOME"}}`,
		`{"split_proxy":{"proxies":[null,{"api_key":null}]}}`,
	} {
		f.Add([]byte(d), false)
		f.Add([]byte(d), true)
	}
	// Not UTF-8 in a string: encoding/json reads U+FFFD, jsonscan refuses it.
	f.Add([]byte("{\"\":{\"0\":[{\"0\":\"\xff\"}]}}"), false)
	f.Add([]byte("{\"users\":[{\"name\":\"u\",\"models\":[\"m\xc3\x28\xff\"]}],\"mirror\":{\"auth_token\":\"k\xff\"}}"), true)
	f.Fuzz(func(t *testing.T, data []byte, withCur bool) {
		if !json.Valid(data) || config.RepeatedKey(data, "") != nil {
			return
		}
		var c0 *config.Config
		if withCur {
			c0 = cur
		}
		a, errA := parseDecoded(seal, data, c0, c0)
		var b *config.Config
		errB := checkObject(data)
		if errB == nil {
			b, errB = seal.parseRefs(data, c0, c0)
		}
		if (errA == nil) != (errB == nil) {
			t.Fatalf("%s (cur %v): decoded walk %v, parseRefs %v", data, withCur, errA, errB)
		}
		if errA != nil {
			return
		}
		ea, _ := encodeClear(a)
		eb, _ := encodeClear(b)
		if !bytes.Equal(ea, eb) {
			t.Fatalf("%s: configs differ\n%s\n%s", data, ea, eb)
		}
	})
}
