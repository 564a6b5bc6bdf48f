package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	ok := func(in string, check func(c *Config) bool) {
		t.Helper()
		c, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if !check(c) {
			t.Fatalf("Parse(%q): unexpected %+v", in, c)
		}
	}
	bad := func(in, want string) {
		t.Helper()
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Parse(%q): err %v, want it to mention %q", in, err, want)
		}
	}
	ok(`{}`, func(c *Config) bool {
		return c.Timeouts.StreamFirstPacketSeconds == 300 && c.Timeouts.StreamIdleSeconds == 300 &&
			c.Timeouts.StreamTotalSeconds == 0 && c.Timeouts.NonStreamTotalSeconds == 900 &&
			c.SessionAffinity.TTLSeconds == 1800 && c.SessionAffinity.MaxEntries == 100000 &&
			c.PrefixIndex.BlockSize == 128 && c.PrefixCache.HitRateThreshold == 0.5
	})
	ok(`{"load_balancing":{"algorithm":"least-tokens"}}`, func(c *Config) bool { return c.LoadBalancing.Algorithm == "least-tokens" })
	ok(`{"prefix_index":{"memory_threshold_ratio":0,"reserved_memory_gb":0}}`, func(c *Config) bool {
		return c.PrefixIndex.MemoryThresholdRatio == 0.7 && c.PrefixIndex.ReservedMemoryGB == 1.5
	})
	ok(`{"workers":[{"url":"http://127.0.0.1:1","models":["a"]}]}`, func(c *Config) bool { return c.Workers[0].Role == "mixed" })
	bad(`{`, "cannot parse")
	bad(`{"load_balancing":{"algorithm":"fastest"}}`, "load_balancing.algorithm")
	bad(`{"no_such_section":{}}`, "unknown field")
	bad(`{"timeouts":{"stream_idle_s":-1}}`, "timeouts")
	bad(`{"workers":[{"url":"ftp://x"}]}`, "http://")
	bad(`{"workers":[{"url":"http://a"},{"url":"http://a"}]}`, "duplicate")
	bad(`{"canary":{"rules":[{"model":"*","targets":[{"service":"a","weight":0}]}]}}`, "weights")
	bad(`{"session_affinity":{"mode":"sticky"}}`, "session_affinity.mode")
	bad(`{"pd":{"mode":"mooncake"}}`, "not supported")
	// Documents that are not exactly one object (hardening: a reload of any
	// of these used to remove every worker).
	bad(``, "empty")
	bad("  \n", "empty")
	bad(`null`, "JSON object")
	bad(`[]`, "JSON object")
	bad(`"x"`, "JSON object")
	bad(`{} {}`, "after the JSON object")
	bad(`{"workers":[]}garbage`, "after the JSON object")
	// Durations that would overflow time.Duration.
	bad(`{"timeouts":{"stream_idle_s":1e10}}`, "timeouts.stream_idle_s")
	bad(`{"timeouts":{"non_stream_total_s":9.3e9}}`, "too large")
	bad(`{"session_affinity":{"ttl_s":1e300}}`, "session_affinity.ttl_s")
	bad(`{"sched_timeout":{"wait_timeout_ms":1e300}}`, "sched_timeout.wait_timeout_ms")
}

func TestStoreReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"load_balancing":{"algorithm":"round-robin"}}`)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var changes int
	s.OnChange(func(old, cur *Config) { changes++ })
	first := s.Load()
	if first.LoadBalancing.Algorithm != "round-robin" {
		t.Fatal(first.LoadBalancing)
	}
	// Valid change: swapped.
	write(`{"load_balancing":{"algorithm":"least-tokens"}}`)
	if ok, err := s.Reload(); !ok || err != nil {
		t.Fatalf("reload: %v %v", ok, err)
	}
	if s.Load().LoadBalancing.Algorithm != "least-tokens" || first.LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("snapshot not swapped, or old snapshot mutated")
	}
	// Invalid file: rejected, old config keeps serving.
	write(`{"load_balancing":{"algorithm":"nope"}}`)
	if ok, err := s.Reload(); ok || err == nil {
		t.Fatalf("invalid reload accepted")
	}
	write(`{"load_balancing":`)
	if ok, err := s.Reload(); ok || err == nil {
		t.Fatalf("malformed reload accepted")
	}
	if s.Load().LoadBalancing.Algorithm != "least-tokens" || changes != 1 {
		t.Fatalf("after invalid reloads: %q changes=%d", s.Load().LoadBalancing.Algorithm, changes)
	}
}

// Watch polls the file; an edit the poll cannot see (same size, same
// mtime second) is read by ReloadAsked, which the gateway calls on SIGHUP.
func TestWatchPollsTheFileAndReloadAskedReadsAnUnseenEdit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	os.WriteFile(path, []byte(`{}`), 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go s.Watch(20*time.Millisecond, stop)
	wait := func(alg string) {
		t.Helper()
		for i := 0; i < 200; i++ {
			if s.Load().LoadBalancing.Algorithm == alg {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("config never became %q", alg)
	}
	// File change (size differs) is picked up by polling.
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"}}`), 0o644)
	wait("round-robin")
	// Same size, same mtime second is possible: ReloadAsked forces a reload.
	time.Sleep(50 * time.Millisecond)
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o644)
	if _, err := s.ReloadAsked(); err != nil {
		t.Fatal(err)
	}
	wait("least-tokens")
}

func TestFieldErrorNamesThePath(t *testing.T) {
	f := func(in, path string) {
		t.Helper()
		_, err := Parse([]byte(in))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != path {
			t.Fatalf("Parse(%s): err %v, want a FieldError at %q", in, err, path)
		}
	}
	f(`{"session_affinity":{"ttl_s":0}}`, "session_affinity.ttl_s")
	f(`{"session_affinity":{"ttl_s":"x"}}`, "session_affinity.ttl_s")
	f(`{"workers":[{"url":"http://a"},{"url":"ftp://b"}]}`, "workers[1].url")
	f(`{"canary":{"rules":[{"model":"*","targets":[{"service":"","weight":1}]}]}}`, "canary.rules[0].targets[0].service")
	f(`{"bogus":1}`, "bogus")
}

// A reload with a bad document (empty as a non-atomic writer leaves it,
// null, trailing garbage, an overflowing timeout) is refused and the old
// snapshot keeps serving, workers included.
func TestReloadRefusesBadDocumentsAndKeepsServing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	good := `{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":["m"]}]}`
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "null", good + "garbage", `{"timeouts":{"stream_idle_s":1e12}}`, "{\"workers\":[{\"id\":\"a\""} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Reload(); ok || err == nil {
			t.Fatalf("reload of %q: swapped=%v err=%v, want refused", bad, ok, err)
		}
		if n := len(s.Load().Workers); n != 1 {
			t.Fatalf("after refused reload of %q: %d workers, want the old 1", bad, n)
		}
	}
}

func TestParseNamesTheWholePathOfAnUnknownNestedField(t *testing.T) {
	for _, c := range []struct{ in, path string }{
		{`{"session_affinity":{"ttl":5}}`, "session_affinity.ttl"},
		{`{"no_such_section":{}}`, "no_such_section"},
		{`{"split_proxy":{"enabled":true,"proxies":[{"local":true,"weight":1},{"name":"x","address":"http://127.0.0.1:9","weight":1,"enabled":true}]}}`, "split_proxy.proxies[1].enabled"},
		{`{"user_limit":{"templates":[{"name":"t","rate":{"rmp":5}}]}}`, "user_limit.templates[0].rate.rmp"},
		// a key that is known in one place and unknown in another: the
		// unknown one is named, matched case-insensitively like the decoder
		{`{"Session_Affinity":{"TTL_S":5},"timeouts":{"ttl_s":1}}`, "timeouts.ttl_s"},
	} {
		_, err := Parse([]byte(c.in))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != c.path || !strings.Contains(fe.Msg, "unknown field") {
			t.Errorf("Parse(%s): %v, want the unknown field at %s", c.in, err, c.path)
		}
	}
}

// A config saved by an editor that writes a UTF-8 byte order mark loads
// (RFC 8259 8.1 lets a parser ignore it); it used to be refused as "not a
// JSON object", which named nothing the operator could see.
func TestAConfigWithAByteOrderMarkLoads(t *testing.T) {
	c, err := Parse([]byte("\xef\xbb\xbf{\"load_balancing\":{\"algorithm\":\"round-robin\"}}\n"))
	if err != nil || c.LoadBalancing.Algorithm != "round-robin" {
		t.Fatalf("%v", err)
	}
	if _, err := Parse([]byte("\xef\xbb\xbf")); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("a lone BOM: %v", err)
	}
}

