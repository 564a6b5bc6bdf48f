package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// respCall sends one request to a router with the key (none when ""),
// and answers its status, body and the engine that answered.
func respCall(t *testing.T, r *child, method, path, body, key string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(method, r.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), resp.Header.Get("X-Infera-Engine-Id")
}

// respCreate creates a stored Response through r and answers its id.
func respCreate(t *testing.T, r *child, key string) string {
	t.Helper()
	code, body, _ := respCall(t, r, "POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":4}`, key)
	var v struct{ ID string }
	json.Unmarshal([]byte(body), &v)
	if code != 200 || !strings.HasPrefix(v.ID, "resp_") {
		t.Fatalf("create through %s: %d %s", r.url, code, body)
	}
	return v.ID
}

// A stored Response's record lives in Redis for
// protocol.responses_state_ttl_s after its create, and a reload of it
// applies to the records made after it. Before, it was a day whatever the
// configuration said (a constant).
func TestAStoredResponsesRecordLivesItsConfiguredTTL(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	conf := func(ttl int) string {
		return fmt.Sprintf(`{"protocol":{"responses_passthrough":true,"responses_state_ttl_s":%d}}`, ttl)
	}
	writeConfig(t, cfg, conf(3600))
	r := startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--config-poll", "20ms", "--state", rd.URL)
	pttl := func(id string) int {
		t.Helper()
		v, err := rd.Do("PTTL", "infera:resp:"+id)
		ms, _ := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("PTTL: %q %v", v, err)
		}
		return ms
	}
	if ms := pttl(respCreate(t, r, "")); ms > 3600_000 || ms < 3590_000 {
		t.Fatalf("the record's TTL: %d ms, want the hour configured", ms)
	}
	old := respCreate(t, r, "")
	writeConfig(t, cfg, conf(120))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ms := pttl(respCreate(t, r, ""))
		if ms <= 120_000 && ms > 110_000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the reload to 120 s a record's TTL is still %d ms", ms)
		}
	}
	if ms := pttl(old); ms < 3500_000 {
		t.Fatalf("a record made before the reload: %d ms left, want its hour", ms)
	}
}

// Routers sharing Redis share their configuration too (the management
// data lives there), so they change mode together: after a switch from
// passthrough to conversion mode (Responses converted to chat completions:
// the router stores nothing, and the ids it answers are its own), the
// records the passthrough era left in Redis, for a day, and in the routers'
// memory are not found: a retrieve or a cancel is vLLM's 404, as for any
// id in conversion mode, without asking Redis. Before, a router that had
// not seen the id found its record in Redis and sent the retrieve to that
// engine, and the router that had seen it sent it from its memory.
func TestARouterInConversionModeDoesNotFindPassthroughResponses(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":true}}`)
	serve := func() *child {
		return startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--config-poll", "20ms", "--state", rd.URL)
	}
	a, b := serve(), serve()
	id := respCreate(t, a, "")
	other := respCreate(t, a, "")
	if code, _, from := respCall(t, b, "GET", "/v1/responses/"+other, "", ""); code != 200 || from == "" {
		t.Fatalf("retrieve through the other router in passthrough mode: %d from %q", code, from)
	}
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":false}}`)
	converts := func(r *child) bool {
		code, got, _ := respCall(t, r, "POST", "/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2,"background":true}`, "")
		return code == 400 && strings.Contains(got, "background")
	}
	for deadline := time.Now().Add(10 * time.Second); !converts(a) || !converts(b); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the routers did not switch to conversion mode")
		}
	}
	found, missing := `infera_protocol_response_state_lookups_total{result="found"}`, `infera_protocol_response_state_lookups_total{result="missing"}`
	before := metricF(t, b.url, found) + metricF(t, b.url, missing)
	for _, r := range []*child{b, a} {
		notFound := "Response with id '" + id + "' not found."
		for _, c := range []struct{ method, path string }{{"GET", "/v1/responses/" + id}, {"POST", "/v1/responses/" + id + "/cancel"}} {
			if code, got, from := respCall(t, r, c.method, c.path, "", ""); code != 404 || from != "" || !strings.Contains(got, notFound) {
				t.Fatalf("%s %s through a router in conversion mode: %d from %q %s", c.method, c.path, code, from, got)
			}
		}
	}
	if code, _, from := respCall(t, b, "GET", "/v1/responses/"+other, "", ""); code != 404 || from != "" {
		t.Fatalf("an id the router had read from Redis, in conversion mode: %d from %q", code, from)
	}
	if got := metricF(t, b.url, found) + metricF(t, b.url, missing) - before; got != 0 {
		t.Fatalf("a router in conversion mode asked Redis %v times", got)
	}
}

