package jsonscan

import (
	"encoding/json"
	"errors"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSkipValueAcceptsExactlyValidJSON(t *testing.T) {
	f := func(in string, ok bool) {
		t.Helper()
		end, err := SkipValue([]byte(in), 0, 64)
		if ok && (err != nil || SkipSpace([]byte(in), end) != len(in)) {
			t.Errorf("%q: refused (end %d, err %v)", in, end, err)
		}
		if !ok && err == nil && SkipSpace([]byte(in), end) == len(in) {
			t.Errorf("%q: accepted", in)
		}
		if err != nil && err != ErrSyntax {
			t.Errorf("%q: error %v, want ErrSyntax", in, err)
		}
	}
	for _, s := range []string{
		`{}`, `[]`, ` { "a" : [ 1 , -2.5e+3 , true , false , null , { } ] } `, `"x"`, `0`, `-0`, `1E9`, `0.5e-1`,
		`"\u00e9\ud83d\ude00\n\"\\\/\b\f\r\t"`, `"é😀"`, `{"a":{"b":{"c":[[]]}}}`, `{"a":1,"a":2}`,
	} {
		f(s, true)
	}
	for _, s := range []string{
		``, ` `, `{`, `[`, `"`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{"a" 1}`, `{1:2}`, `{'a':1}`,
		`01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `tru`, `nul`, `True`, `NaN`, `Infinity`,
		`"\x"`, `"\u12"`, `"\u12g4"`, "\"a\x01\"", "\"\xff\"", "\"\xed\xa0\x80\"", `"abc`, `"a\`,
	} {
		f(s, false)
	}
}

func TestSkipValueBoundsNestingByLevels(t *testing.T) {
	nest := func(n int) []byte {
		return []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
	}
	for _, n := range []int{1, 2, 10, 100} {
		if _, err := SkipValue(nest(n), 0, n); err != nil {
			t.Errorf("%d arrays deep with %d levels: %v", n, n, err)
		}
		if _, err := SkipValue(nest(n+1), 0, n); err != ErrSyntax {
			t.Errorf("%d arrays deep with %d levels: accepted", n+1, n)
		}
	}
	obj := []byte(`{"a":{"b":{}}}`)
	if _, err := SkipValue(obj, 0, 3); err != nil {
		t.Errorf("3 objects deep with 3 levels: %v", err)
	}
	if _, err := SkipValue(obj, 0, 2); err != ErrSyntax {
		t.Errorf("3 objects deep with 2 levels: accepted")
	}
	// Scalars need no level.
	if _, err := SkipValue([]byte(`"s"`), 0, 0); err != nil {
		t.Errorf("a string with 0 levels: %v", err)
	}
	// WalkObject opens its own object whatever levels is; members get one
	// less.
	if _, err := WalkObject([]byte(`{"a":[]}`), 0, 1, nil); err != ErrSyntax {
		t.Errorf("WalkObject with 1 level opened a nested array")
	}
	if _, err := WalkObject([]byte(`{"a":1}`), 0, 0, nil); err != nil {
		t.Errorf("WalkObject with 0 levels: %v", err)
	}
	// A deep hostile document costs no stack: refused at the bound.
	deep := nest(1_000_000)
	if _, err := SkipValue(deep, 0, 256); err != ErrSyntax {
		t.Errorf("a million arrays deep: accepted")
	}
}

func TestWalkObjectGivesDecodedKeysAndValueSpans(t *testing.T) {
	d := []byte(` {"mod\u0065l" : "m", "n":[1, 2] ,"o":{"p":null},"\ud83d\ude00":true} `)
	var got []string
	end, err := WalkObject(d, 0, 8, func(key []byte, vs, ve int) error {
		got = append(got, string(key)+"="+string(d[vs:ve]))
		return nil
	})
	if err != nil || SkipSpace(d, end) != len(d) {
		t.Fatalf("end %d err %v", end, err)
	}
	want := `model="m" n=[1, 2] o={"p":null} 😀=true`
	if strings.Join(got, " ") != want {
		t.Errorf("got %q, want %q", strings.Join(got, " "), want)
	}
}

func TestWalkersStopAtTheCallbacksError(t *testing.T) {
	stop := errors.New("stop")
	n := 0
	_, err := WalkObject([]byte(`{"a":1,"b":2,"c":3}`), 0, 8, func(key []byte, vs, ve int) error {
		n++
		if string(key) == "b" {
			return stop
		}
		return nil
	})
	if err != stop || n != 2 {
		t.Errorf("object: err %v after %d members", err, n)
	}
	n = 0
	_, err = WalkArray([]byte(`[1,2,3]`), 0, 8, func(vs, ve int) error {
		n++
		return stop
	})
	if err != stop || n != 1 {
		t.Errorf("array: err %v after %d elements", err, n)
	}
	// A malformed value after the stop is never reached; one before it is
	// refused before the callback sees the member.
	n = 0
	_, err = WalkObject([]byte(`{"a":tru,"b":2}`), 0, 8, func(key []byte, vs, ve int) error {
		n++
		return nil
	})
	if err != ErrSyntax || n != 0 {
		t.Errorf("malformed first value: err %v after %d members", err, n)
	}
}

func TestWalkMembersLetsTheCallerConsumeValues(t *testing.T) {
	d := []byte(`{"a":"x","b\u0031":[1,{"c":2}],"d":3}`)
	var keys []string
	end, err := WalkMembers(d, 0, func(raw []byte, vs int) (int, error) {
		keys = append(keys, string(raw)+">"+string(Key(raw)))
		return SkipValue(d, vs, 8)
	})
	if err != nil || end != len(d) {
		t.Fatalf("end %d err %v", end, err)
	}
	if got := strings.Join(keys, " "); got != `a>a b\u0031>b1 d>d` {
		t.Errorf("keys %q", got)
	}
	// The value callback never gets a start at the end of the input.
	for _, in := range []string{`{"a":`, `{"a": `, `{"a"`} {
		if _, err := WalkMembers([]byte(in), 0, func(raw []byte, vs int) (int, error) {
			t.Errorf("%q: value called at %d", in, vs)
			return vs, nil
		}); err != ErrSyntax {
			t.Errorf("%q: %v", in, err)
		}
	}
	// The structure around values is still checked.
	if _, err := WalkMembers([]byte(`{"a":1 "b":2}`), 0, func(raw []byte, vs int) (int, error) { return SkipValue(d, vs, 1) }); err != ErrSyntax {
		t.Errorf("missing comma accepted: %v", err)
	}
}

func TestWalkObjectInlineSkipsWhatTheCallerLeaves(t *testing.T) {
	d := []byte(` {"mod\u0065l" : "m", "n":[1, {"x":2}] ,"o":{"p":null}} `)
	var got []string
	end, err := WalkObjectInline(d, 0, 3, func(key []byte, vs int) (int, error) {
		got = append(got, string(key))
		if string(key) == "n" {
			return WalkArray(d, vs, 2, nil) // consumed by the caller
		}
		return -1, nil
	})
	if err != nil || SkipSpace(d, end) != len(d) {
		t.Fatalf("end %d err %v", end, err)
	}
	if s := strings.Join(got, " "); s != "model n o" {
		t.Errorf("keys %q", s)
	}
	// A value the walker skips gets levels-1: {"p":null} needs 2.
	if _, err := WalkObjectInline(d, 0, 2, func([]byte, int) (int, error) { return -1, nil }); err != ErrSyntax {
		t.Errorf("an object two deep with 2 levels: %v", err)
	}
	stop := errors.New("stop")
	if _, err := WalkObjectInline(d, 0, 3, func([]byte, int) (int, error) { return 0, stop }); err != stop {
		t.Errorf("the callback's error: %v", err)
	}
	for _, in := range []string{`{"a":`, `{"a":1,}`, `{"a":1 "b":2}`, `{"a":tru}`, `{"a"1}`, `{1:1}`, `[]`, `{"a":1`} {
		if _, err := WalkObjectInline([]byte(in), 0, 3, func(_ []byte, vs int) (int, error) {
			if vs >= len(in) {
				t.Errorf("%q: value called at the end", in)
			}
			return -1, nil
		}); err != ErrSyntax {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestWalkElementsLetsTheCallerConsumeElements(t *testing.T) {
	d := []byte(` [ "a" , {"b":1},[2] ,3 ] `)
	var got []string
	end, err := WalkElements(d, 0, func(vs int) (int, error) {
		ve, err := SkipValue(d, vs, 2)
		got = append(got, string(d[vs:ve]))
		return ve, err
	})
	if err != nil || SkipSpace(d, end) != len(d) {
		t.Fatalf("end %d err %v", end, err)
	}
	if s := strings.Join(got, " "); s != `"a" {"b":1} [2] 3` {
		t.Errorf("elements %q", s)
	}
	if end, err := WalkElements([]byte(`[ ]`), 0, func(vs int) (int, error) {
		t.Error("called for an empty array")
		return vs, nil
	}); err != nil || end != 3 {
		t.Errorf("empty array: end %d err %v", end, err)
	}
	for _, in := range []string{`[`, `[1,`, `[1 `, `[1,]`, `[1 2]`, `{}`, `[1}`} {
		if _, err := WalkElements([]byte(in), 0, func(vs int) (int, error) {
			if vs >= len(in) {
				t.Errorf("%q: value called at the end", in)
			}
			return SkipValue([]byte(in), vs, 1)
		}); err != ErrSyntax {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestKeyCopiesOnlyEscapedKeys(t *testing.T) {
	raw := []byte("model")
	if k := Key(raw); &k[0] != &raw[0] {
		t.Error("a plain key was copied")
	}
	esc := []byte(`mod\u0065l`)
	if k := Key(esc); string(k) != "model" || string(esc) != `mod\u0065l` {
		t.Errorf("Key(%q) = %q (input now %q)", `mod\u0065l`, k, esc)
	}
}

func TestUnescapeDecodesAsEncodingJSON(t *testing.T) {
	for _, lit := range []string{
		`"plain"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u00E9"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`, `"\ud83dx"`,
		`"\ud83d\u0041"`, `"\ud83d\ud83d\ude00"`, `"a\u0000b"`, `"é😀\u4e2d"`, `"\\u0041"`,
	} {
		raw, next, err := ScanString([]byte(lit), 0)
		if err != nil || next != len(lit) {
			t.Errorf("%s: scan: next %d err %v", lit, next, err)
			continue
		}
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatal(err)
		}
		if got := string(Unescape([]byte("prefix:"), raw)); got != "prefix:"+want {
			t.Errorf("%s: %q, encoding/json %q", lit, got, want)
		}
	}
}

func TestAppendStringEscapesForJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "q\"b\\s/", "\n\r\t\b\f\x00\x1f\x7f", "é😀", "bad\xffutf8\xc3", "\u2028"} {
		lit := AppendString([]byte("x"), s)[1:]
		var back string
		if err := json.Unmarshal(lit, &back); err != nil {
			t.Errorf("%q: %s is not a JSON string: %v", s, lit, err)
			continue
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); back != want {
			t.Errorf("%q: decodes to %q, want %q", s, back, want)
		}
		if _, next, err := ScanString(lit, 0); err != nil || next != len(lit) {
			t.Errorf("%q: %s refused by ScanString", s, lit)
		}
		if body := AppendStringBody(nil, s); string(body) != string(lit[1:len(lit)-1]) {
			t.Errorf("%q: body %s, literal %s", s, body, lit)
		}
	}
	if !utf8.Valid(AppendString(nil, "\xff\xfe")) {
		t.Error("invalid UTF-8 passed through")
	}
}

// The eight-byte fast path agrees with the byte table on every byte value
// in every position.
func TestPlainWordAgreesWithTheByteTable(t *testing.T) {
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 8; pos++ {
			w := [8]byte{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
			w[pos] = byte(c)
			x := uint64(0)
			for k := 7; k >= 0; k-- {
				x = x<<8 | uint64(w[k])
			}
			if got, want := plainWord(x), plainASCII[c]; got != want {
				t.Fatalf("byte %#x at %d: plainWord %v, table %v", c, pos, got, want)
			}
		}
	}
}

// TestSpecialBytesFindsTheFirstByteTheTableRefuses: the lowest bit of
// specialBytes' mask is in the first byte plainASCII refuses, whatever
// follows it, and the mask is 0 when the table refuses none.
func TestSpecialBytesFindsTheFirstByteTheTableRefuses(t *testing.T) {
	check := func(w [8]byte) {
		t.Helper()
		x := uint64(0)
		for k := 7; k >= 0; k-- {
			x = x<<8 | uint64(w[k])
		}
		want := 8
		for k, c := range w {
			if !plainASCII[c] {
				want = k
				break
			}
		}
		m := specialBytes(x)
		got := 8
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != want {
			t.Fatalf("%q: first special byte at %d, want %d", w, got, want)
		}
	}
	tails := []byte{'a', '"', '\\', 0, 0x1f, 0x20, 0x7f, 0x80, 0xff, '!', '#', '[', ']'}
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 8; pos++ {
			for _, tail := range tails {
				w := [8]byte{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
				w[pos] = byte(c)
				for k := pos + 1; k < 8; k++ {
					w[k] = tail
				}
				check(w)
			}
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 200000 {
		var w [8]byte
		for k := range w {
			w[k] = tails[r.IntN(len(tails))]
			if r.IntN(3) > 0 {
				w[k] = byte(0x20 + r.IntN(0x60))
			}
		}
		check(w)
	}
}
