package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// parseUpstreams parses doc like Parse, over Default() plus this file's
// section defaults (Default() gets them when the lead wires them in).
func parseUpstreams(doc string) (*Config, error) {
	c := Default()
	c.SplitProxy = defaultSplitProxy()
	c.Mirror = defaultMirror()
	c.GlobalScheduling = defaultGlobalScheduling()
	c.SmartModelSelection = defaultSmartModelSelection()
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, decodeError(err, []byte(doc), reflect.TypeFor[Config]())
	}
	c.normalize()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

const (
	localOnly  = `{"local":true,"weight":1}`
	extA       = `{"name":"a","address":"https://api.example.com/v1","api_key":"sk-a","weight":1,"model_rules":["gpt-*"],"failover":true}`
	validSplit = `{"split_proxy":{"enabled":true,"strategy":"prefix","proxies":[` + localOnly + `,` + extA + `]}}`
)

func TestUpstreamSectionsValidation(t *testing.T) {
	ok := func(doc string) *Config {
		t.Helper()
		c, err := parseUpstreams(doc)
		if err != nil {
			t.Fatalf("parse %s: %v", doc, err)
		}
		return c
	}
	bad := func(doc, path, msg string) {
		t.Helper()
		_, err := parseUpstreams(doc)
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Fatalf("parse %s: err %v, want a FieldError at %q", doc, err, path)
		}
		if fe.Path != path || !strings.Contains(fe.Msg, msg) {
			t.Fatalf("parse %s: got %q: %q, want %q containing %q", doc, fe.Path, fe.Msg, path, msg)
		}
	}
	sp := func(strategy string, proxies ...string) string {
		return `{"split_proxy":{"enabled":true,"strategy":"` + strategy + `","proxies":[` + strings.Join(proxies, ",") + `]}}`
	}

	// The zero values and the defaults are valid.
	ok(`{}`)
	ok(`{"split_proxy":{},"mirror":{},"global_scheduling":{},"smart_model_selection":{}}`)
	c := ok(validSplit)
	if p := c.SplitProxy.Proxies[1]; p.APIKey.Reveal() != "sk-a" || !p.Failover || p.Label() != "a" {
		t.Fatalf("proxy decoded as %+v", p)
	}
	if l := c.SplitProxy.Proxies[0].Label(); l != "local" {
		t.Fatalf("local label %q", l)
	}
	ok(sp("weight", localOnly, `{"address":"http://10.0.0.1:8000","weight":3}`))
	if l := ok(sp("weight", localOnly, `{"address":"http://10.0.0.1:8000","weight":3}`)).SplitProxy.Proxies[1].Label(); l != "10.0.0.1:8000" {
		t.Fatalf("unnamed external label %q", l)
	}
	// Weights and rules of the other strategy are kept (switching back is one field).
	ok(sp("weight", `{"local":true,"weight":1,"model_rules":["x*"]}`))
	ok(sp("prefix", `{"local":true}`))

	// split_proxy
	bad(sp("random", localOnly), "split_proxy.strategy", "want weight or prefix")
	bad(`{"split_proxy":{"enabled":true,"strategy":"","proxies":[`+localOnly+`]}}`, "split_proxy.strategy", "required")
	bad(sp("weight"), "split_proxy.proxies", "one local service entry")
	bad(sp("weight", extA), "split_proxy.proxies", "one local service entry")
	ok(sp("weight", localOnly, `{"local":true,"name":"l2"}`)) // at least one local entry, as the spec says
	bad(sp("weight", `{"local":true,"failover":true,"weight":1}`), "split_proxy.proxies[0].failover", "cannot be a failover target")
	bad(sp("weight", `{"local":true,"address":"http://x","weight":1}`), "split_proxy.proxies[0].address", "no address")
	bad(sp("weight", `{"local":true,"api_key":"k","weight":1}`), "split_proxy.proxies[0].api_key", "no API key")
	bad(sp("weight", localOnly, `{"name":"b","weight":1}`), "split_proxy.proxies[1].address", "required")
	bad(sp("weight", localOnly, `{"name":"b","address":"ftp://x","weight":1}`), "split_proxy.proxies[1].address", "http://")
	bad(sp("weight", localOnly, `{"name":"b","address":"http://","weight":1}`), "split_proxy.proxies[1].address", "no host")
	bad(sp("weight", localOnly, `{"name":"b","address":"https://u:pw@x","weight":1}`), "split_proxy.proxies[1].address", "user info")
	bad(sp("weight", localOnly, `{"name":"b","address":"https://x/v1?a=b","weight":1}`), "split_proxy.proxies[1].address", "no query")
	bad(sp("weight", localOnly, `{"name":"b","address":"https://x/ v1","weight":1}`), "split_proxy.proxies[1].address", "spaces")
	bad(sp("weight", localOnly, `{"name":"b","address":"http://x","weight":-1}`), "split_proxy.proxies[1].weight", "[0, 1048576]")
	bad(sp("weight", localOnly, `{"name":"b","address":"http://x","weight":2000000}`), "split_proxy.proxies[1].weight", "[0, 1048576]")
	bad(sp("weight", localOnly, `{"name":"b","address":"http://x","status":"paused"}`), "split_proxy.proxies[1].status", "enabled or disabled")
	bad(sp("weight", localOnly, `{"name":"b c","address":"http://x"}`), "split_proxy.proxies[1].name", "characters")
	bad(sp("weight", localOnly, `{"name":"local","address":"http://x"}`), "split_proxy.proxies[1].name", "duplicate")
	bad(sp("weight", localOnly, `{"address":"http://x:1"}`, `{"address":"http://x:1/v1"}`), "split_proxy.proxies[2].name", "duplicate")
	bad(sp("prefix", localOnly, `{"name":"b","address":"http://x","model_rules":[" "]}`), "split_proxy.proxies[1].model_rules[0]", "empty")
	bad(sp("weight", `{"local":true,"weight":0}`, `{"name":"b","address":"http://x","weight":5,"status":"disabled"}`), "split_proxy.proxies", "sum to 0")
	// A disabled section is still checked once it lists proxies.
	bad(`{"split_proxy":{"proxies":[`+extA+`]}}`, "split_proxy.proxies", "one local service entry")

	// mirror
	ok(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9000","target_model":"m2","sampling_ratio":12.5,"auth_token":"tok","timeout_ms":2000,"log_recording":true,"queue_size":10,"concurrency":2}}`)
	bad(`{"mirror":{"enabled":true}}`, "mirror.target_address", "required")
	bad(`{"mirror":{"target_address":"tcp://x"}}`, "mirror.target_address", "http://")
	bad(`{"mirror":{"sampling_ratio":100.5}}`, "mirror.sampling_ratio", "[0, 100]")
	bad(`{"mirror":{"sampling_ratio":-1}}`, "mirror.sampling_ratio", "[0, 100]")
	bad(`{"mirror":{"timeout_ms":-5}}`, "mirror.timeout_ms", "ms")
	bad(`{"mirror":{"enabled":true,"target_address":"http://x","timeout_ms":0}}`, "mirror.timeout_ms", "positive")
	bad(`{"mirror":{"queue_size":70000}}`, "mirror.queue_size", "65536")
	bad(`{"mirror":{"enabled":true,"target_address":"http://x","concurrency":0}}`, "mirror.concurrency", "4096")
	bad(`{"mirror":{"max_buffer_bytes":-1}}`, "mirror.max_buffer_bytes", "[0, ")
	if c := ok(`{"mirror":{"enabled":true,"target_address":"http://x","max_buffer_bytes":0}}`); c.Mirror.BufferBytes() != DefaultMirrorBufferBytes {
		t.Fatalf("max_buffer_bytes 0: %d", c.Mirror.BufferBytes())
	}
	bad(`{"mirror":{"auth_token":"has space"}}`, "mirror.auth_token", "not allowed")
	bad(`{"mirror":{"auth_token":"line\r\nX-Evil: 1"}}`, "mirror.auth_token", "not allowed")

	// global_scheduling
	gs := `{"global_scheduling":{"enabled":true,"members":[{"name":"eu","url":"https://eu.example.com","api_key":"k1"},{"name":"us","url":"http://10.1.0.1:8000","api_key":"k2"}]}}`
	if c := ok(gs); c.GlobalScheduling.Members[1].APIKey.Reveal() != "k2" || c.GlobalScheduling.PollIntervalMS != 1000 {
		t.Fatalf("members %+v", c.GlobalScheduling)
	}
	bad(`{"global_scheduling":{"enabled":true}}`, "global_scheduling.members", "at least one")
	bad(`{"global_scheduling":{"members":[{"url":"http://x"}]}}`, "global_scheduling.members[0].name", "required")
	bad(`{"global_scheduling":{"members":[{"name":"a","url":"http://x"},{"name":"a","url":"http://y"}]}}`, "global_scheduling.members[1].name", "duplicate")
	bad(`{"global_scheduling":{"members":[{"name":"a"}]}}`, "global_scheduling.members[0].url", "required")
	bad(`{"global_scheduling":{"members":[{"name":"a","url":"x.example.com"}]}}`, "global_scheduling.members[0].url", "http://")
	bad(`{"global_scheduling":{"poll_interval_ms":2000,"stale_after_ms":1000}}`, "global_scheduling.stale_after_ms", "below poll_interval_ms")
	bad(`{"global_scheduling":{"enabled":true,"members":[{"name":"a","url":"http://x"}],"poll_timeout_ms":0}}`, "global_scheduling.poll_timeout_ms", "positive")
	bad(`{"global_scheduling":{"enabled":true,"members":[{"name":"a","url":"http://x"}],"poll_interval_ms":1}}`, "global_scheduling.poll_interval_ms", "at least 10")
	bad(`{"global_scheduling":{"min_free":-1}}`, "global_scheduling.min_free", ">= 0")

	// smart_model_selection
	sms := `{"smart_model_selection":{"enabled":true,"classifier_url":"http://127.0.0.1:8090/v1/classify","tiers":{"L1":"small","L2":"mid","L3":"big"}}}`
	if c := ok(sms); c.SmartModelSelection.FallbackTier != "L2" || c.SmartModelSelection.Tiers.Model("L3") != "big" || c.SmartModelSelection.TimeoutMS != 300 {
		t.Fatalf("smart %+v", c.SmartModelSelection)
	}
	bad(`{"smart_model_selection":{"enabled":true,"tiers":{"L1":"a","L2":"b","L3":"c"}}}`, "smart_model_selection.classifier_url", "required")
	bad(`{"smart_model_selection":{"enabled":true,"classifier_url":"http://x","tiers":{"L1":"a","L2":"b"}}}`, "smart_model_selection.tiers.L3", "every tier")
	bad(`{"smart_model_selection":{"fallback_tier":"L4"}}`, "smart_model_selection.fallback_tier", "L1, L2 or L3")
	bad(`{"smart_model_selection":{"timeout_ms":-1}}`, "smart_model_selection.timeout_ms", "ms")
	bad(`{"smart_model_selection":{"max_text_bytes":-1}}`, "smart_model_selection.max_text_bytes", "[1,")
	bad(`{"smart_model_selection":{"match_models":[""]}}`, "smart_model_selection.match_models[0]", "empty")
	bad(`{"smart_model_selection":{"tiers":{"L4":"x"}}}`, "smart_model_selection.tiers.L4", "unknown field")

	// The incompatible pair is refused with the way out in the message;
	// prefix splitting or no splitting is accepted.
	both := func(strategy string, splitOn bool) string {
		return fmt.Sprintf(`{"smart_model_selection":{"enabled":true,"classifier_url":"http://x/c","tiers":{"L1":"a","L2":"b","L3":"c"}},
			"split_proxy":{"enabled":%v,"strategy":%q,"proxies":[%s,%s]}}`, splitOn, strategy, localOnly, extA)
	}
	bad(both("weight", true), "smart_model_selection.enabled", `switch split_proxy.strategy to "prefix" or disable split_proxy`)
	ok(both("prefix", true))
	ok(both("weight", false))
}

