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