// A retrieve or cancel naming an id the router does not hold is admitted
// (counted against the user's limits) before Redis is asked for it: a
// client sending ids it made up costs Redis at most one lookup per
// request its limits admit, and the rest are refused 429 without one. An
// id found in Redis is still served. Before, every such request cost a
// Redis lookup before its admission (50 made-up ids: 50 lookups, with an
// rpm of 5).
func TestAnUnknownResponseIDIsLookedUpOnlyForAnAdmittedRequest(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "five", "rate": {"enabled": true, "rpm": 5}}]},
		"users": [{"name": "ids-ivy", "keys": [%q], "template": "five"}]}`, hash))
	serve := func() *child {
		return startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--state", rd.URL)
	}
	a, b := serve(), serve()
	id := respCreate(t, a, key) // one of the five
	lookups := func() float64 {
		return metricF(t, b.url, `infera_protocol_response_state_lookups_total{result="found"}`) +
			metricF(t, b.url, `infera_protocol_response_state_lookups_total{result="missing"}`) +
			metricF(t, b.url, `infera_protocol_response_state_errors_total{op="lookup"}`)
	}
	if code, _, from := respCall(t, b, "GET", "/v1/responses/"+id, "", key); code != 200 || from == "" {
		t.Fatalf("retrieve through B of an id A created: %d from %q", code, from)
	}
	codes := map[int]int{}
	for i := range 50 {
		path := fmt.Sprintf("/v1/responses/resp_madeup%04d", i)
		if i%2 == 1 {
			path += "/cancel"
		}
		method := "GET"
		if i%2 == 1 {
			method = "POST"
		}
		code, _, _ := respCall(t, b, method, path, "", key)
		codes[code]++
	}
	if got := lookups(); codes[404] == 50 {
		t.Fatalf("50 made-up ids with an rpm of 5 (2 used): all 404, none refused; %v Redis lookups", got)
	}
	if codes[404]+codes[429] != 50 || codes[429] < 45 {
		t.Fatalf("50 made-up ids with an rpm of 5 (2 used): %v, want 404s then 429s", codes)
	}
	// One lookup for the id A created, one per made-up id admitted (404),
	// none for a refused one (429).
	if got, want := lookups(), float64(1+codes[404]); got != want {
		t.Fatalf("B asked Redis %v times, want %v (%v answers)", got, want, codes)
	}
}

// slowLink forwards loopback TCP connections to addr, holding every read
// from the client side for delay before it passes it on (a router whose
// link to Redis is slow); its address is returned.
func slowLink(t *testing.T, addr string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			track(c)
			track(up)
			wg.Add(2)
			go func() { // client -> Redis, delayed
				defer wg.Done()
				defer up.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { // Redis -> client
				defer wg.Done()
				defer c.Close()
				io.Copy(c, up)
			}()
		}
	}()
	return ln.Addr().String()
}

// A stored Response's id reaches the client only once its record is in
// Redis: a client that reads it from router A and sends its retrieve and
// a follow-up to router B at once finds it there, even when A's link to
// Redis is slow (every command A sends reaches Redis 100 ms late). This is
// why the relay waits for the record's round trip before it writes the
// answer's first bytes: relayed first and recorded meanwhile, B answered
// 404 and routed the follow-up by load.
func TestAStoredResponsesIDReachesTheClientOnlyOnceRecorded(t *testing.T) {
	rd := testsrv.StartRedis(t)
	s1, e1 := startEngine(t, "--native-protocols")
	_, e2 := startEngine(t, "--native-protocols")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":true}}`)
	u, err := url.Parse(rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	slow := *u
	slow.Host = slowLink(t, u.Host, 100*time.Millisecond)
	workers := "e1=" + e1 + ",e2=" + e2
	a := startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--state", slow.String())
	b := startChild(t, "serve", 0, "--workers", workers, "--config", cfg, "--state", rd.URL, "--router-policy", "round-robin")
	for i := range 3 {
		id := respCreate(t, a, "")
		if code, got, from := respCall(t, b, "GET", "/v1/responses/"+id, "", ""); code != 200 || from != s1.ID() {
			t.Fatalf("create %d: its retrieve through B at once: %d from %q %s", i, code, from, got)
		}
		id = respCreate(t, a, "")
		for range 2 { // round-robin would send one of two unknown ids to e2
			code, got, from := respCall(t, b, "POST", "/v1/responses", `{"model":"sim-model","input":"and?","max_output_tokens":2,"previous_response_id":"`+id+`"}`, "")
			if code != 200 || from != s1.ID() {
				t.Fatalf("create %d: its follow-up through B at once: %d from %q %s", i, code, from, got)
			}
			id = respCreate(t, a, "")
		}
	}
}

