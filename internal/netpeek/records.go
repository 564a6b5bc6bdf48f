package netpeek

// tlsPeekMax bounds what TLSRecords looks at: records a TLS server sends on
// an idle connection of its own accord (session tickets, a key update) are
// a few hundred bytes.
const tlsPeekMax = 4096

// tlsRecordMax is the largest record on the wire (RFC 8446 5.2:
// TLSCiphertext.length is at most 2^14 + 256).
const tlsRecordMax = 1<<14 + 256

// wholeRecords returns len(b) when b is a sequence of whole TLS records (RFC
// 8446 5.1: a 5-byte header, content type, version, and the length of the
// fragment that follows), and -1 when it is empty, ends inside a record, or
// holds a length no record has.
func wholeRecords(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	off := 0
	for off+5 <= len(b) {
		n := int(b[off+3])<<8 | int(b[off+4])
		if n > tlsRecordMax {
			return -1
		}
		off += 5 + n
	}
	if off != len(b) {
		return -1
	}
	return off
}
