package h1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// refHead is Head.Read as it was written before the lines were taken from
// the reader's buffer in place and the names classified once: a line at a
// time by ReadSlice, the framing headers found by comparing every name.
// The reference Read must agree with.
type refHead struct {
	Code       int
	Hdrs       [][2][]byte
	CType      []byte
	ConnTokens [][]byte
	CLen       int64
	Chunked    bool
	CloseAfter bool
}

func (h *refHead) reset() {
	*h = refHead{CLen: -1}
}

func (h *refHead) Read(br *bufio.Reader) error {
	h.reset()
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
			if err := h.frame(); err != nil {
				return err
			}
			h.reset()
			continue
		}
		h.Code = st
		if err := h.frame(); err != nil {
			return err
		}
		if http10 {
			if h.Chunked {
				return ErrMalformed
			}
			h.CloseAfter = true
		}
		return nil
	}
}

func (h *refHead) readHeaders(br *bufio.Reader) (n int, err error) {
	size := 0
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
		if len(h.Hdrs) >= MaxHeaders || size+len(line) > MaxHeaderLen {
			return n, ErrHeaderSize
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || line[0] == ' ' || line[0] == '\t' || !plainNameBytewise(line[:colon]) {
			return n, ErrMalformed
		}
		name, val := line[:colon], TrimOWS(line[colon+1:])
		if !validValueBytewise(val) {
			return n, ErrMalformed
		}
		size += len(name) + len(val)
		h.Hdrs = append(h.Hdrs, [2][]byte{bytes.Clone(name), bytes.Clone(val)})
	}
}

func (h *refHead) frame() error {
	h.CLen = -1
	teSeen := false
	var clv []byte
	for _, kv := range h.Hdrs {
		k, v := kv[0], kv[1]
		switch {
		case eqFoldBytewise(k, "Content-Length"):
			n, ok := parseContentLength(v)
			if !ok || (clv != nil && !bytes.Equal(clv, v)) {
				return ErrMalformed
			}
			clv, h.CLen = v, n
		case eqFoldBytewise(k, "Transfer-Encoding"):
			if teSeen || !eqFoldBytewise(v, "chunked") {
				return ErrMalformed
			}
			teSeen = true
			h.Chunked = true
		case eqFoldBytewise(k, "Connection"):
			for _, t := range bytes.Split(v, []byte(",")) {
				if t = TrimOWS(t); len(t) > 0 {
					if eqFoldBytewise(t, "close") {
						h.CloseAfter = true
					}
					h.ConnTokens = append(h.ConnTokens, t)
				}
			}
		case eqFoldBytewise(k, "Content-Type"):
			h.CType = v
		}
	}
	if teSeen && h.CLen >= 0 {
		return ErrMalformed
	}
	switch {
	case h.Code == 204 || h.Code == 304:
		h.CLen, h.Chunked = 0, false
	case h.Chunked:
	case h.CLen >= 0:
	default:
		h.CloseAfter = true
	}
	return nil
}

func (h *refHead) String() string {
	return fmt.Sprintf("%d %q %q %q %d %v %v", h.Code, h.Hdrs, h.CType, h.ConnTokens, h.CLen, h.Chunked, h.CloseAfter)
}

// chunkReader returns at most n bytes a Read.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

// readBoth reads b with Head.Read and with the reference, through a
// bufio.Reader of size bufSize over a reader giving chunk bytes a Read, and
// reports where they disagree: the error, the head, or what is left to read
// after it.
func readBoth(b []byte, bufSize, chunk int) string {
	var h Head
	for i := 0; i < 2; i++ { // the second time over a Head's kept buffers
		br := bufio.NewReaderSize(&chunkReader{bytes.NewReader(b), chunk}, bufSize)
		rbr := bufio.NewReaderSize(&chunkReader{bytes.NewReader(b), chunk}, bufSize)
		var ref refHead
		err, rerr := h.Read(br), ref.Read(rbr)
		if err != rerr {
			return fmt.Sprintf("error %v, reference %v", err, rerr)
		}
		rest, _ := io.ReadAll(br)
		rrest, _ := io.ReadAll(rbr)
		if !bytes.Equal(rest, rrest) {
			return fmt.Sprintf("left %q, reference %q", rest, rrest)
		}
		if err != nil {
			continue
		}
		got := refHead{Code: h.Code, CType: h.Buf[h.CType[0]:h.CType[1]], CLen: h.CLen, Chunked: h.Chunked, CloseAfter: h.CloseAfter}
		for i := range h.Hdrs {
			k, v := h.Header(i)
			got.Hdrs = append(got.Hdrs, [2][]byte{k, v})
			if !validValueBytewise(v) {
				return fmt.Sprintf("header %q: value %q with a control byte", k, v)
			}
			if want := KindOf(k); h.Hdrs[i].Kind != want {
				return fmt.Sprintf("header %q of kind %d, KindOf %d", k, h.Hdrs[i].Kind, want)
			}
		}
		for _, t := range h.ConnTokens {
			got.ConnTokens = append(got.ConnTokens, h.Buf[t[0]:t[1]])
		}
		if g, w := got.String(), ref.String(); g != w {
			return fmt.Sprintf("head %s, reference %s", g, w)
		}
		if len(h.Buf) > MaxHeaderLen+2*MaxHeaders {
			return fmt.Sprintf("Buf holds %d bytes", len(h.Buf))
		}
	}
	return ""
}

