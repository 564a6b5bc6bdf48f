package upstream

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseCapacity(t *testing.T) {
	c, err := ParseCapacity([]byte(` {"free":12,"inflight":52,"queued":1,"workers":3,"future_field":{"x":1},
		"models":[{"name":"Qwen2.5-72B-Instruct","free":12},{"name":"llama*","free":4}]} `))
	if err != nil {
		t.Fatal(err)
	}
	if c.Free != 12 || c.Inflight != 52 || c.Queued != 1 || c.Workers != 3 || len(c.Models) != 2 {
		t.Fatalf("decoded %+v", c)
	}
	for model, want := range map[string]int{"qwen2.5-72b-instruct": 12, "llama-3": 4, "LLAMA": 4, "qwen": -1, "": -1} {
		if got := c.FreeFor([]byte(model)); got != want {
			t.Fatalf("FreeFor(%q) = %d, want %d", model, got, want)
		}
	}
	// The best matching entry wins.
	c.Models = append(c.Models, ModelCapacity{Name: "*", Free: 7})
	if got := c.FreeFor([]byte("llama-3")); got != 7 {
		t.Fatalf("FreeFor with a wildcard entry = %d, want 7", got)
	}
	// Round trip.
	back, err := ParseCapacity(c.AppendJSON(nil))
	if err != nil || back.Free != 12 || len(back.Models) != 3 || back.Models[2].Name != "*" {
		t.Fatalf("round trip: %+v %v", back, err)
	}

	bad := func(in, want string) {
		t.Helper()
		_, err := ParseCapacity([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("ParseCapacity(%q): %v, want an error mentioning %q", in, err, want)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Fatalf("error quotes the input: %v", err)
		}
	}
	bad(``, "not a JSON object")
	bad(`[]`, "not a JSON object")
	bad(`{"free":1`, "not valid JSON")
	bad(`{"free":1} {}`, "not valid JSON")
	bad(`{"free":"SECRET"}`, `"free" has the wrong type`)
	bad(`{"free":1.5}`, "wrong type")
	bad(`{"free":1e30}`, "wrong type")
	bad(`{"free":-1}`, "negative")
	bad(`{"models":[{"name":"","free":1}]}`, "models[0]")
	bad(`{"models":[{"name":"m","free":-2}]}`, "negative free")
	bad(`{"models":[{"name":"`+strings.Repeat("x", 300)+`","free":1}]}`, "overlong")
	bad(`{"models":[`+strings.Repeat(`{"name":"m","free":1},`, MaxCapacityModels)+`{"name":"m","free":1}]}`, "more than")
	bad(`{"free":1}`+strings.Repeat(" ", MaxCapacityBytes), "larger than")
}

// FuzzParseCapacity: no input panics; an accepted report is valid JSON
// with non-negative counts and survives a round trip unchanged.
func FuzzParseCapacity(f *testing.F) {
	f.Add([]byte(`{"free":3,"models":[{"name":"m","free":3}]}`))
	f.Add([]byte(`{"free":0,"inflight":9,"queued":4,"workers":0,"models":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCapacity(b)
		if err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		if c.Free < 0 || c.Inflight < 0 || c.Queued < 0 || c.Workers < 0 {
			t.Fatalf("accepted negative counts %+v", c)
		}
		back, err := ParseCapacity(c.AppendJSON(nil))
		if err != nil {
			t.Fatalf("round trip of %+v: %v", c, err)
		}
		if string(back.AppendJSON(nil)) != string(c.AppendJSON(nil)) {
			t.Fatalf("round trip changed %+v into %+v", c, back)
		}
		for i := range c.Models {
			c.FreeFor([]byte(c.Models[i].Name))
		}
	})
}

// A member's report is not trusted to be cheap to match: names such as
// "*aaa…ab" against a client's 1024-byte model name took MatchGlob's
// backtracking len(name) × len(model) steps each, and a report of 4096 of
// them cost every forwarding decision for such a name 2.6 s of CPU
// (measured on the shared test machine; Pick and Serves each scan the
// reports). FreeFor matches in time linear in the name and the model.
func TestFreeForTakesLinearTimeOnAHostileReport(t *testing.T) {
	c := Capacity{}
	for i := 0; i < MaxCapacityModels; i++ {
		c.Models = append(c.Models, ModelCapacity{Name: "*" + strings.Repeat("a", 254) + "b", Free: 1})
	}
	model := []byte(strings.Repeat("a", MaxModelBytes))
	start := time.Now()
	got := c.FreeFor(model)
	if d := time.Since(start); d > time.Second || got != -1 {
		t.Fatalf("FreeFor = %d after %v", got, d)
	}
}

// FreeFor's matcher agrees with MatchGlob (anchored, ASCII case ignored,
// '*' any run of bytes) on every pattern and name over a small alphabet.
func TestFreeForMatchesAsMatchGlob(t *testing.T) {
	alphabet := []byte("aAb*-é")
	var gen func(n int, f func(string))
	gen = func(n int, f func(string)) {
		f("")
		if n == 0 {
			return
		}
		gen(n-1, func(s string) {
			for _, c := range alphabet {
				f(s + string(c))
			}
		})
	}
	var pats, names []string
	seen := map[string]bool{}
	gen(4, func(s string) {
		if !seen[s] {
			seen[s] = true
			pats = append(pats, s)
			if !strings.Contains(s, "*") {
				names = append(names, s)
			}
		}
	})
	for _, p := range pats {
		c := Capacity{Models: []ModelCapacity{{Name: p, Free: 1}}}
		for _, n := range names {
			want := MatchGlob(p, []byte(n))
			if got := c.FreeFor([]byte(n)) == 1; got != want {
				t.Fatalf("pattern %q, model %q: FreeFor matched %v, MatchGlob %v", p, n, got, want)
			}
		}
	}
}

// A literal run longer than globFolded lowers on the stack is matched by
// MatchGlob from the star before it.
func TestFreeForMatchesALongLiteralRunAsMatchGlob(t *testing.T) {
	long := strings.Repeat("x", maxGlobSegment+1)
	for _, tc := range []struct {
		pat, model string
		want       bool
	}{
		{"a*" + long + "*b", "a-" + long + "-b", true},
		{"a*" + long + "*b", "A" + long + "B", true},
		{"a*" + long + "*b", "a-" + long[1:] + "-b", false},
		{"*" + long, "yy" + long, true},
		{"*" + long + "*c*d", "y" + long + "cd", true},
		{"*" + long + "*c*d", "y" + long + "dc", false},
	} {
		c := Capacity{Models: []ModelCapacity{{Name: tc.pat, Free: 1}}}
		if got := c.FreeFor([]byte(tc.model)) == 1; got != tc.want || MatchGlob(tc.pat, []byte(tc.model)) != tc.want {
			t.Fatalf("pattern of %d bytes, model of %d: matched %v, want %v", len(tc.pat), len(tc.model), got, tc.want)
		}
	}
}
