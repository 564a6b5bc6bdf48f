//go:build !race

package proxy

import "testing"

// Reading a chat's text from content parts (their types decoded, escaped
// values, duplicate keys, media parts marked) allocates nothing once the
// body's buffers have grown. (An escaped key costs one allocation by
// design: jsonscan.Key.)
func TestParsingContentPartsDoesNotAllocate(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="},"text":"HIDDEN"},{"type":"text","text":"VISIBLE"},` +
		`{"type":"t\u0065xt","text":"a\u00e9","text":"b"},{"type":"refusal","refusal":"r"},{"type":"thinking","thinking":"t"},` +
		`{"type":"input_text","text":""},{"type":"output_text","text":null}]}]}`)
	var b reqBody
	parse := func() {
		if err := b.parse(body, kindChat); err != nil {
			t.Fatal(err)
		}
	}
	parse()
	if string(b.text) != "s\n"+mediaMark("IMAGE", `"data:image/png;base64,AA=="`)+"\nVISIBLE\nb\nr\nt" {
		t.Fatalf("text %q", b.text)
	}
	if n := testing.AllocsPerRun(200, parse); n != 0 {
		t.Fatalf("%.1f allocs per parse, want 0", n)
	}
}