// A follow-up (a create with previous_response_id) naming an id the
// router's memory does not hold is admitted against its user's limits
// before Redis is asked for it: a user at 1 request a minute sending
// creates that name made-up ids costs Redis no more lookups than the
// requests it is admitted, and the rest are refused 429 without one.
// Another user's id, found only in Redis, is still answered 404 and does
// not count against the limits (its admission is given back): the same
// user's follow-ups of three of alice's ids are each 404, not 429, and
// the first made-up id after them is still admitted. Before,
// every such create cost a Redis lookup before its admission.
func TestAnUnknownPreviousResponseIDIsLookedUpOnlyForAnAdmittedRequest(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	alice, ah := newKey(t)
	bob, bh := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "one", "rate": {"enabled": true, "rpm": 1}}]},
		"users": [{"name": "pv-alice", "keys": [%q]}, {"name": "pv-bob", "keys": [%q], "template": "one"}]}`, ah, bh))
	serve := func() *child {
		return startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--state", rd.URL)
	}
	a, b := serve(), serve()
	lookups := func() float64 {
		return metricF(t, b.url, `infera_protocol_response_state_lookups_total{result="found"}`) +
			metricF(t, b.url, `infera_protocol_response_state_lookups_total{result="missing"}`) +
			metricF(t, b.url, `infera_protocol_response_state_errors_total{op="lookup"}`)
	}
	follow := func(prev string) string {
		return `{"model":"sim-model","input":"and?","max_output_tokens":2,"previous_response_id":"` + prev + `"}`
	}
	for i := range 3 {
		id := respCreate(t, a, alice)
		// 404 each time, never 429: the one request a minute bob may
		// send is given back each time.
		code, got, from := respCall(t, b, "POST", "/v1/responses", follow(id), bob)
		if code != 404 || from != "" || !strings.Contains(got, "Response with id '"+id+"' not found.") {
			t.Fatalf("bob's follow-up %d of alice's response through B: %d from %q %s", i, code, from, got)
		}
	}
	base := lookups()
	if base != 3 {
		t.Fatalf("B asked Redis %v times for alice's 3 ids, want 3", base)
	}
	codes := map[int]int{}
	for i := range 30 {
		prev := fmt.Sprintf("resp_%016x%04d", time.Now().UnixNano(), i)
		code, _, _ := respCall(t, b, "POST", "/v1/responses", follow(prev), bob)
		codes[code]++
	}
	admitted := 30 - codes[429]
	if got := lookups() - base; got > float64(admitted) || admitted < 1 || codes[429] < 28 {
		t.Fatalf("30 creates naming made-up ids at 1 rpm: %v; B asked Redis %v times for %d admitted", codes, got, admitted)
	}
}

// A router in passthrough mode whose fleet has prefill/decode workers
// converts its Responses creates (the PD legs speak chat completions): the
// ids it then answers are its own and a follow-up is refused, as in
// conversion mode. Its retrieves and cancels follow suit: an id recorded
// before the pair joined (in the router's memory, or in Redis by another
// router) is vLLM's 404, and neither memory nor Redis is asked. Before,
// the router that had not seen the id found its record in Redis and sent
// the retrieve to its engine, while a follow-up of the same id was refused.
func TestARouterConvertingForPDPairsDoesNotFindPassthroughResponses(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	_, ep := startEngine(t)
	_, ed := startEngine(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":true},"pd":{"mode":"vllm"}}`)
	serve := func() *child {
		return startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--config-poll", "20ms", "--state", rd.URL)
	}
	a, b := serve(), serve()
	id := respCreate(t, a, "")
	other := respCreate(t, a, "")
	if code, _, from := respCall(t, b, "GET", "/v1/responses/"+other, "", ""); code != 200 || from == "" {
		t.Fatalf("retrieve through the other router before the pair joined: %d from %q", code, from)
	}
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},"pd":{"mode":"vllm"},
		"workers":[{"id":"p0","url":%q,"role":"prefill","models":["sim-model"]},
			{"id":"d0","url":%q,"role":"decode","models":["sim-model"]}]}`, ep, ed))
	converts := func(r *child) bool {
		code, got, _ := respCall(t, r, "POST", "/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2,"background":true}`, "")
		return code == 400 && strings.Contains(got, "background")
	}
	for deadline := time.Now().Add(10 * time.Second); !converts(a) || !converts(b); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the routers did not convert once the pair joined")
		}
	}
	if code, got, _ := respCall(t, a, "POST", "/v1/responses", `{"model":"sim-model","input":"and?","max_output_tokens":2,"previous_response_id":"`+id+`"}`, ""); code != 400 || !strings.Contains(got, "previous_response_id") {
		t.Fatalf("a follow-up through a router converting for the pair: %d %s", code, got)
	}
	found, missing := `infera_protocol_response_state_lookups_total{result="found"}`, `infera_protocol_response_state_lookups_total{result="missing"}`
	before := metricF(t, b.url, found) + metricF(t, b.url, missing)
	for _, r := range []*child{b, a} {
		for _, x := range []string{id, other} {
			notFound := "Response with id '" + x + "' not found."
			for _, c := range []struct{ method, path string }{{"GET", "/v1/responses/" + x}, {"POST", "/v1/responses/" + x + "/cancel"}} {
				if code, got, from := respCall(t, r, c.method, c.path, "", ""); code != 404 || from != "" || !strings.Contains(got, notFound) {
					t.Fatalf("%s %s through a router converting for the pair: %d from %q %s", c.method, c.path, code, from, got)
				}
			}
		}
	}
	if got := metricF(t, b.url, found) + metricF(t, b.url, missing) - before; got != 0 {
		t.Fatalf("a router converting for the pair asked Redis %v times", got)
	}
}

