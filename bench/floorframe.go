package bench

import (
	"bytes"
	"strconv"
)

// frame finds where an upstream HTTP/1.1 response ends, for the reference
// proxies of bench naive-proxy (the epoll loop and the lean goroutine
// relay): the least parsing a keep-alive relay needs. The head is assumed
// to arrive in the first read.
type frame struct {
	head     bool // head seen
	clen     int  // body bytes left (Content-Length), -1 chunked
	chunk    int  // chunked: data bytes left in the current chunk
	cstate   int  // chunked parser state
	trailers int  // chunked: bytes of the current trailer line
}

const (
	csSize = iota
	csSizeExt
	csSizeLF
	csData
	csDataCR
	csDataLF
	csTrailer
	csTrailerLF
	csDone
)

// scan advances over b, the next bytes of the response, and reports
// whether the response ended; ok is false when the head is not whole.
func (u *frame) scan(b []byte) (done, ok bool) {
	body := b
	if !u.head {
		h := bytes.Index(b, crlfcrlf)
		if h < 0 {
			return false, false
		}
		u.head = true
		if indexFold(b[:h], teKey) >= 0 {
			u.clen = -1
		} else {
			u.clen = headerInt(b[:h], clenKey)
		}
		body = b[h+4:]
	}
	if u.clen >= 0 {
		u.clen -= len(body)
		return u.clen <= 0, true
	}
	return u.chunked(body), true
}

// requestEnd returns the length of the whole request at the start of b
// (head and Content-Length body), or 0 when it has not all arrived.
func requestEnd(b []byte) int {
	h := bytes.Index(b, crlfcrlf)
	if h < 0 {
		return 0
	}
	if need := h + 4 + headerInt(b[:h], clenKey); len(b) >= need {
		return need
	}
	return 0
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	clenKey  = []byte("\ncontent-length:")
	teKey    = []byte("\ntransfer-encoding:")
)

// headerInt returns the value of the header named by key (lower case,
// with its leading newline) in head, 0 when absent.
func headerInt(head, key []byte) int {
	i := indexFold(head, key)
	if i < 0 {
		return 0
	}
	v := head[i+len(key):]
	if j := bytes.IndexByte(v, '\r'); j >= 0 {
		v = v[:j]
	}
	n, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
	return n
}

func indexFold(s, key []byte) int {
	for i := 0; i+len(key) <= len(s); i++ {
		if s[i] == '\n' && bytes.EqualFold(s[i:i+len(key)], key) {
			return i
		}
	}
	return -1
}

// chunked advances the chunked-encoding parser over b and reports whether
// the body ended.
func (u *frame) chunked(b []byte) bool {
	for i := 0; i < len(b); i++ {
		ch := b[i]
		switch u.cstate {
		case csSize:
			switch {
			case ch >= '0' && ch <= '9':
				u.chunk = u.chunk<<4 | int(ch-'0')
			case ch >= 'a' && ch <= 'f':
				u.chunk = u.chunk<<4 | int(ch-'a'+10)
			case ch >= 'A' && ch <= 'F':
				u.chunk = u.chunk<<4 | int(ch-'A'+10)
			case ch == '\r':
				u.cstate = csSizeLF
			default:
				u.cstate = csSizeExt
			}
		case csSizeExt:
			if ch == '\r' {
				u.cstate = csSizeLF
			}
		case csSizeLF:
			if u.chunk == 0 {
				u.cstate = csTrailer
			} else {
				u.cstate = csData
			}
		case csData:
			k := min(u.chunk, len(b)-i)
			u.chunk -= k
			i += k - 1
			if u.chunk == 0 {
				u.cstate = csDataCR
			}
		case csDataCR:
			u.cstate = csDataLF
		case csDataLF:
			u.cstate = csSize
		case csTrailer:
			if ch == '\r' {
				u.cstate = csTrailerLF
			} else {
				u.trailers++
			}
		case csTrailerLF:
			if u.trailers == 0 {
				u.cstate = csDone
				return true
			}
			u.trailers = 0
			u.cstate = csTrailer
		}
	}
	return u.cstate == csDone
}
