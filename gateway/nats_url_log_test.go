package gateway

import (
	"strings"
	"testing"
)

// A NATS URL's secrets stay out of the log when the broker is not reachable
// at start: a token (nats://TOKEN@host, a user name without a password) and
// the password of a URL after the first of a comma-separated list were
// logged in clear ("NATS broker not reachable at start ... url=...").
func TestTheNATSURLsTokenAndListPasswordsAreNotLogged(t *testing.T) {
	for _, u := range []string{
		"nats://hunter2tok@127.0.0.1:1",
		"nats://127.0.0.1:1,nats://u:hunter2pw@127.0.0.1:2",
	} {
		logs := captureLogs(t)
		f := parseServe(t, "--workers", "a=http://127.0.0.1:1", "--worker-model", "m",
			"--request-transport", "nats", "--kv-event-transport", "nats", "--nats-url", u)
		g, err := New(f)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		out := logs.String()
		if !strings.Contains(out, "NATS broker not reachable at start") {
			t.Fatalf("%s: no warning: %s", u, out)
		}
		if strings.Contains(out, "hunter2") {
			t.Fatalf("%s: the secret is in the log: %s", u, out)
		}
	}
}
