package proxy

import (
	"bytes"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
)

// usage is the token usage an engine reported. The governance reconciles a
// user's quotas and TPM with it (govern.go), so it must be read right even
// when the usage object arrives cut in two by a read boundary (a long
// non-streaming body, or a stream's last event split over two TCP reads).
//
// Its state is usageState, cleared per request (reset); the carry array
// stands apart: only its first ncarry bytes are ever read, so the 2 KiB
// are not zeroed again for every request.
type usage struct {
	usageState

	// carry holds the end of the last chunk scanned when it cut a usage
	// object (or its key), up to usageCarry bytes: the next chunk is
	// scanned joined to it, here (its second half is the join's room, so
	// that no read allocates or copies a large buffer onto its stack).
	// A cut object longer than that, up to usageMax bytes, is carried in
	// big instead (inBig), made for the first one (2 x usageMax: a rare
	// stream's, the rest never allocate it). Bytes past ncarry are
	// garbage from an earlier request, never read.
	carry [2 * usageCarry]byte
}

// usageState is usage but its carry's bytes.
type usageState struct {
	prompt, completion, cached int
	seen                       bool
	// bad has a bit set (countBit) for each count whose value, as last
	// set, was no token count (a negative number, a fraction, a string):
	// the usage is then unknown (known), and the request keeps the
	// router's estimate, however the other counts read.
	bad uint8
	// whole: the numbers were read from a whole usage object (one cut by a
	// read boundary is read whole with the next read; until then its
	// numbers may be cut too).
	whole bool
	// final: that object is the engine's count of the whole answer, sent
	// once at the end of a stream: a chat or completions stream's usage
	// chunk (no choices: judge), an Anthropic message_delta's, a Responses
	// terminal event's. The other usage on a stream's chunks (vLLM's
	// continuous_usage_stats) is the usage so far. settled.
	final bool
	// input: an Anthropic answer's input counts as last set (applyProtocol).
	input protocol.AnthropicInput

	// ncarry bytes of carry (or of big, inBig) are carried.
	ncarry int
	big    []byte
	inBig  bool
	// inStart: the last Anthropic event type named so far is
	// message_start (parseProtocol), for a usage object whose event began
	// in an earlier read.
	inStart bool
	// tail is the end of the last read, to find an event type cut by a
	// read boundary (scanProtocol).
	tail  [markerLen - 1]byte
	ntail int

	// What judge needs to know of a chat stream's usage object: whether
	// its event line names choices. lines: the answer is judged (a
	// stream request's, rs.scanUsage).
	lines bool
	// once: the request did not ask for continuous usage (vLLM's
	// continuous_usage_stats), so the engine sends its usage once, at the
	// stream's end: any whole usage object is final, also on a chunk with
	// choices (SGLang before its choices:[] usage chunk, TGI and other
	// OpenAI-compatible engines put it on the chunk with finish_reason).
	once bool
	// follow: the stream's lines are followed although once, as the
	// engine sends the usage so far unasked (judge).
	follow bool
	// midLine: the last read of a once stream ended inside a line.
	midLine bool
	// single: the request generates one sequence (n and best_of 1, one
	// prompt), so with continuous usage the usage on the chunk whose
	// finish_reason is set is the whole answer's count: vLLM's
	// serving_chat.py and serving_completion.py put the prompt and that
	// choice's tokens so far on it, after its last tokens. With more
	// sequences it counts one choice's tokens, and only the usage chunk
	// sums them.
	single bool
	// hit: the last scan read a whole usage object with numbers, its key
	// at hitKey and its end at hitEnd in the read scanned (a key at a
	// negative offset began in the carry, at the end of the read before);
	// off is the offset in the read of the bytes parse looks at.
	hit            bool
	hitKey, hitEnd int
	off            int
	// lch is what the event line the last read ended in says of its
	// choices so far, ltail its last bytes (for a key or value the read
	// boundary cut), and pend that it holds a whole usage object that no
	// choices preceded: judged at the line's end.
	lch    uint8
	lfin   uint8 // what it says of a finish_reason (finished)
	ltail  [choicesSpan]byte
	nltail int
	pend   bool
}

