package h1

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"math/bits"
	"net"
	"os"
)

// Limits of a response head.
const (
	// ReadBufSize is the size of the bufio.Reader a head is read from: a
	// header line longer than it is ErrHeaderSize.
	ReadBufSize  = 16 << 10
	MaxHeaderLen = 64 << 10
	MaxHeaders   = 100
	// MaxInterim bounds the interim (1xx) answers skipped before the
	// final one, and MaxInterimLen their bytes together: an engine that
	// sends them without end does not hold the request.
	MaxInterim    = 8
	MaxInterimLen = MaxHeaderLen
	// MaxConnTokens is the capacity of Connection token spans a Head
	// keeps between responses; an engine that names more gets them for
	// its response only.
	MaxConnTokens = 64
)

// What makes a response head invalid (Invalid reports them all).
var (
	ErrMalformed  = errors.New("malformed response from worker")
	ErrUpgrade    = errors.New("worker switched protocols (101)")
	ErrHeaderSize = errors.New("response header from worker too large")
	ErrInterim    = errors.New("too many interim (1xx) responses from worker")
	ErrHeadCut    = errors.New("the worker's response head broke off")
)

// Invalid reports whether err says the engine answered something that is
// not a usable HTTP/1.1 response head (502 upstream_protocol_error).
func Invalid(err error) bool {
	return errors.Is(err, ErrMalformed) || errors.Is(err, ErrUpgrade) || errors.Is(err, ErrHeaderSize) ||
		errors.Is(err, ErrInterim) || errors.Is(err, ErrHeadCut)
}

// Head is a response head: status, headers and framing.
type Head struct {
	Code       int
	Buf        []byte   // the header fields, copied out of the reader
	Hdrs       []Field  // the header fields in order; no value holds a control byte but HT (ValidValue)
	CType      [2]int   // Content-Type value span (0,0 = none)
	ConnTokens [][2]int // spans of the tokens of Connection headers
	CLen       int64    // -1 unknown
	Chunked    bool
	CloseAfter bool // Connection: close, HTTP/1.0, or no framing (read to EOF)

	fieldLen int // bytes of names and values, which MaxHeaderLen bounds
}

// Field is a header field of a Head: the spans of its name and value in
// Buf, and what its name is.
type Field struct {
	Name, Value [2]int
	Kind        Kind
}

// Kind is what a header name is to HTTP/1.1, told once when the head is
// read (KindOf): the framing headers, and the hop-by-hop ones (RFC 9110
// section 7.6.1, and their common relatives), which are never relayed.
type Kind uint8

// Kinds of header names.
const (
	Other Kind = iota // an end-to-end header
	ContentLength
	ContentType
	TransferEncoding // hop-by-hop
	Connection       // hop-by-hop
	HopByHop         // any other hop-by-hop header: Keep-Alive, TE, Trailer, Upgrade, Proxy-*
)

// Hop reports whether a header of kind k is meaningful for one connection
// only, and so never forwarded in either direction.
func (k Kind) Hop() bool { return k >= TransferEncoding }

// KindOf tells what header name n is, by its length first: one comparison
// or two per name, not one per kind.
func KindOf(n []byte) Kind {
	switch len(n) {
	case 2:
		if eqFold(n, "TE") {
			return HopByHop
		}
	case 7:
		if eqFold(n, "Upgrade") || eqFold(n, "Trailer") {
			return HopByHop
		}
	case 10:
		if eqFold(n, "Connection") {
			return Connection
		}
		if eqFold(n, "Keep-Alive") {
			return HopByHop
		}
	case 12:
		if eqFold(n, "Content-Type") {
			return ContentType
		}
	case 14:
		if eqFold(n, "Content-Length") {
			return ContentLength
		}
	case 16:
		if eqFold(n, "Proxy-Connection") {
			return HopByHop
		}
	case 17:
		if eqFold(n, "Transfer-Encoding") {
			return TransferEncoding
		}
	case 18:
		if eqFold(n, "Proxy-Authenticate") {
			return HopByHop
		}
	case 19:
		if eqFold(n, "Proxy-Authorization") {
			return HopByHop
		}
	}
	return Other
}

// Reset clears h for the next response, keeping its buffers.
func (h *Head) Reset() {
	h.Code = 0
	h.Buf = h.Buf[:0]
	h.Hdrs = h.Hdrs[:0]
	h.CType = [2]int{}
	h.ConnTokens = h.ConnTokens[:0]
	if cap(h.ConnTokens) > MaxConnTokens {
		h.ConnTokens = nil // a hostile engine's long list is not kept for the connection's life
	}
	h.CLen = -1
	h.Chunked, h.CloseAfter = false, false
	h.fieldLen = 0
}