// The secret's value never appears in any rendering of the config: fmt
// verbs, slog (text and JSON), JSON encoding, or a validation error.
func TestSecretIsNeverRendered(t *testing.T) {
	const key = "sk-TOPSECRET-123"
	c, err := parseUpstreams(`{"split_proxy":{"proxies":[{"local":true},{"name":"a","address":"http://x","api_key":"` + key + `"}]},
		"mirror":{"auth_token":"` + key + `"},"global_scheduling":{"members":[{"name":"m","url":"http://m","api_key":"` + key + `"}]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.SplitProxy.Proxies[1].APIKey.Reveal() != key || string(c.Mirror.AuthToken.AppendBearer(nil)) != "Bearer "+key {
		t.Fatal("secret not decoded")
	}
	var out bytes.Buffer
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		fmt.Fprintf(&out, verb+"\n", c)
		fmt.Fprintf(&out, verb+"\n", c.SplitProxy.Proxies[1])
		fmt.Fprintf(&out, verb+"\n", &c.Mirror)
		fmt.Fprintf(&out, verb+"\n", c.Mirror.AuthToken)
	}
	slog.New(slog.NewTextHandler(&out, nil)).Info("x", "cfg", c, "mirror", c.Mirror, "token", c.Mirror.AuthToken)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("x", "cfg", c, "token", c.Mirror.AuthToken)
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	out.Write(js)
	if strings.Contains(out.String(), key) || strings.Contains(out.String(), "TOPSECRET") {
		t.Fatalf("secret rendered:\n%s", out.String())
	}
	if !strings.Contains(string(js), `"auth_token":"***"`) {
		t.Fatalf("JSON does not show the redacted form: %s", js)
	}
	// A redacted dump parsed back is refused instead of sending "***".
	if _, err := parseUpstreams(string(js)); err == nil || !strings.Contains(err.Error(), "redacted form") {
		t.Fatalf("redacted dump parsed back: %v", err)
	}
	// So is the fingerprinted form the admin API and the audit log show
	// (it was sent upstream as the bearer token).
	if _, err := parseUpstreams(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"***e3af85a8"}}`); err == nil || !strings.Contains(err.Error(), "redacted form") {
		t.Fatalf("a fingerprinted redacted key: %v", err)
	}
	// A bad key is refused without being echoed.
	_, err = parseUpstreams(`{"mirror":{"auth_token":"sk-TOPSECRET\u0000"}}`)
	if err == nil || strings.Contains(err.Error(), "TOPSECRET") {
		t.Fatalf("bad key: %v", err)
	}
}