// choicesSpan bounds a "choices" key and an empty value (`"choices":[]`,
// with some spaces) cut by a read boundary.
const choicesSpan = 32

// usageCarry bounds the bytes carried over a read boundary in usage's own
// array: a usage object is 100-250 bytes compact (OpenAI's, vLLM's,
// SGLang's, with details), and over 450 with every details field spaced
// as Python's json.dumps spaces it. usageMax bounds the ones carried at
// all (in big): an engine may add fields of its own (per-request metrics,
// cost details); one longer than this, cut by a read, is never read whole.
const (
	usageCarry = 1024
	usageMax   = 8 << 10
)

var (
	keyUsage      = []byte(`"usage"`)
	keyPrompt     = []byte(`"prompt_tokens"`)
	keyCompletion = []byte(`"completion_tokens"`)
	keyCached     = []byte(`"cached_tokens"`)
	keyTotal      = []byte(`"total_tokens"`)
)

// scan looks for a usage object in b, the next chunk of a body (a whole
// body, or one read of a stream), and records its numbers. It is a byte
// search, not a JSON decode: cheap enough to run on every relayed chunk.
// It allocates nothing.
func (u *usage) scan(b []byte) { u.scanAPI(b, protocol.Chat) }

// scanAPI is scan for the usage objects of api's answers (scanProtocol).
func (u *usage) scanAPI(b []byte, api protocol.API) {
	u.hit = false
	if u.ncarry > 0 {
		// The Anthropic event type b begins in: b is read again below,
		// from its start, after this reading moved past it.
		inStart := u.inStart
		for joined := 0; u.ncarry > 0; {
			// The carry, then as much of b as its buffer holds: the
			// buffer begins off bytes into b (before it: negative).
			buf := u.carry[:]
			if u.inBig {
				buf = u.big[:cap(u.big)]
			}
			n := u.ncarry
			u.off = joined - n
			k := copy(buf[n:], b[joined:])
			joined += k
			u.ncarry, u.inBig = 0, false
			u.parseAPI(buf[:n+k], api) // a carry it takes moves down in place
			if u.ncarry > 0 && joined == len(b) {
				// Still cut, and b is all in the carry now.
				u.off = 0
				if u.lines && api == protocol.Chat {
					u.judge(b)
				}
				return
			}
			if k == 0 {
				break // a full buffer (cannot be: parse carries no more than usageMax)
			}
			// Still cut with more of b to join (an object longer than
			// the room of usage's own array): again, in big.
		}
		u.off = 0
		u.ncarry, u.inBig = 0, false
		u.inStart = inStart
	}
	u.parseAPI(b, api)
	if u.lines && api == protocol.Chat {
		u.judge(b)
	}
}

func (u *usage) parseAPI(b []byte, api protocol.API) {
	if api == protocol.Chat {
		u.parse(b)
		return
	}
	u.parseProtocol(b, api)
}

// parse reads the last usage object of b (a stream with usage in every
// event ends with the totals); when b ends inside it (or inside its key)
// the rest of b from the key on is carried to the next scan.
func (u *usage) parse(b []byte) {
	i := lastIndex(b, keyUsage)
	if i >= 0 {
		end := objectEnd(b[i+len(keyUsage):])
		if end < 0 && len(b)-i <= usageMax {
			// Cut, and read whole with the next read: its numbers are
			// read then, and those of the usage before it in b now (a
			// finish_reason chunk's, say, before a usage chunk's start).
			if j := lastIndex(b[:i], keyUsage); j >= 0 {
				u.take(b[:i], j, objectEnd(b[j+len(keyUsage):i]))
			}
			// Carried last, as b may be the carry itself (scanAPI).
			u.carryCut(b[i:])
			return
		}
		u.take(b, i, end)
	}
	// The next key may be cut: carry a tail of b (after the key found)
	// that begins it.
	after := len(b)
	if i >= 0 {
		after = len(b) - i - len(keyUsage)
	}
	if after == 0 || bytes.IndexByte(keyUsage, b[len(b)-1]) < 0 {
		return // an event's end, say: no key's start
	}
	for k := min(len(keyUsage)-1, after); k > 0; k-- {
		if bytes.HasSuffix(b, keyUsage[:k]) {
			u.ncarry = copy(u.carry[:], b[len(b)-k:])
			return
		}
	}
}