// Read resets h and reads a response head from br. Interim answers (100
// Continue, 103 Early Hints, any 1xx but 101) are skipped, at most
// MaxInterim of them and MaxInterimLen bytes together, if their framing
// headers are valid; 101 Switching
// Protocols is ErrUpgrade. A read error before any byte is returned as
// is; after the first byte it is ErrHeadCut (a timeout stays a timeout).
func (h *Head) Read(br *bufio.Reader) error {
	lr := lineReader{br: br}
	err := h.read(&lr)
	lr.done()
	return err
}

func (h *Head) read(lr *lineReader) error {
	h.Reset()
	interim, interimLen := 0, 0
	for {
		line, err := lr.next()
		if err != nil {
			if err == bufio.ErrBufferFull {
				return ErrHeaderSize
			}
			if len(line) > 0 || interim > 0 {
				return headCut(err)
			}
			return err
		}
		st, http10, ok := ParseStatusLine(line)
		if !ok {
			return ErrMalformed
		}
		headLen, err := h.readHeaders(lr)
		if err != nil {
			return headCut(err)
		}
		if st == 101 {
			return ErrUpgrade
		}
		if st < 200 {
			interim++
			interimLen += len(line) + headLen
			if interim > MaxInterim || interimLen > MaxInterimLen {
				return ErrInterim
			}
			// Its framing headers are judged as a final head's: Go's
			// net/http (the worker's engine client) fails the answer on
			// an interim head with two Content-Lengths or a coding but
			// chunked.
			if err := h.frame(); err != nil {
				return err
			}
			h.Reset()
			continue
		}
		h.Code = st
		if err := h.frame(); err != nil {
			return err
		}
		if http10 {
			if h.Chunked {
				return ErrMalformed // chunked framing does not exist in HTTP/1.0: ambiguous, refuse
			}
			h.CloseAfter = true
		}
		return nil
	}
}

// headCut classifies a read error after the first bytes of a response
// head: the worker answered, then broke off (a close, a reset), which is an
// invalid response, not a connection that could not be used (a stale
// keep-alive connection gives its error before any byte). A timeout stays
// a timeout.
func headCut(err error) error {
	if isTimeout(err) || errors.Is(err, ErrHeaderSize) || errors.Is(err, ErrMalformed) {
		return err
	}
	return ErrHeadCut
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ParseStatusLine parses "HTTP/1.x NNN reason". A code outside 100-599
// is no answer (RFC 9110 section 15: invalid, to be taken as a 5xx): the
// router would have relayed a 600 to its client as it came. The reason
// phrase holds no control byte but HT (RFC 9112 section 4: HTAB, SP,
// VCHAR, obs-text): a CR inside it (a bare CR, which RFC 9112 section 2.2
// lets a recipient read as a line end) would split the line where another
// reader of the same bytes does not.
func ParseStatusLine(line []byte) (status int, http10, ok bool) {
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') || line[8] != ' ' {
		return 0, false, false
	}
	d := line[9:12]
	if d[0] < '1' || d[0] > '5' || d[1] < '0' || d[1] > '9' || d[2] < '0' || d[2] > '9' {
		return 0, false, false
	}
	if len(line) > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n' {
		return 0, false, false
	}
	if len(line) > 12 && !ValidValue(TrimCRLF(line[12:])) {
		return 0, false, false
	}
	return int(d[0]-'0')*100 + int(d[1]-'0')*10 + int(d[2]-'0'), line[7] == '0', true
}

// readHeaders reads a header section into Buf and Hdrs; n is the number
// of bytes it read.
func (h *Head) readHeaders(lr *lineReader) (n int, err error) {
	for {
		line, err := lr.next()
		if err != nil {
			if err == bufio.ErrBufferFull {
				return n, ErrHeaderSize
			}
			return n, err
		}
		n += len(line)
		line = TrimCRLF(line)
		if len(line) == 0 {
			return n, nil
		}
		if len(h.Hdrs) >= MaxHeaders || h.fieldLen+len(line) > MaxHeaderLen {
			return n, ErrHeaderSize
		}
		colon, vs, ve, ok := splitField(line)
		if !ok {
			return n, ErrMalformed
		}
		h.add(line, colon, vs, ve)
	}
}

