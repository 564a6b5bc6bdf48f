package proxy

import (
	"net/http"
	"strings"
	"testing"
)

func corsDo(t *testing.T, method, url string, hdr map[string]string, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// --cors-allow-origins: a preflight from an allowed origin gets 204 and the
// CORS headers without credentials (browsers send none); one from another
// origin gets 403 and none; answers to an allowed origin name it, errors
// included; requests without Origin get no CORS header.
func TestCORSAnswersAllowedOriginsOnly(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-cors"
	f.CORSAllowOrigins = []string{"https://app.example.com"}
	r := startRouter(t, f, nil, up.url)
	url := r.url + "/v1/chat/completions"

	pre := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}, "")
	if pre.StatusCode != 204 || pre.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		pre.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type, x-stainless-os" ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Methods"), "POST") || pre.Header.Get("Access-Control-Max-Age") == "" ||
		pre.Header.Get("Vary") != "Origin" || pre.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatalf("preflight: %d %v", pre.StatusCode, pre.Header)
	}
	bad := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"}, "")
	if bad.StatusCode != 403 || bad.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight from another origin: %d %v", bad.StatusCode, bad.Header)
	}
	for _, list := range []string{`x"y`, `x a, y`, `x-a;evil=1`, `x-a, y=1`, ` , `, `x(y)`} {
		junk := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": list}, "")
		if junk.StatusCode != 204 || junk.Header.Get("Access-Control-Allow-Headers") != "" {
			t.Fatalf("a request-headers list that is not one (%q) was echoed: %v", list, junk.Header)
		}
	}
	tabs := corsDo(t, "OPTIONS", url, map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "x-a,\tx-b ,x-c"}, "")
	if tabs.Header.Get("Access-Control-Allow-Headers") != "x-a,\tx-b ,x-c" {
		t.Fatalf("a list with spaces and tabs around its commas was not echoed: %v", tabs.Header)
	}

	for key, status := range map[string]int{"sk-cors": 200, "wrong": 401} {
		resp := corsDo(t, "POST", url, map[string]string{"Origin": "https://app.example.com", "Authorization": "Bearer " + key}, chatBody)
		if resp.StatusCode != status || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
			!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "X-Request-Id") {
			t.Fatalf("key %s: %d %v", key, resp.StatusCode, resp.Header)
		}
	}
	for _, origin := range []string{"", "https://evil.example.com"} {
		resp := corsDo(t, "POST", url, map[string]string{"Origin": origin, "Authorization": "Bearer sk-cors"}, chatBody)
		if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("origin %q: %d %v", origin, resp.StatusCode, resp.Header)
		}
	}

	// "*": any origin, named as *.
	f2 := defaultFlags()
	f2.CORSAllowOrigins = []string{"*"}
	r2 := startRouter(t, f2, nil, up.url)
	if resp := corsDo(t, "POST", r2.url+"/v1/chat/completions", map[string]string{"Origin": "https://any.example"}, chatBody); resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("*: %v", resp.Header)
	}
	// Off (the default): a preflight is no request the router knows.
	r3 := startRouter(t, nil, nil, up.url)
	if resp := corsDo(t, "OPTIONS", r3.url+"/v1/chat/completions", map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}, ""); resp.StatusCode == 204 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS off: %d %v", resp.StatusCode, resp.Header)
	}
}
