package config

import (
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// Every flag of infera serve is in the router reference with its variable.
func TestEveryServeFlagIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/router.md")
	if err != nil {
		t.Fatal(err)
	}
	var cli struct {
		Serve Serve `cmd:""`
	}
	p, err := kong.New(&cli, KongOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range p.Model.Children[0].Flags {
		if f.Name == "help" {
			continue
		}
		n++
		if !strings.Contains(string(doc), "`--"+f.Name+"`") {
			t.Errorf("--%s is not in docs/router.md", f.Name)
		}
		for _, env := range f.Envs {
			if !strings.Contains(string(doc), env) && !strings.HasSuffix(env, "_URL") && env != "KUBECONFIG" && env != "NATS_SERVER" {
				t.Errorf("%s (--%s) is not in docs/router.md", env, f.Name)
			}
		}
	}
	if n < 50 {
		t.Fatalf("only %d flags found", n)
	}
}