// TestReadAgreesWithTheLineByLineRead: heads that end, break off, run
// over the limits or hold a bad byte are read as the line-by-line reading
// reads them, whatever the reader's buffer and the sizes of its reads.
func TestReadAgreesWithTheLineByLineRead(t *testing.T) {
	heads := []string{
		"HTTP/1.1 200 OK\r\nServer: fasthttp\r\nDate: Mon, 07 Dec 2026 13:50:19 GMT\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"ok\":true}\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive, X-A ,close\r\nX-A: 1\r\n\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\nX-Long-Leading-White-Space:      \t  v  \t \r\nX-Empty:\r\nX-Empty-2:    \r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 02\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
		"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Ctl: a\x01b\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Tab: a\tb\r\nX-High: \x80\xff\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-CR: a\rb\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
		"HTTP/1.1 200 OK\r\nContent-Len",
		"HTTP/1.1 200",
		"",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Many: 1\r\n", MaxHeaders) + "\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Many: 1\r\n", MaxHeaders-1) + "\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Big: "+strings.Repeat("v", 8000)+"\r\n", 8) + "X-Last: " + strings.Repeat("w", 100) + "\r\n\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Big: "+strings.Repeat("v", 8000)+"\r\n", 9) + "\r\n",
		"HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("v", 20000) + "\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-OWS:" + strings.Repeat(" ", 3000) + "v\r\n\r\n",
		strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", MaxInterim) + "HTTP/1.1 200 OK\r\n\r\n",
		strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", MaxInterim+1) + "HTTP/1.1 200 OK\r\n\r\n",
	}
	// The limit on the bytes of names and values, to the byte.
	for _, d := range []int{-1, 0, 1} {
		line := "X-Big: " + strings.Repeat("v", 8000) + "\r\n"
		last := MaxHeaderLen - 8*(len("X-Big")+8000) - len("X-Last: ") + d
		heads = append(heads, "HTTP/1.1 200 OK\r\n"+strings.Repeat(line, 8)+"X-Last: "+strings.Repeat("w", last)+"\r\n\r\n")
	}
	for _, in := range heads {
		for _, bufSize := range []int{16, 64, 4096, ReadBufSize} {
			for _, chunk := range []int{1, 3, 17, 1 << 20} {
				if d := readBoth([]byte(in), bufSize, chunk); d != "" {
					t.Fatalf("%.200q (buffer %d, reads of %d): %s", in, bufSize, chunk, d)
				}
			}
		}
	}
}

// FuzzReadAgreesWithTheLineByLineRead: any bytes, read through any buffer
// and read size, give what the line-by-line reading gives.
func FuzzReadAgreesWithTheLineByLineRead(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok"), uint16(4096), uint16(1000))
	f.Add([]byte("HTTP/1.1 103 Early Hints\r\nConnection: close\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: 5\r\n\r\n0\r\n\r\n"), uint16(16), uint16(5))
	f.Add([]byte("HTTP/1.0 200 OK\nX:  y \n\n"), uint16(32), uint16(1))
	f.Fuzz(func(t *testing.T, b []byte, bufSize, chunk uint16) {
		if d := readBoth(b, int(bufSize), int(chunk)+1); d != "" {
			t.Fatalf("%q (buffer %d, reads of %d): %s", b, bufSize, chunk+1, d)
		}
	})
}