// Without users (or for a user without limits) nothing bounds the
// requests a client sends, and a router that has not seen an id asks
// Redis once for it: one lookup per retrieve, cancel or follow-up naming a
// made-up id, never more (no fan-out, no retry), so made-up ids cost Redis
// what they cost the router, one request each. The ids are not remembered
// as missing: an id another router records meanwhile is found at once.
func TestWithoutLimitsEachUnknownResponseIDCostsOneLookup(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t, "--native-protocols")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":true}}`)
	serve := func() *child {
		return startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--state", rd.URL)
	}
	a, b := serve(), serve()
	missing := `infera_protocol_response_state_lookups_total{result="missing"}`
	before := metricF(t, b.url, missing)
	const n = 30
	for i := range n {
		id := fmt.Sprintf("resp_madeup%016x%04d", time.Now().UnixNano(), i)
		var code int
		switch i % 3 {
		case 0:
			code, _, _ = respCall(t, b, "GET", "/v1/responses/"+id, "", "")
		case 1:
			code, _, _ = respCall(t, b, "POST", "/v1/responses/"+id+"/cancel", "", "")
		default:
			code, _, _ = respCall(t, b, "POST", "/v1/responses", `{"model":"sim-model","input":"and?","max_output_tokens":2,"previous_response_id":"`+id+`"}`, "")
		}
		if code != 404 {
			t.Fatalf("request %d naming a made-up id: %d, want 404", i, code)
		}
	}
	if got := metricF(t, b.url, missing) - before; got != n {
		t.Fatalf("%d requests naming made-up ids asked Redis %v times, want %d", n, got, n)
	}
	// An id B was just told is missing is found through B once its
	// record is in Redis (as when another router records an id a client
	// chose while it is retrieved): misses are not remembered.
	id := respCreate(t, a, "")
	key := "infera:resp:" + id
	rec, err := rd.Do("GET", key)
	if err != nil || rec == "" {
		t.Fatalf("A's record of %s: %q %v", id, rec, err)
	}
	if _, err := rd.Do("DEL", key); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := respCall(t, b, "GET", "/v1/responses/"+id, "", ""); code != 404 {
		t.Fatalf("retrieve through B without the record: %d", code)
	}
	if _, err := rd.Do("SET", key, rec); err != nil {
		t.Fatal(err)
	}
	if code, _, from := respCall(t, b, "GET", "/v1/responses/"+id, "", ""); code != 200 || from == "" {
		t.Fatalf("retrieve through B once the record is back: %d from %q", code, from)
	}
}
