package tokenizer

import (
	"bytes"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// cgj is U+034F COMBINING GRAPHEME JOINER in UTF-8.
var cgj = []byte("\u034f")

// appendNFC appends the NFC form of s to dst as Unicode defines it, which
// is what Hugging Face's tokenizers (and JavaScript's String.normalize)
// compute. x/text's norm package follows the Stream-Safe Text Format
// instead (UAX #15, section 13): after 30 non-starters in a row it inserts
// a U+034F and orders each segment of marks on its own, so a longer run
// of combining marks ("Zalgo" text) would tokenize unlike the engine. Such
// a run is normalized here by the definition: canonical decomposition,
// canonical ordering of the whole run, canonical composition.
func appendNFC(dst, s []byte) []byte {
	start := len(dst)
	dst = norm.NFC.Append(dst, s...)
	if bytes.Count(dst[start:], cgj) == bytes.Count(s, cgj) || !utf8.Valid(s) {
		// No joiner was inserted: the stream-safe form is the NFC form.
		// (Invalid UTF-8 keeps x/text's handling of its bytes.)
		return dst
	}
	return appendNFCFull(dst[:start], s)
}

// isNFC reports whether s is in NFC as Unicode defines it (see appendNFC):
// x/text's check also fails a string with a run of more than 30
// non-starters, which may be in NFC nonetheless.
func isNFC(s []byte) bool {
	if norm.NFC.IsNormal(s) {
		return true
	}
	if !utf8.Valid(s) {
		return false
	}
	var buf [256]byte
	n := appendNFC(buf[:0], s)
	return bytes.Equal(n, s)
}

// nfcRune is a code point being normalized and its canonical combining
// class.
type nfcRune struct {
	r   rune
	ccc uint8
}

// appendNFCFull is appendNFC without the stream-safe limit: s is valid
// UTF-8. Its work is linear in the length of s (runs of marks are ordered
// with a counting sort).
func appendNFCFull(dst, s []byte) []byte {
	rs := make([]nfcRune, 0, len(s))
	var enc [utf8.UTFMax]byte
	var d []byte
	// Canonical decomposition, one code point at a time (a single code
	// point decomposes into a few, in canonical order).
	for i := 0; i < len(s); {
		p := norm.NFD.Properties(s[i:])
		r, size := utf8.DecodeRune(s[i:])
		i += size
		if p.Decomposition() == nil { // its own decomposition (most marks)
			rs = append(rs, nfcRune{r: r, ccc: p.CCC()})
			continue
		}
		n := utf8.EncodeRune(enc[:], r)
		d = norm.NFD.Append(d[:0], enc[:n]...)
		for j := 0; j < len(d); {
			q := norm.NFD.Properties(d[j:])
			c, size := utf8.DecodeRune(d[j:])
			rs = append(rs, nfcRune{r: c, ccc: q.CCC()})
			j += size
		}
	}
	// Canonical ordering: each run of non-starters sorted by class, stably.
	var tmp []nfcRune
	for i := 0; i < len(rs); {
		if rs[i].ccc == 0 {
			i++
			continue
		}
		j := i + 1
		for j < len(rs) && rs[j].ccc != 0 {
			j++
		}
		tmp = sortByClass(rs[i:j], tmp)
		i = j
	}
	// Canonical composition (UAX #15's algorithm): a character combines
	// with the last starter unless a character between them is blocking.
	if len(rs) > 0 {
		var pair []byte
		starter := -1
		if rs[0].ccc == 0 {
			starter = 0
		}
		last := -1 // class of the last character kept; -1: none since the starter
		out := 1
		for i := 1; i < len(rs); i++ {
			c := rs[i]
			if starter >= 0 && (last == -1 || last < int(c.ccc)) {
				var ok bool
				var comp rune
				comp, ok, pair = composePair(rs[starter].r, c.r, pair)
				if ok {
					rs[starter].r = comp
					continue
				}
			}
			if c.ccc == 0 {
				starter = out
				last = -1
			} else {
				last = int(c.ccc)
			}
			rs[out] = c
			out++
		}
		rs = rs[:out]
	}
	for _, c := range rs {
		dst = utf8.AppendRune(dst, c.r)
	}
	return dst
}

// sortByClass sorts run by combining class, stably: a long run with a
// counting sort (a class is a byte), linear in its length; tmp is scratch,
// returned for reuse.
func sortByClass(run, tmp []nfcRune) []nfcRune {
	if len(run) <= 32 { // short: an insertion sort
		for i := 1; i < len(run); i++ {
			for j := i; j > 0 && run[j-1].ccc > run[j].ccc; j-- {
				run[j-1], run[j] = run[j], run[j-1]
			}
		}
		return tmp
	}
	var at [256]int
	for _, c := range run {
		at[c.ccc]++
	}
	sum := 0
	for k, n := range at {
		at[k] = sum
		sum += n
	}
	tmp = append(tmp[:0], run...)
	for _, c := range tmp {
		run[at[c.ccc]] = c
		at[c.ccc]++
	}
	return tmp
}

// composePair returns the primary composite of a starter a and b, if
// there is one, using buf as scratch.
func composePair(a, b rune, buf []byte) (rune, bool, []byte) {
	var in [2 * utf8.UTFMax]byte
	n := utf8.EncodeRune(in[:], a)
	n += utf8.EncodeRune(in[n:], b)
	buf = norm.NFC.Append(buf[:0], in[:n]...)
	r, size := utf8.DecodeRune(buf)
	return r, size == len(buf) && size > 0 && r != utf8.RuneError, buf
}