// A worker listing an empty model name would serve nothing while its
// health says ok: the config is refused, naming the worker.
func TestAWorkerWithAnEmptyModelNameIsRefused(t *testing.T) {
	for _, models := range []string{`[""]`, `["m",""]`, `["m\u0000"]`} {
		_, err := Parse([]byte(`{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":` + models + `}]}`))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "workers[0]" || !strings.Contains(fe.Msg, "models[") {
			t.Errorf("models %s: %v", models, err)
		}
	}
}

// Quota template names are path segments of the admin API and shown in
// the console: printable, without '/', without surrounding spaces, at most
// 64 bytes. A space inside ("Gold tier") is fine. Invisible characters
// (format characters such as a zero-width space or a right-to-left
// override, spaces other than ASCII's) were taken: "gold\u200b" shows as
// "gold" in the console's template choice, so a user could be bound to a
// look-alike of the template the operator meant.
func TestQuotaTemplateNamesArePrintableAndBounded(t *testing.T) {
	doc := func(name string) []byte {
		b, _ := json.Marshal(name)
		return []byte(`{"user_limit":{"templates":[{"name":` + string(b) + `}]}}`)
	}
	for _, name := range []string{"gold", "Gold tier", "tier-1.v2", "金", strings.Repeat("x", 64)} {
		if _, err := Parse(doc(name)); err != nil {
			t.Errorf("%q refused: %v", name, err)
		}
	}
	for _, name := range []string{"a/b", " gold", "gold ", "go\nld", "\x1b[31mred", strings.Repeat("x", 65), "\xff",
		"gold\u200b", "\u202egold", "Gold\u00a0tier", "go\u2028ld", "gold\ufeff", "\u2066gold\u2069"} {
		_, err := Parse(doc(name))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "user_limit.templates[0].name" {
			t.Errorf("%q: %v", name, err)
		}
	}
}

// Characters Unicode says to render as nothing (Default_Ignorable_Code_Point
// beyond the format characters: a combining grapheme joiner, the Hangul
// fillers, Khmer's inherent vowels) and the blank braille cell are
// printable to unicode.IsPrint, and were taken: "gold\u034f" and
// "gold\u3164" show as "gold" in the console's template choice, beside the
// real one. A variation selector after an ASCII character selects nothing
// and shows as nothing too; after an emoji or an ideograph it is part of
// the character and stays allowed.
func TestQuotaTemplateNamesWithCharactersShownAsNothingAreRefused(t *testing.T) {
	doc := func(name string) []byte {
		b, _ := json.Marshal(name)
		return []byte(`{"user_limit":{"templates":[{"name":` + string(b) + `}]}}`)
	}
	for _, name := range []string{"gold ❤️", "葛󠄀 tier", "café", "été"} {
		if _, err := Parse(doc(name)); err != nil {
			t.Errorf("%q refused: %v", name, err)
		}
	}
	for _, name := range []string{"gold͏", "go͏ld", "goldㅤ", "ᅟgold", "goldᅠ", "goldﾠ",
		"gold឴", "gold឵", "gold⠀", "Gold⠀tier", "gold️", "️gold", "gold󠄀"} {
		_, err := Parse(doc(name))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "user_limit.templates[0].name" {
			t.Errorf("%+q: %v", name, err)
		}
	}
}

// A template's name is a path segment of /api/templates/{name}, and "."
// and ".." are the two a path cannot carry: clients (curl, browsers,
// fetch) remove them as dot segments (RFC 3986 5.2.4), and the admin's
// router redirects what is left, so DELETE /api/templates/.. reached
// /api/ and a template named ".." or "." could be read, replaced or
// deleted only by percent-encoding its dots. Names that merely hold dots
// stay valid.
func TestQuotaTemplatesNamedDotOrDotDotAreRefused(t *testing.T) {
	doc := func(name string) []byte {
		b, _ := json.Marshal(name)
		return []byte(`{"user_limit":{"templates":[{"name":` + string(b) + `}]}}`)
	}
	for _, name := range []string{"...", ".gold", "gold.", "v1..2", ". .", "a.b"} {
		if _, err := Parse(doc(name)); err != nil {
			t.Errorf("%q refused: %v", name, err)
		}
	}
	for _, name := range []string{".", ".."} {
		_, err := Parse(doc(name))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "user_limit.templates[0].name" {
			t.Errorf("%q: %v", name, err)
		}
	}
}

