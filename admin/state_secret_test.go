package admin

import (
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

// A --state URL the admin refuses or cannot parse is named in the error
// without its password.
func TestABadStateURLNeverEchoesThePassword(t *testing.T) {
	for _, state := range []string{
		"REDIS://:hunter2@127.0.0.1:1/0x",       // upper-case scheme, a bad db
		"redis://:hunter2@127.0.0.1:notaport/0", // url.Parse quotes it whole
		"mysql://:hunter2@127.0.0.1:1/0",        // not Redis at all
	} {
		a, err := New(Options{Store: config.NewStore("", config.Default()), State: state})
		if err == nil {
			a.Close()
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("--state %q: the password is echoed: %v", state, err)
		}
	}
}
