//go:build !race

package jsonscan

import "testing"

// The scanner allocates nothing on valid input with plain keys: validating,
// walking with a callback, consuming values inline, decoding a string into
// a buffer with room, appending a literal.
func TestScanningAllocatesNothing(t *testing.T) {
	d := []byte(benchBody)
	buf := make([]byte, 0, 4096)
	n := testing.AllocsPerRun(200, func() {
		if _, err := SkipValue(d, 0, 256); err != nil {
			t.Fatal(err)
		}
		var model []byte
		if _, err := WalkObject(d, 0, 256, func(key []byte, vs, ve int) error {
			if string(key) == "model" {
				model = d[vs:ve]
			}
			return nil
		}); err != nil || model == nil {
			t.Fatal(err)
		}
		if _, err := WalkMembers(d, 0, func(raw []byte, vs int) (int, error) {
			if string(Key(raw)) == "messages" {
				return WalkArray(d, vs, 255, func(s, e int) error { return nil })
			}
			return SkipValue(d, vs, 255)
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := WalkObjectInline(d, 0, 256, func(key []byte, vs int) (int, error) {
			if string(key) == "messages" {
				return WalkElements(d, vs, func(s int) (int, error) { return WalkObject(d, s, 254, nil) })
			}
			return -1, nil
		}); err != nil {
			t.Fatal(err)
		}
		raw, _, err := ScanString([]byte(`"caf\u00e9 \ud83d\ude00"`), 0)
		if err != nil {
			t.Fatal(err)
		}
		buf = Unescape(buf[:0], raw)
		buf = AppendString(buf[:0], "a \"quoted\"\nline é")
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// LaxBool allocates nothing, escaped words and numbers included.
func TestLaxBoolAllocatesNothing(t *testing.T) {
	vals := [][]byte{[]byte(`true`), []byte(`"True"`), []byte(`"\u0074\u0072\u0075\u0065"`), []byte(`1.0`), []byte(`"maybe"`), []byte(`1e999`)}
	n := testing.AllocsPerRun(200, func() {
		for _, v := range vals {
			LaxBool(v)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// A number of more than 32 bytes below 10 is read without an allocation
// too: strconv.ParseFloat(string(v)) copied it to the heap (the compiler's
// stack buffer for a conversion holds 32 bytes), so a body with
// "stream":0.99999999999999999999999999999999999 cost one per request.
func TestLaxBoolReadsALongNumberWithoutAllocating(t *testing.T) {
	vals := [][]byte{
		[]byte(`0.99999999999999999999999999999999999`), // 1 as a float64
		[]byte(`1.00000000000000000000000000000000000000000e0`),
		[]byte(`-0.000000000000000000000000000000000000001e-400`),
		[]byte(`0.50000000000000000000000000000000000000000`),
	}
	want := []byte{'t', 't', 'f', 0}
	n := testing.AllocsPerRun(200, func() {
		for i, v := range vals {
			if got := LaxBool(v); got != want[i] {
				t.Fatalf("LaxBool(%s) = %q, want %q", v, got, want[i])
			}
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}