// A mapping pattern with surrounding spaces never matched a model name (they
// are matched as written): it is refused instead of loading as a dead rule.
func TestAMappingPatternWithSurroundingSpacesIsRefused(t *testing.T) {
	for _, pat := range []string{" gpt-4*", "gpt-4* ", "\tgpt-4*"} {
		in := `{"model_routing":{"enabled":true,"mappings":[{"pattern":` + strconv.Quote(pat) + `,"services":["big"]}]}}`
		_, err := Parse([]byte(in))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "model_routing.mappings[0].pattern" {
			t.Errorf("pattern %q: err %v, want a FieldError at the pattern", pat, err)
		}
	}
	if _, err := Parse([]byte(`{"model_routing":{"enabled":true,"mappings":[{"pattern":"gpt 4*","services":["big"]}]}}`)); err != nil {
		t.Errorf("a space inside a pattern is refused: %v", err)
	}
}

// The session header may not be one that carries the client's key: the
// affinity table would hold keys, and all of one key's requests would be
// one session.
func TestTheSessionHeaderMayNotBeACredentialHeader(t *testing.T) {
	for _, h := range []string{"Authorization", "authorization", "X-Api-Key", "x-api-key", "Proxy-Authorization", "Cookie", "api-key"} {
		_, err := Parse([]byte(`{"session_affinity":{"enabled":true,"header":"` + h + `"}}`))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "session_affinity.header" {
			t.Errorf("header %s: err %v, want a FieldError at session_affinity.header", h, err)
		}
	}
	if _, err := Parse([]byte(`{"session_affinity":{"enabled":true,"header":"X-Claude-Code-Session-Id"}}`)); err != nil {
		t.Errorf("a session header is refused: %v", err)
	}
}

// The prefix index's sweep period has a floor: each sweep walks the index,
// and at 1e-6 s an empty index cost 14% of a core.
func TestAMaintenanceIntervalTooShortToSweepIsRefused(t *testing.T) {
	for _, v := range []string{"1e-6", "0.001", "0.009"} {
		_, err := Parse([]byte(`{"prefix_index":{"maintenance_interval_s":` + v + `}}`))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != "prefix_index.maintenance_interval_s" {
			t.Errorf("%s: err %v, want a FieldError at prefix_index.maintenance_interval_s", v, err)
		}
	}
	if _, err := Parse([]byte(`{"prefix_index":{"maintenance_interval_s":0.01}}`)); err != nil {
		t.Errorf("10 ms is refused: %v", err)
	}
}

// A sealed secret (enc:...) in a config file is opened by the store's
// codec at its entry and address, or refused at its path: it was taken as
// the key itself, and the sealed text went upstream as a bearer token.
func TestASealedSecretIsOpenedByTheCodecOrRefused(t *testing.T) {
	doc := `{"mirror":{"target_address":"http://127.0.0.1:9","auth_token":"enc:v2:sealed-mirror-key"}}`
	_, err := Parse([]byte(doc))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "mirror.auth_token" || strings.Contains(fe.Error(), "sealed-mirror-key") {
		t.Fatalf("without a codec: %v, want a FieldError at mirror.auth_token not echoing it", err)
	}
	c, err := ParseWith([]byte(doc), testCodec{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Mirror.AuthToken.Reveal(); got != "key-of-mirror-at-http://127.0.0.1:9" {
		t.Fatalf("opened as %q", got)
	}
	// Written back by a store with the codec, literal secrets are sealed.
	data, err := MarshalFileWith(c, testCodec{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"enc:v2:sealed-key-of-mirror-at-http://127.0.0.1:9"`) {
		t.Fatalf("written as\n%s", data)
	}
}

// testCodec "opens" enc:v2:X as "key-of-<owner>-at-<address>" and seals a
// key as enc:v2:sealed-<key>.
type testCodec struct{}

func (testCodec) Seal(owner, address, key string) (string, error) { return "enc:v2:sealed-" + key, nil }
func (testCodec) Open(sealed, owner, address string) (string, error) {
	return "key-of-" + owner + "-at-" + address, nil
}
