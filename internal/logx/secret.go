package logx

import (
	"errors"
	"net/url"
)

// RedactURL returns raw with the password of its user information replaced
// by "xxxxx", for logs and errors; a string that does not parse as a URL
// is not shown at all.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<not a URL>"
	}
	return u.Redacted()
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
