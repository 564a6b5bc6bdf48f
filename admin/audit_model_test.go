package admin

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
)

// diff flattens only what differs (flattenChanged); it must list exactly
// what flattening both configs whole lists, for random pairs of configs:
// users and templates added, removed, changed and moved, upstreams with
// secrets, sections changed or left alone.
func TestAuditDiffOfTheChangedPartsIsTheWholeDiff(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	keys := make([]string, 40)
	for i := range keys {
		_, h, err := govern.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = h
	}
	seal := newSealer("", testKey)
	gen := func() *config.Config {
		var users []string
		perm := rng.Perm(12)
		for _, i := range perm[:rng.IntN(12)] {
			var ks []string
			for j := range rng.IntN(3) {
				ks = append(ks, fmt.Sprintf("%q", keys[(i*3+j)%len(keys)]))
			}
			models := ""
			if rng.IntN(3) == 0 {
				models = fmt.Sprintf(`,"models":["m%d","qwen3-*"]`, rng.IntN(3))
			}
			tmpl := []string{"", "gold", "silver"}[rng.IntN(3)]
			users = append(users, fmt.Sprintf(`{"name":"u%d","enabled":%v,"template":%q,"keys":[%s]%s}`, i, rng.IntN(4) != 0, tmpl, strings.Join(ks, ","), models))
		}
		var tmpls []string
		for _, n := range []string{"gold", "silver", "bronze"} {
			if n == "bronze" && rng.IntN(2) == 0 {
				continue
			}
			tmpls = append(tmpls, fmt.Sprintf(`{"name":%q,"rate":{"enabled":true,"rpm":%d}}`, n, 10+rng.IntN(3)))
		}
		proxies := []string{`{"name":"local","local":true}`}
		for _, i := range rng.Perm(3)[:rng.IntN(4)] {
			proxies = slices.Insert(proxies, rng.IntN(len(proxies)+1), fmt.Sprintf(`{"name":"p%d","address":"http://10.0.0.%d:8000","api_key":"sk-%d","weight":%d}`, i, i+rng.IntN(2), rng.IntN(2), 1+rng.IntN(2)))
		}
		doc := fmt.Sprintf(`{"session_affinity":{"ttl_s":%d},"user_limit":{"templates":[%s]},"split_proxy":{"proxies":[%s]}`,
			60+rng.IntN(2), strings.Join(tmpls, ","), strings.Join(proxies, ","))
		if rng.IntN(4) != 0 {
			doc += `,"users":[` + strings.Join(users, ",") + `]`
		}
		c, err := config.Parse([]byte(doc + "}"))
		if err != nil {
			t.Fatalf("%v: %s", err, doc)
		}
		return c
	}
	changes := 0
	for range 400 {
		old, cur := gen(), gen()
		if rng.IntN(4) == 0 { // a small change of a large part
			cur = old
			if len(old.Users) > 0 {
				c := *old
				c.Users = append([]config.User(nil), old.Users...)
				c.Users[rng.IntN(len(c.Users))].Enabled = !c.Users[0].Enabled
				cur = &c
			}
		}
		a, ra := flatten(seal, old)
		b, rb := flatten(seal, cur)
		want := diffFlat(a, ra, b, rb)
		got := diff(seal, old, cur)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("diff of the changed parts:\n%+v\nwhole diff:\n%+v", got, want)
		}
		changes += len(got)
	}
	if changes < 400 {
		t.Fatalf("only %d changes in 400 pairs: the pairs are too alike to test anything", changes)
	}
}