// carryCut carries p, a usage object cut from its key on, of at most
// usageMax bytes, to the next scan: in usage's own array when it fits,
// else in big. p may be in the carry itself (a copy moves it down).
func (u *usage) carryCut(p []byte) {
	if len(p) <= usageCarry {
		u.ncarry, u.inBig = copy(u.carry[:], p), false
		return
	}
	if u.big == nil {
		u.big = make([]byte, 0, 2*usageMax)
	}
	u.ncarry, u.inBig = copy(u.big[:cap(u.big)], p), true
}

// take records the numbers of the usage object whose key is at b[i:] and
// whose value is end bytes long (objectEnd; -1: cut by b's end).
func (u *usage) take(b []byte, i, end int) {
	obj := b[i+len(keyUsage):]
	if end >= 0 {
		// The object alone: a key after it is another object's (an
		// engine's own metrics after its usage, with a cached_tokens the
		// usage left out, set the cached share).
		obj = obj[:end]
	}
	okPrompt := u.count(&u.prompt, bitPrompt, obj, keyPrompt)
	okCompletion := u.count(&u.completion, bitCompletion, obj, keyCompletion)
	numbers := okPrompt || okCompletion
	switch {
	case end < 0:
	case !numbers:
		// vLLM's rerank answers before its RerankUsage had
		// prompt_tokens: {"total_tokens":N}, all of them prompt.
		numbers = u.count(&u.prompt, bitPrompt, obj, keyTotal)
	case !okCompletion && u.bad&bitPrompt == 0:
		// No completion_tokens, and a total above the prompt: the rest
		// of it was generated (charged as the prompt alone before).
		if n, st := countAfter(obj, keyTotal); st == countOK && n > u.prompt {
			u.completion = n - u.prompt
		}
	}
	u.count(&u.cached, bitCached, obj, keyCached)
	if numbers {
		// These numbers are the usage now: final once judged.
		u.whole, u.final, u.pend = end >= 0, false, false
		if u.hit = u.whole; u.hit {
			u.hitKey, u.hitEnd = u.off+i, u.off+i+len(keyUsage)+end
		}
	}
}

// lastIndex is the last key in b: bytes.LastIndex(b, key) by forward
// searches (bytes.Index is vectorised where LastIndex hashes byte by byte,
// Rabin-Karp, and a body or chunk holds the key once or not at all) that
// skips a string that is a value, not a key: one a colon does not follow.
// vLLM's chat answer puts prompt_logprobs after its usage, each prompt
// token's "decoded_token" among them, so a prompt with the word "usage"
// put a string "usage" there that hid the usage before it. One that b ends
// before its colon may be a key (cut: parse carries it).
func lastIndex(b, key []byte) int {
	last := -1
	for off := 0; ; {
		j := indexKey(b[off:], key)
		if j < 0 {
			return last
		}
		last = off + j
		off = last + 1
	}
}

// indexKey is the first key in p (isKey): a string that is a value is
// skipped. A chunk's text comes before its finish_reason, so a chunk whose
// text was the word finish_reason (a string "finish_reason", then '}') was
// read as a finish_reason set: its usage so far was taken for the final
// count, and a client leaving after it was charged that instead of the
// estimate.
func indexKey(p, key []byte) int {
	for off := 0; ; {
		j := jsonscan.IndexKey(p[off:], key)
		if j < 0 {
			return -1
		}
		if i := off + j; isKey(p[i+len(key):]) {
			return i
		}
		off += j + 1
	}
}