// add copies the header field of line (splitField's offsets) into Buf and
// Hdrs, its name and value in one piece with what separates them when
// that is short (": "): Buf then never holds much more than MaxHeaderLen
// bytes.
func (h *Head) add(line []byte, colon, vs, ve int) {
	h.fieldLen += colon + ve - vs
	off := len(h.Buf)
	if vs-colon <= 2 {
		h.Buf = append(h.Buf, line[:ve]...)
		vs, ve = off+vs, off+ve
	} else {
		h.Buf = append(h.Buf, line[:colon]...)
		h.Buf = append(h.Buf, line[vs:ve]...)
		vs, ve = off+colon, len(h.Buf)
	}
	h.Hdrs = append(h.Hdrs, Field{Name: [2]int{off, off + colon}, Value: [2]int{vs, ve}, Kind: KindOf(line[:colon])})
}

// lineReader reads the lines of a head from a bufio.Reader: those already
// buffered in place, from one Peek, the others by ReadSlice, which waits
// for them. The reader is where ReadSlice alone would have left it once
// done is called.
type lineReader struct {
	br   *bufio.Reader
	win  []byte // buffered bytes, from Peek
	used int    // bytes of win read (not yet discarded)
}

// next returns the next line, '\n' included, as bufio.Reader.ReadSlice.
func (r *lineReader) next() ([]byte, error) {
	if i := bytes.IndexByte(r.win[r.used:], '\n'); i >= 0 {
		line := r.win[r.used : r.used+i+1]
		r.used += i + 1
		return line, nil
	}
	r.done()
	r.win = nil
	line, err := r.br.ReadSlice('\n')
	if err == nil {
		// What came with the line: no fill, so line stays valid.
		r.win, _ = r.br.Peek(r.br.Buffered())
	}
	return line, err
}

// done discards the lines read from the buffer.
func (r *lineReader) done() {
	if r.used > 0 {
		r.br.Discard(r.used)
		r.win, r.used = r.win[r.used:], 0
	}
}

// HeaderLine splits a header field line (its line end trimmed) into its
// name and its value (OWS trimmed), or reports ErrMalformed: no name,
// obsolete line folding, a space or a control byte in the name, a control
// byte in the value.
func HeaderLine(line []byte) (name, val []byte, err error) {
	colon, vs, ve, ok := splitField(line)
	if !ok {
		return nil, nil, ErrMalformed
	}
	return line[:colon], line[vs:ve], nil
}

// splitField is HeaderLine by offsets in line: the name is line[:colon],
// the value line[vs:ve]; ok is false for a malformed line.
func splitField(line []byte) (colon, vs, ve int, ok bool) {
	// The first colon ends the name, unless a byte no name may hold (a
	// space, HT, control byte, DEL or above) comes before it: one pass
	// over the name finds the colon and judges the bytes before it.
	colon = nameEnd(line)
	if colon == 0 || colon == len(line) || line[colon] != ':' {
		return 0, 0, 0, false // no name, obsolete line folding, a bad byte in the name, or no colon
	}
	vs, ve = colon+1, len(line)
	for vs < ve && (line[vs] == ' ' || line[vs] == '\t') {
		vs++
	}
	for ve > vs && (line[ve-1] == ' ' || line[ve-1] == '\t') {
		ve--
	}
	return colon, vs, ve, ValidValue(line[vs:ve])
}

// ValidValue reports whether v holds no control byte but HT (what net/http
// takes in a header value; obs-text is taken).
func ValidValue(v []byte) bool {
	// Eight bytes at a time while none is below ' ' or DEL (an HT, rare,
	// is judged by the byte loop), the last eight overlapping the ones
	// before; four and four overlapping below eight.
	n := len(v)
	switch {
	case n >= 8:
		for i := 0; i < n-8; i += 8 {
			if !plainValueWord(binary.LittleEndian.Uint64(v[i:])) {
				return validValueBytes(v[i:])
			}
		}
		if !plainValueWord(binary.LittleEndian.Uint64(v[n-8:])) {
			return validValueBytes(v[n-8:])
		}
		return true
	case n >= 4 && plainValueWord(ends4(v)):
		return true
	}
	return validValueBytes(v)
}

// plainValueWord reports whether no byte of x is below ' ' or DEL.
func plainValueWord(x uint64) bool { return !hasLess(x, ' ') && !hasZero(x^(lsb*0x7f)) }

