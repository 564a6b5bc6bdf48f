package jsonscan

import "testing"

// A word is read after decoding, however many of its letters are escaped:
// "\u0074\u0072\u0075\u0065" is "true" to pydantic (it was refused: its
// 24 escaped bytes did not fit the 16-byte buffer).
func TestLaxBoolReadsAWordWhoseEveryLetterIsEscaped(t *testing.T) {
	for in, want := range map[string]byte{
		`"\u0074\u0072\u0075\u0065"`:        't',
		`"\u0066\u0061\u006c\u0073\u0065"`:  'f',
		`"\u0046\u0041\u004C\u0053\u0045"`:  'f',
		`"\u0079\u0065\u0073"`:              't',
		`"\u0074\u0072\u0075\u0065\u0020"`:  0,
		`"\u0074\u0072\u0075\u0065\u0065x"`: 0,
		`"\ud83d\ude00"`:                    0,
		`"true"`:                            't',
		`null`:                              0,
	} {
		if got := LaxBool([]byte(in)); got != want {
			t.Errorf("LaxBool(%s) = %q, want %q", in, got, want)
		}
	}
}