// isKey reports whether rest, what follows a quoted string, makes it an
// object's key: JSON white space, then a colon or the end of what was read.
func isKey(rest []byte) bool {
	i := skipSpace(rest, 0)
	return i == len(rest) || rest[i] == ':'
}

// objectEnd is the length of the value after a "usage" key in b (its
// colon, then null or an object whose braces close: usage objects hold no
// strings with braces), or -1 when b ends before it does.
func objectEnd(b []byte) int {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == ':' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	if i == len(b) {
		return -1
	}
	if b[i] != '{' {
		if i+4 > len(b) {
			return -1
		}
		return i + 4 // null (or anything else: nothing to wait for)
	}
	// From one '}' to the next only braces open: count them (vectorised)
	// and close one at each '}'.
	depth := 0
	for {
		j := bytes.IndexByte(b[i:], '}')
		if j < 0 {
			return -1
		}
		depth += bytes.Count(b[i:i+j], openBrace) - 1
		if i += j + 1; depth == 0 {
			return i
		}
	}
}

var openBrace = []byte{'{'}

// The bits of usage.bad, one per count.
const (
	bitPrompt uint8 = 1 << iota
	bitCompletion
	bitCached
	bitInput // Anthropic's input counts: bitInput << part
)

// count sets *dst to the count after key in obj (countAfter), or sets bit
// in bad when its value is no count, and reports whether the key had a
// value other than null: the usage object holds that number. A count read
// clears bit: each count stands as last set.
func (u *usage) count(dst *int, bit uint8, obj, key []byte) bool {
	n, st := countAfter(obj, key)
	switch st {
	case countOK:
		*dst, u.seen = n, true
		u.bad &^= bit
	case countBad:
		u.bad |= bit
	}
	return st != countAbsent
}

// known reports whether the usage read is the engine's count, every
// number of it a token count: the request is charged it (else it keeps
// its estimate).
func (u *usage) known() bool { return u.seen && u.bad == 0 }

// What the value after a count's key is (countAfter).
const (
	countAbsent uint8 = iota // no key, or null
	countOK                  // a token count
	countBad                 // anything else: negative, a fraction, not a number
)

// maxUsageCount bounds a count read (far above any context): a larger
// number counts as it, never wraps.
const maxUsageCount = 1 << 40

// countAfter reads the value after the first key in b as a token count, as
// the engine's JSON encoder may write it: a whole number, also written
// with a fraction of zeros or an exponent (1500.0, 1.5e3, 1E+3, which
// Python's json writes for a float that holds a whole count), is that
// number (capped at maxUsageCount); a negative number, a fraction (12.5,
// 1.25e1), a string or any other value is countBad, so that such a count
// never lowers a charge (read as its leading digits, 1.5e3 was 1 token,
// and -5 was skipped, leaving the count before it). A number cut by the
// end of b reads as far as it goes (a cut object is read again whole).
// It allocates nothing.
func countAfter(b, key []byte) (int, uint8) {
	i := indexKey(b, key) // a string that is a value is no count's key
	if i < 0 {
		return 0, countAbsent
	}
	i = skipSpace(b, i+len(key))
	if i < len(b) && b[i] == ':' {
		i = skipSpace(b, i+1)
	}
	return parseCount(b[i:])
}

// parseCount reads the JSON number at p's start as a token count
// (countAfter). The usual count, up to 12 plain digits that the next byte
// ends, is read here; any other value by parseNumberCount (which took 250
// instructions a JSON answer's usage where this loop takes about 100).
func parseCount(p []byte) (int, uint8) {
	n, i := 0, 0
	for ; i < len(p) && i < 12 && p[i] >= '0' && p[i] <= '9'; i++ {
		n = n*10 + int(p[i]-'0')
	}
	if i > 0 && i < len(p) && !continuesNumber(p[i]) {
		return n, countOK
	}
	return parseNumberCount(p)
}