func validValueBytes(v []byte) bool {
	for _, ch := range v {
		if (ch < ' ' && ch != '\t') || ch == 0x7f {
			return false
		}
	}
	return true
}

// plainName reports whether a header name holds no space, control byte,
// DEL or byte above it (what HeaderLine refuses in a name), eight bytes at
// a time as ValidValue.
func plainName(k []byte) bool {
	n := len(k)
	switch {
	case n >= 8:
		for i := 0; i < n-8; i += 8 {
			if !plainNameWord(binary.LittleEndian.Uint64(k[i:])) {
				return false
			}
		}
		return plainNameWord(binary.LittleEndian.Uint64(k[n-8:]))
	case n >= 4:
		return plainNameWord(ends4(k))
	}
	for _, ch := range k {
		if ch <= ' ' || ch >= 0x7f {
			return false
		}
	}
	return true
}

// nameEnd returns the index of the first byte of b that is a colon or no
// plainName byte, len(b) if there is none; eight bytes at a time, the last
// eight overlapping the ones before.
func nameEnd(b []byte) int {
	n := len(b)
	if n < 8 {
		for i, c := range b {
			if c <= ' ' || c >= 0x7f || c == ':' {
				return i
			}
		}
		return n
	}
	for i := 0; i < n-8; i += 8 {
		if m := nameStops(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	if m := nameStops(binary.LittleEndian.Uint64(b[n-8:])); m != 0 {
		return n - 8 + bits.TrailingZeros64(m)/8
	}
	return n
}

// nameStops has the high bit set of the lowest byte of x that is a colon or
// no plainName byte (and maybe of bytes above it, which nameEnd does not
// look at): each term is exact in its lowest byte (hasLess), so their
// union is in the lowest of all.
func nameStops(x uint64) uint64 {
	return x&(lsb*0x80) | lessBytes(x, ' '+1) | lessBytes(x^(lsb*0x7f), 1) | lessBytes(x^(lsb*':'), 1)
}

// plainNameWord reports whether every byte of x is above ' ' and below DEL.
func plainNameWord(x uint64) bool {
	return x&(lsb*0x80) == 0 && !hasLess(x, ' '+1) && !hasZero(x^(lsb*0x7f))
}

// ends4 packs the first four bytes of b (4 <= len(b) <= 8) and its last
// four, overlapping, into one word: every byte of b is in it.
func ends4(b []byte) uint64 {
	return uint64(binary.LittleEndian.Uint32(b)) | uint64(binary.LittleEndian.Uint32(b[len(b)-4:]))<<32
}

// lsb has the low bit of every byte of a word set: lsb*c is c in every byte.
const lsb = 0x0101010101010101

// hasLess reports whether a byte of x is below n (n <= 128). Exact: the
// lowest such byte borrows from no byte below it, so its high bit is set
// in x-n and clear in x.
func hasLess(x uint64, n byte) bool { return lessBytes(x, n) != 0 }

// lessBytes is hasLess's word: the high bit of the lowest byte of x below n
// is set, and maybe those of bytes above it.
func lessBytes(x uint64, n byte) uint64 { return (x - lsb*uint64(n)) &^ x & (lsb * 0x80) }

// hasZero reports whether a byte of x is zero.
func hasZero(x uint64) bool { return hasLess(x, 1) }

// TrimCRLF removes a trailing "\n" or "\r\n".
func TrimCRLF(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// TrimOWS removes leading and trailing spaces and tabs.
func TrimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// frame reads the framing headers: Content-Length, Transfer-Encoding,
// Connection (and the headers it names), Content-Type.
func (h *Head) frame() error {
	h.CLen = -1
	teSeen := false
	var clv []byte // the first Content-Length value
	for i := range h.Hdrs {
		f := &h.Hdrs[i]
		switch f.Kind {
		case ContentLength:
			v := h.Buf[f.Value[0]:f.Value[1]]
			// Several are spelt alike, as Go's net/http takes them (with
			// which the worker reads its engine): 5 beside 05 is refused.
			n, ok := parseContentLength(v)
			if !ok || (clv != nil && !bytes.Equal(clv, v)) {
				return ErrMalformed
			}
			clv, h.CLen = v, n
		case TransferEncoding:
			// Exactly one transfer coding, chunked, as Go's net/http
			// accepts: any other coding (gzip, chunked) would reach the
			// client still coded, with nothing saying so; chunked twice
			// is not HTTP (RFC 9112 6.1).
			if teSeen || !EqFold(h.Buf[f.Value[0]:f.Value[1]], "chunked") {
				return ErrMalformed
			}
			teSeen = true
			h.Chunked = true
		case Connection:
			h.addConnTokens(f.Value[0], f.Value[1])
		case ContentType:
			h.CType = f.Value
		}
	}
	if teSeen && h.CLen >= 0 {
		return ErrMalformed // both framings: refuse (smuggling)
	}
	switch {
	case h.Code == 204 || h.Code == 304:
		h.CLen, h.Chunked = 0, false
	case h.Chunked:
	case h.CLen >= 0:
	default:
		h.CloseAfter = true // body ends when the connection closes
	}
	return nil
}

// addConnTokens records the spans of the comma-separated tokens of a
// Connection header value at Buf[vs:ve], all of them (every header a token
// names is hop-by-hop), and notes "close". The spans' slice keeps its
// capacity (up to MaxConnTokens) from one response to the next: no
// allocation per response.
func (h *Head) addConnTokens(vs, ve int) {
	i := vs
	for i < ve {
		j := i
		for j < ve && h.Buf[j] != ',' {
			j++
		}
		s, e := i, j
		for s < e && (h.Buf[s] == ' ' || h.Buf[s] == '\t') {
			s++
		}
		for e > s && (h.Buf[e-1] == ' ' || h.Buf[e-1] == '\t') {
			e--
		}
		if e > s {
			if EqFold(h.Buf[s:e], "close") {
				h.CloseAfter = true
			}
			h.ConnTokens = append(h.ConnTokens, [2]int{s, e})
		}
		i = j + 1
	}
}

// NamedByConnection reports whether header k is named by the response's
// Connection header (and so hop-by-hop).
func (h *Head) NamedByConnection(k []byte) bool {
	for _, t := range h.ConnTokens {
		if EqFoldBytes(k, h.Buf[t[0]:t[1]]) {
			return true
		}
	}
	return false
}

// Header returns the i-th header's key and value.
func (h *Head) Header(i int) ([]byte, []byte) {
	f := &h.Hdrs[i]
	return h.Buf[f.Name[0]:f.Name[1]], h.Buf[f.Value[0]:f.Value[1]]
}

func parseContentLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	return n, true
}

// EqFold compares b and s as ASCII, ignoring case: byte by byte, b[i]|0x20
// is s[i]|0x20. Names of different lengths are told apart inline.
func EqFold(b []byte, s string) bool { return len(b) == len(s) && eqFold(b, s) }

// eqFold is EqFold for b and s of one length, eight bytes at a time (the
// last eight overlapping the ones before when the length is not a
// multiple).
func eqFold(b []byte, s string) bool {
	n := len(b)
	if len(s) != n {
		return false
	}
	const fold = lsb * 0x20
	if n < 8 {
		if n < 4 {
			for i := 0; i < n; i++ {
				if b[i]|0x20 != s[i]|0x20 {
					return false
				}
			}
			return true
		}
		// The first four bytes and the last four, overlapping.
		return (binary.LittleEndian.Uint32(b)^le32(s))&^0x20202020 == 0 &&
			(binary.LittleEndian.Uint32(b[n-4:])^le32(s[n-4:]))&^0x20202020 == 0
	}
	for i := 0; i < n-8; i += 8 {
		if (binary.LittleEndian.Uint64(b[i:])^le64(s[i:]))&^fold != 0 {
			return false
		}
	}
	return (binary.LittleEndian.Uint64(b[n-8:])^le64(s[n-8:]))&^fold == 0
}

// le32 is binary.LittleEndian.Uint32 of a string's first four bytes.
func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

// le64 is binary.LittleEndian.Uint64 of a string's first eight bytes (one
// load: the compiler combines the bytes').
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// EqFoldBytes compares a and b as ASCII, ignoring case.
func EqFoldBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i]|0x20 != b[i]|0x20 {
			return false
		}
	}
	return true
}

// ValidName reports whether k is an RFC 9110 token, what Go's net/http and
// h11 take as a field name: a head h1 reads may carry other names (the
// router drops those headers, and so does the worker, whose net/http would
// fail the whole answer on one).
func ValidName(k []byte) bool {
	if len(k) == 0 {
		return false
	}
	for _, c := range k {
		if !tokenChar[c] {
			return false
		}
	}
	return true
}

// tokenChar marks the RFC 9110 tchar bytes.
var tokenChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()
