package logx

import (
	"net/url"
	"strings"
	"testing"
)

func TestRedactURLNeverShowsThePassword(t *testing.T) {
	for _, raw := range []string{
		"redis://:hunter2@127.0.0.1:6379/0",
		"REDIS://user:hunter2@host/1",
		"redis://:hunter2@host:notaport/0",
		"%zz:hunter2",
	} {
		if got := RedactURL(raw); strings.Contains(got, "hunter2") {
			t.Errorf("RedactURL(%q) = %q", raw, got)
		}
	}
	if got := RedactURL("redis://127.0.0.1:6379/0"); got != "redis://127.0.0.1:6379/0" {
		t.Errorf("a URL without a password changed: %q", got)
	}
}

func TestStripURLDropsTheQuotedURL(t *testing.T) {
	port := "notaport" // not a constant: staticcheck would refuse the literal
	_, err := url.Parse("redis://:hunter2@host:" + port + "/0")
	if err == nil || !strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("url.Parse's error no longer quotes the URL (%v): the test needs another input", err)
	}
	if s := StripURL(err).Error(); strings.Contains(s, "hunter2") || s == "" {
		t.Errorf("StripURL: %q", s)
	}
}

// A NATS URL's secrets never reach a log line, however nats.go reads them:
// a user name without a password is the token (nats://TOKEN@host), and the
// URL may be a comma-separated list, its entries without a scheme. The
// token and every password after the list's first entry were logged in
// clear ("NATS broker not reachable at start", "cannot connect to NATS").
func TestRedactNATSURLHidesTokensAndEveryListEntrysPassword(t *testing.T) {
	for _, raw := range []string{
		"nats://hunter2@127.0.0.1:4222",
		"nats://127.0.0.1:4222,nats://u:hunter2@127.0.0.2:4222",
		"nats://127.0.0.1:4222, tls://hunter2@127.0.0.2:4222",
		"u:hunter2@127.0.0.1:4222",
		"127.0.0.1:4222,hunter2@127.0.0.2",
	} {
		if got := RedactNATSURL(raw); strings.Contains(got, "hunter2") {
			t.Errorf("RedactNATSURL(%q) = %q", raw, got)
		}
	}
	if got := RedactNATSURL("nats://127.0.0.1:4222,nats://127.0.0.2:4222"); got != "nats://127.0.0.1:4222,nats://127.0.0.2:4222" {
		t.Errorf("URLs without secrets changed: %q", got)
	}
}