// continuesNumber reports whether c, after a number's leading digits, is
// still part of it.
func continuesNumber(c byte) bool {
	return c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// parseNumberCount is parseCount for any value.
func parseNumberCount(p []byte) (int, uint8) {
	if bytes.HasPrefix(p, null) {
		return 0, countAbsent
	}
	i := 0
	neg := i < len(p) && p[i] == '-'
	if neg {
		i++
	}
	// The value is m x 10^exp; digits past m's 17 are dropped (lost: one
	// of them was not 0), the value being far past maxUsageCount then.
	var m uint64
	exp, digits, lost := 0, false, false
	digit := func(d byte, frac bool) {
		digits = true
		switch {
		case m < 1e17:
			m = m*10 + uint64(d-'0')
			if frac {
				exp--
			}
		default:
			lost = lost || d != '0'
			if !frac {
				exp++
			}
		}
	}
	for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
		digit(p[i], false)
	}
	if i < len(p) && p[i] == '.' {
		for i++; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
			digit(p[i], true)
		}
	}
	if !digits {
		return 0, countBad
	}
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		i++
		eneg := i < len(p) && p[i] == '-'
		if i < len(p) && (p[i] == '-' || p[i] == '+') {
			i++
		}
		e, edigits := 0, false
		for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
			e = min(e*10+int(p[i]-'0'), 1<<20)
			edigits = true
		}
		if !edigits {
			return 0, countBad
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	for exp < 0 && m != 0 && m%10 == 0 {
		m /= 10
		exp++
	}
	switch {
	case m == 0:
		return 0, countOK // 0, -0, 0e5, 0.000
	case neg || exp < 0:
		return 0, countBad
	case lost:
		return maxUsageCount, countOK
	}
	for ; exp > 0 && m <= maxUsageCount; exp-- {
		m *= 10
	}
	return int(min(m, maxUsageCount)), countOK
}

var null = []byte("null")

// judge tells whether the usage object a read b of a chat stream brought
// (hit) is final: an engine sends its count of the whole answer once, in
// the usage chunk it ends the stream with, whose choices are empty (vLLM,
// SGLang, llama.cpp, OpenAI: "choices":[]), null or absent, as
// protocol.UsageFilter takes it; a chunk with choices (vLLM's
// continuous_usage_stats) tells the usage so far, when the request asked
// for it, except on the chunk whose finish_reason is set when the request
// generates one sequence (single): that usage counts the whole answer
// already, so a stream cut before its usage chunk is charged it; else
// (once) the engine sends no usage but its final count, whatever its
// chunk holds. The chunk's line may come in parts: what its start said of
// choices and finish_reason is kept from the read before (lch, lfin), and
// a usage object that no choices preceded waits for its line's end
// (pend). It allocates nothing.
func (u *usage) judge(b []byte) {
	if u.once && !u.follow {
		// Every usage is the final count: no line to follow (the usual
		// stream, which asked no continuous usage). Unless the engine sends
		// the usage so far unasked (vLLM's --enable-force-include-usage
		// makes should_include_usage (True, True)): a usage on a chunk whose
		// choices, before it in this read, have a null finish_reason. From
		// then on the stream's lines are followed as continuous usage's.
		if !u.hit || !u.generating(b) {
			u.final = u.final || u.hit
			u.hit = false
			u.midLine = len(b) > 0 && b[len(b)-1] != '\n' && b[len(b)-1] != '\r'
			return
		}
		u.follow = true
	}
	if u.pend && !u.hit {
		if i := lineBreak(b); i >= 0 {
			u.pend = false
			u.final = u.finalLine(u.lineChoices(b[:i]), u.lineFinished(b[:i]))
		}
	}
	if u.hit {
		u.hit = false
		u.judgeHit(b)
	}
	// The line b ends in, for the next read.
	rest := b
	if i := lastLineBreak(b); i >= 0 {
		rest = b[i+1:]
		u.lch, u.lfin, u.nltail = choicesAbsent, choicesAbsent, 0
		if len(rest) == 0 {
			return // the common end of a read: an event's
		}
		u.lch, u.lfin = choices(rest), finished(rest)
	} else {
		u.lch, u.lfin = u.lineChoices(b), u.lineFinished(b)
	}
	if len(rest) >= choicesSpan {
		u.nltail = copy(u.ltail[:], rest[len(rest)-choicesSpan:])
	} else {
		keep := min(u.nltail, choicesSpan-len(rest))
		copy(u.ltail[:], u.ltail[u.nltail-keep:u.nltail])
		u.nltail = keep + copy(u.ltail[keep:], rest)
	}
}

