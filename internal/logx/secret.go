package logx

import (
	"errors"
	"net/url"
	"strings"
)

// RedactURL returns raw with the password of its user information replaced
// by "xxxxx", for logs and errors; a user name without a password is
// replaced too (NATS reads it as the token: nats://TOKEN@host). A string
// that does not parse as a URL is not shown at all.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<not a URL>"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); !ok {
			u.User = url.User("xxxxx")
		}
	}
	return u.Redacted()
}

// RedactNATSURL is RedactURL for a NATS URL, read as nats.go reads it: a
// comma-separated list of URLs (each is redacted, not only the first
// one's password), each without a scheme taken as nats:// (u:pw@host).
func RedactNATSURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		parts[i] = RedactURL(p)
	}
	return strings.Join(parts, ",")
}

// StripURL returns err without the URL a *url.Error carries (url.Parse's
// errors quote the whole URL, password included): the inner error. Other
// errors are returned as they are.
func StripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