func TestSecretReferences(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte("sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERA_TEST_MIRROR_TOKEN", "sk-from-env")
	c, err := parseUpstreams(`{"mirror":{"auth_token":"env:INFERA_TEST_MIRROR_TOKEN"},
		"global_scheduling":{"members":[{"name":"m","url":"http://m","api_key":"file:` + file + `"}]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mirror.AuthToken.Reveal() != "sk-from-env" || c.GlobalScheduling.Members[0].APIKey.Reveal() != "sk-from-file" {
		t.Fatalf("references resolved to wrong values")
	}
	js, _ := json.Marshal(c.Mirror)
	if !strings.Contains(string(js), `"env:INFERA_TEST_MIRROR_TOKEN"`) || strings.Contains(string(js), "sk-from-env") {
		t.Fatalf("a reference should encode as itself: %s", js)
	}
	bad := func(doc, path, msg string) {
		t.Helper()
		_, err := parseUpstreams(doc)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != path || !strings.Contains(fe.Msg, msg) {
			t.Fatalf("parse %s: %v, want %s: ...%s", doc, err, path, msg)
		}
	}
	bad(`{"mirror":{"auth_token":"env:INFERA_TEST_NOT_SET_ANYWHERE"}}`, "mirror.auth_token", "not set")
	bad(`{"mirror":{"auth_token":"env:1BAD"}}`, "mirror.auth_token", "environment variable")
	bad(`{"mirror":{"auth_token":"file:`+filepath.Join(dir, "missing")+`"}}`, "mirror.auth_token", "cannot read secret file")
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	bad(`{"mirror":{"auth_token":"file:`+empty+`"}}`, "mirror.auth_token", "empty")
	big := filepath.Join(dir, "big")
	os.WriteFile(big, bytes.Repeat([]byte("k"), 10000), 0o600)
	bad(`{"mirror":{"auth_token":"file:`+big+`"}}`, "mirror.auth_token", "larger than")
	bad(`{"global_scheduling":{"members":[{"name":"m","url":"http://m","api_key":12}]}}`, "global_scheduling.members.api_key", "cannot use")
}

// A duration too small to be a whole nanosecond once converted is refused:
// the mirror's timeout_ms 1e-7 was accepted and became its 60 s default.
func TestDurationsBelowAMicrosecondAreRefused(t *testing.T) {
	if _, err := parseUpstreams(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","timeout_ms":0.0000001}}`); err == nil || !strings.Contains(err.Error(), "mirror.timeout_ms") {
		t.Fatalf("timeout_ms 1e-7: %v", err)
	}
	if _, err := parseUpstreams(`{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","timeout_ms":0.5}}`); err != nil {
		t.Fatalf("timeout_ms 0.5: %v", err)
	}
	if _, err := Parse([]byte(`{"timeouts":{"stream_idle_s":1e-9}}`)); err == nil || !strings.Contains(err.Error(), "timeouts.stream_idle_s") {
		t.Fatalf("stream_idle_s 1e-9: %v", err)
	}
}