// judgeHit judges the usage object of the read b at [hitKey, hitEnd).
func (u *usage) judgeHit(b []byte) {
	k, e := max(u.hitKey, 0), max(u.hitEnd, 0)
	// What its line says of choices before it: in b, or from the reads
	// before when the line began there.
	var c, f uint8
	if i := lastLineBreak(b[:k]); i >= 0 {
		c, f = choices(b[i+1:k]), finished(b[i+1:k])
	} else {
		c, f = u.lineChoices(b[:k]), u.lineFinished(b[:k])
	}
	switch c {
	case choicesSome:
		// The usage so far, or the whole count on the finish_reason
		// chunk of a single sequence (its choices, finish_reason in
		// them, come before its usage).
		u.final = u.finalLine(c, f)
		return
	case choicesNone:
		u.final = true
		return
	}
	// No choices before the usage: the rest of its line tells.
	if i := lineBreak(b[e:]); i >= 0 {
		u.final = u.finalLine(choices(b[e:e+i]), finished(b[e:e+i]))
		return
	}
	u.pend = true
}

// generating reports whether the usage object of the read b at hitKey
// follows, on its line, choices whose finish_reason is null: the usage so
// far, on a chunk that says the answer goes on. Its line begins in b, or
// at b's start when the read before ended a line (midLine false). Anything
// else (a usage chunk, a finish_reason set, a line begun in an earlier
// read, which no line following tells here) is taken as the final count.
func (u *usage) generating(b []byte) bool {
	k := max(u.hitKey, 0)
	i := lastLineBreak(b[:k])
	if i < 0 && u.midLine {
		return false
	}
	return choices(b[i+1:k]) == choicesSome && finished(b[i+1:k]) == finishNull
}

// finalLine reports whether a usage object on a chunk whose whole line
// says c of its choices and f of a finish_reason is the engine's final
// count: the usage chunk's (no choices), or with continuous usage that of
// a single sequence's finish_reason chunk (single).
func (u *usage) finalLine(c, f uint8) bool {
	return c == choicesAbsent || c == choicesNone || c == choicesSome && f == finishSet && u.single
}

// lineChoices is what the line kept from the reads before (lch, ltail),
// followed by p, says of its choices.
func (u *usage) lineChoices(p []byte) uint8 { return u.lineSays(u.lch, p, false) }

// lineFinished is what the line kept from the reads before (lfin, ltail),
// followed by p, says of a finish_reason (finished).
func (u *usage) lineFinished(p []byte) uint8 { return u.lineSays(u.lfin, p, true) }

// lineSays is what the line says of its choices, or with fin of a
// finish_reason (their values read alike): kept, what the reads before
// told, when it told; else what p tells; else, when a key or its value was
// cut by the read boundary, what the line's kept tail joined to p tells.
func (u *usage) lineSays(kept uint8, p []byte, fin bool) uint8 {
	read := func(q []byte) uint8 {
		if fin {
			return finished(q)
		}
		return choices(q)
	}
	if kept == choicesNone || kept == choicesSome {
		return kept
	}
	c := read(p)
	if c == choicesNone || c == choicesSome || u.nltail == 0 {
		return c
	}
	var w [2 * choicesSpan]byte
	n := copy(w[:], u.ltail[:u.nltail])
	n += copy(w[n:], p[:min(len(p), choicesSpan)])
	if cj := read(w[:n]); cj != choicesAbsent {
		return cj
	}
	return c
}

