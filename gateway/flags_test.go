package gateway

import (
	"testing"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
)

// parseServe parses `infera serve args...` with a fresh CLI value, exactly
// as main does.
func parseServe(t *testing.T, args ...string) *config.Serve {
	t.Helper()
	var c struct {
		Serve config.Serve `cmd:""`
	}
	p, err := kong.New(&c, append(config.KongOptions(), kong.Name("infera"), kong.Exit(func(int) { t.Fatal("exit") }))...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(append([]string{"serve"}, args...)); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &c.Serve
}