// A match_models name with surrounding spaces never matches a request's
// model (smart selection silently did nothing), and a tier's model with
// them is served by no worker (every request of that tier got 404):
// refused at load and reload, as model_routing's patterns are.
func TestSmartSelectionNamesWithSurroundingSpacesAreRefused(t *testing.T) {
	f := func(doc, path string) {
		t.Helper()
		_, err := parseUpstreams(doc)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != path || !strings.Contains(fe.Msg, "leading or trailing spaces") {
			t.Fatalf("parse %s: err %v, want a FieldError at %q about spaces", doc, err, path)
		}
	}
	f(`{"smart_model_selection":{"match_models":["auto"," auto"]}}`, "smart_model_selection.match_models[1]")
	f(`{"smart_model_selection":{"enabled":true,"classifier_url":"http://x","tiers":{"L1":"a ","L2":"b","L3":"c"}}}`, "smart_model_selection.tiers.L1")
	f(`{"smart_model_selection":{"enabled":true,"classifier_url":"http://x","tiers":{"L1":"a","L2":"b","L3":"\tc"}}}`, "smart_model_selection.tiers.L3")
	if _, err := parseUpstreams(`{"smart_model_selection":{"enabled":true,"classifier_url":"http://x","match_models":["auto","gpt-*"],"tiers":{"L1":"a","L2":"b","L3":"c"}}}`); err != nil {
		t.Fatal(err)
	}
}