// lineBreak is the index of the first line break (LF or CR) in p, or -1.
// A CR is looked for only before the first LF: a stream framed by LFs
// has none.
func lineBreak(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		return bytes.IndexByte(p, '\r')
	}
	if j := bytes.IndexByte(p[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// lastLineBreak is the index of the last line break in p, or -1. It
// reads p back to its last LF only (bytes.LastIndexByte is not
// vectorised): a line's length.
func lastLineBreak(p []byte) int {
	if n := len(p); n > 0 && (p[n-1] == '\n' || p[n-1] == '\r') {
		return n - 1
	}
	i := bytes.LastIndexByte(p, '\n')
	if j := bytes.LastIndexByte(p[i+1:], '\r'); j >= 0 {
		return i + 1 + j
	}
	return i
}

// What a part of an event's data says of its choices (choices).
const (
	choicesAbsent uint8 = iota // no "choices" key
	choicesNone                // "choices":[] or "choices":null
	choicesSome                // any other value
	choicesCut                 // the key, and the part ends before its value tells
)

// What a part of an event's data says of a finish_reason (finished): the
// values of choices, read alike.
const (
	finishNull = choicesNone // "finish_reason":null
	finishSet  = choicesSome // any other value: the choice ended
)

var (
	keyChoices = []byte(`"choices"`)
	keyFinish  = []byte(`"finish_reason"`)
)

// finished reads the value of the first "finish_reason" key in p, a part
// of a chat or completions chunk's line: choicesAbsent without one,
// finishNull, finishSet, or choicesCut when p ends before its value.
func finished(p []byte) uint8 {
	i := indexKey(p, keyFinish)
	if i < 0 {
		return choicesAbsent
	}
	v := p[i+len(keyFinish):]
	j := 0
	for j < len(v) && (v[j] == ' ' || v[j] == ':' || v[j] == '\t') {
		j++
	}
	if j == len(v) {
		return choicesCut
	}
	if v[j] == 'n' {
		return finishNull
	}
	return finishSet
}

// choices reads the value of the "choices" key in p, a part of a chat
// chunk's line (a key escaped in a string does not match).
func choices(p []byte) uint8 {
	i := indexKey(p, keyChoices)
	if i < 0 {
		return choicesAbsent
	}
	v := p[i+len(keyChoices):]
	j := 0
	for j < len(v) && (v[j] == ' ' || v[j] == ':' || v[j] == '\t') {
		j++
	}
	if j == len(v) {
		return choicesCut
	}
	switch v[j] {
	case 'n':
		return choicesNone // null
	case '[':
		j++
		for j < len(v) && (v[j] == ' ' || v[j] == '\t') {
			j++
		}
		if j == len(v) {
			return choicesCut
		}
		if v[j] == ']' {
			return choicesNone
		}
	}
	return choicesSome
}

// settled reports whether the usage read is the answer's own, complete
// count, which stands however the answer ended after it (the client left,
// the engine's connection broke before its stream's end): a whole usage
// object, and in an event stream (sse) the one an engine ends it with
// (final).
func (u *usage) settled(sse bool) bool { return u.seen && u.whole && (u.final || !sse) }

// forget drops what was read: a partial answer's usage is not its own.
func (u *usage) forget() { u.reset() }

// reset clears u for another answer (the carry's bytes are dead once
// ncarry is 0).
func (u *usage) reset() { u.usageState = usageState{} }

// record counts the usage in the metrics and on the worker that served it
// (nil when unknown), whose cached share of prompt tokens is its hit rate.
func (u *usage) record(w *fleet.Worker) {
	if !u.known() {
		return
	}
	mPromptTokens.Add(u.prompt)
	mOutputTokens.Add(u.completion)
	mCachedTokens.Add(u.cached)
	if w != nil {
		w.CountUsage(u.prompt, u.cached)
	}
}
