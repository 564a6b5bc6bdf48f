package h1

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
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
	Buf        []byte   // the header block, copied out of the reader
	Hdrs       [][4]int // key start, key end, value start, value end in Buf
	CType      [2]int   // Content-Type value span (0,0 = none)
	ConnTokens [][2]int // spans of the tokens of Connection headers
	CLen       int64    // -1 unknown
	Chunked    bool
	CloseAfter bool // Connection: close, HTTP/1.0, or no framing (read to EOF)
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
}

// Read resets h and reads a response head from br. Interim answers (100
// Continue, 103 Early Hints, any 1xx but 101) are skipped, at most
// MaxInterim of them and MaxInterimLen bytes together, if their framing
// headers are valid; 101 Switching
// Protocols is ErrUpgrade. A read error before any byte is returned as
// is; after the first byte it is ErrHeadCut (a timeout stays a timeout).
func (h *Head) Read(br *bufio.Reader) error {
	h.Reset()
	interim, interimLen := 0, 0
	for {
		line, err := br.ReadSlice('\n')
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
		headLen, err := h.readHeaders(br)
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

// ParseStatusLine parses "HTTP/1.x NNN reason".
func ParseStatusLine(line []byte) (status int, http10, ok bool) {
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') || line[8] != ' ' {
		return 0, false, false
	}
	d := line[9:12]
	if d[0] < '1' || d[0] > '9' || d[1] < '0' || d[1] > '9' || d[2] < '0' || d[2] > '9' {
		return 0, false, false
	}
	if len(line) > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n' {
		return 0, false, false
	}
	return int(d[0]-'0')*100 + int(d[1]-'0')*10 + int(d[2]-'0'), line[7] == '0', true
}

// readHeaders reads a header section into Buf and Hdrs; n is the number
// of bytes it read.
func (h *Head) readHeaders(br *bufio.Reader) (n int, err error) {
	for {
		line, err := br.ReadSlice('\n')
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
		if len(h.Hdrs) >= MaxHeaders || len(h.Buf)+len(line) > MaxHeaderLen {
			return n, ErrHeaderSize
		}
		name, val, err := HeaderLine(line)
		if err != nil {
			return n, err
		}
		off := len(h.Buf)
		h.Buf = append(h.Buf, name...)
		vs := len(h.Buf)
		h.Buf = append(h.Buf, val...)
		h.Hdrs = append(h.Hdrs, [4]int{off, vs, vs, len(h.Buf)})
	}
}

// HeaderLine splits a header field line (its line end trimmed) into its
// name and its value (OWS trimmed), or reports ErrMalformed: no name,
// obsolete line folding, a space or a control byte in the name, a control
// byte in the value.
func HeaderLine(line []byte) (name, val []byte, err error) {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || line[0] == ' ' || line[0] == '\t' {
		return nil, nil, ErrMalformed // no name, or obsolete line folding
	}
	name = line[:colon]
	if !plainName(name) {
		return nil, nil, ErrMalformed
	}
	val = TrimOWS(line[colon+1:])
	if !ValidValue(val) {
		return nil, nil, ErrMalformed
	}
	return name, val, nil
}

// ValidValue reports whether v holds no control byte but HT (what net/http
// takes in a header value; obs-text is taken).
func ValidValue(v []byte) bool {
	i := 0
	// Eight bytes at a time while none is below ' ' or DEL (an HT, rare,
	// is judged by the byte loop).
	for ; len(v)-i >= 8; i += 8 {
		x := binary.LittleEndian.Uint64(v[i:])
		if hasLess(x, ' ') || hasZero(x^(lsb*0x7f)) {
			break
		}
	}
	for _, ch := range v[i:] {
		if (ch < ' ' && ch != '\t') || ch == 0x7f {
			return false
		}
	}
	return true
}

// plainName reports whether a header name holds no space, control byte,
// DEL or byte above it (what HeaderLine refuses in a name).
func plainName(k []byte) bool {
	i := 0
	for ; len(k)-i >= 8; i += 8 {
		x := binary.LittleEndian.Uint64(k[i:])
		if x&(lsb*0x80) != 0 || hasLess(x, ' '+1) || hasZero(x^(lsb*0x7f)) {
			return false
		}
	}
	for _, ch := range k[i:] {
		if ch <= ' ' || ch >= 0x7f {
			return false
		}
	}
	return true
}

// lsb has the low bit of every byte of a word set: lsb*c is c in every byte.
const lsb = 0x0101010101010101

// hasLess reports whether a byte of x is below n (n <= 128). Exact: the
// lowest such byte borrows from no byte below it, so its high bit is set
// in x-n and clear in x.
func hasLess(x uint64, n byte) bool { return (x-lsb*uint64(n))&^x&(lsb*0x80) != 0 }

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
	for _, s := range h.Hdrs {
		k, v := h.Buf[s[0]:s[1]], h.Buf[s[2]:s[3]]
		switch {
		case EqFold(k, "Content-Length"):
			// Several are spelt alike, as Go's net/http takes them (with
			// which the worker reads its engine): 5 beside 05 is refused.
			n, ok := parseContentLength(v)
			if !ok || (clv != nil && !bytes.Equal(clv, v)) {
				return ErrMalformed
			}
			clv, h.CLen = v, n
		case EqFold(k, "Transfer-Encoding"):
			// Exactly one transfer coding, chunked, as Go's net/http
			// accepts: any other coding (gzip, chunked) would reach the
			// client still coded, with nothing saying so; chunked twice
			// is not HTTP (RFC 9112 6.1).
			if teSeen || !EqFold(v, "chunked") {
				return ErrMalformed
			}
			teSeen = true
			h.Chunked = true
		case EqFold(k, "Connection"):
			h.addConnTokens(s[2], s[3])
		case EqFold(k, "Content-Type"):
			h.CType = [2]int{s[2], s[3]}
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
	s := h.Hdrs[i]
	return h.Buf[s[0]:s[1]], h.Buf[s[2]:s[3]]
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
