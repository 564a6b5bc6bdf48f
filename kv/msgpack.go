package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// errShort is returned when a msgpack value runs past the end of the input.
var errShort = errors.New("msgpack: unexpected end of input")

// maxDepth bounds nesting when skipping unknown values.
const maxDepth = 32

// mpReader iterates over a msgpack buffer without allocating. Returned byte
// slices alias the input.
type mpReader struct {
	b   []byte
	off int
}

func (r *mpReader) reset(b []byte) { r.b, r.off = b, 0 }

func (r *mpReader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

func (r *mpReader) take(n int) ([]byte, error) {
	if n < 0 || len(r.b)-r.off < n {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *mpReader) u8() (uint64, error) {
	p, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return uint64(p[0]), nil
}

func (r *mpReader) u16() (uint64, error) {
	p, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return uint64(binary.BigEndian.Uint16(p)), nil
}

func (r *mpReader) u32() (uint64, error) {
	p, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return uint64(binary.BigEndian.Uint32(p)), nil
}

func (r *mpReader) u64() (uint64, error) {
	p, err := r.take(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(p), nil
}

// isNil consumes a nil and reports true, or leaves the input untouched.
func (r *mpReader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// arrayLen reads an array header.
func (r *mpReader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.off++
		return int(c & 0x0f), nil
	case c == 0xdc:
		r.off++
		n, err = r.u16()
	case c == 0xdd:
		r.off++
		n, err = r.u32()
	default:
		return 0, fmt.Errorf("msgpack: want array, got type byte 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	// Every element takes at least one byte: reject absurd lengths early.
	if n > uint64(len(r.b)-r.off) {
		return 0, errShort
	}
	return int(n), nil
}

// mapLen reads a map header.
func (r *mpReader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.off++
		return int(c & 0x0f), nil
	case c == 0xde:
		r.off++
		n, err = r.u16()
	case c == 0xdf:
		r.off++
		n, err = r.u32()
	default:
		return 0, fmt.Errorf("msgpack: want map, got type byte 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.off)/2 {
		return 0, errShort
	}
	return int(n), nil
}

// str reads a str (or bin) value.
func (r *mpReader) str() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		r.off++
		n, err = r.u8()
	case c == 0xda || c == 0xc5:
		r.off++
		n, err = r.u16()
	case c == 0xdb || c == 0xc6:
		r.off++
		n, err = r.u32()
	default:
		return nil, fmt.Errorf("msgpack: want str, got type byte 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > math.MaxInt32 {
		return nil, errShort
	}
	return r.take(int(n))
}

// isStrOrBin reports whether the next value is a str or bin.
func (r *mpReader) isStrOrBin() bool {
	if r.off >= len(r.b) {
		return false
	}
	c := r.b[r.off]
	return (c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda || c == 0xdb || c == 0xc4 || c == 0xc5 || c == 0xc6
}

// int reads any integer as int64 bits; neg reports a negative value.
// uint64 values above MaxInt64 keep their bits (neg=false).
func (r *mpReader) int() (v uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	r.off++
	switch c {
	case 0xcc:
		v, err = r.u8()
	case 0xcd:
		v, err = r.u16()
	case 0xce:
		v, err = r.u32()
	case 0xcf:
		v, err = r.u64()
	case 0xd0:
		v, err = r.u8()
		v = uint64(int64(int8(v)))
	case 0xd1:
		v, err = r.u16()
		v = uint64(int64(int16(v)))
	case 0xd2:
		v, err = r.u32()
		v = uint64(int64(int32(v)))
	case 0xd3:
		v, err = r.u64()
	default:
		r.off--
		return 0, false, fmt.Errorf("msgpack: want int, got type byte 0x%02x", c)
	}
	return v, c >= 0xd0 && int64(v) < 0, err
}

// float reads a float32/float64 (or an integer, as msgspec may encode ts).
func (r *mpReader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		v, err := r.u32()
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.off++
		v, err := r.u64()
		return math.Float64frombits(v), err
	}
	v, neg, err := r.int()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// skip consumes one value of any type.
func (r *mpReader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("msgpack: nesting too deep")
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case r.isStrOrBin():
		_, err := r.str()
		return err
	}
	r.off++
	var n int
	switch c {
	case 0xcc, 0xd0, 0xd4:
		n = 1
	case 0xcd, 0xd1, 0xd5:
		n = 2
	case 0xce, 0xd2, 0xca, 0xd6:
		n = 4
	case 0xcf, 0xd3, 0xcb, 0xd7:
		n = 8
	case 0xd8:
		n = 16
	case 0xc7, 0xc8, 0xc9: // ext 8/16/32: size, type, data
		var sz uint64
		switch c {
		case 0xc7:
			sz, err = r.u8()
		case 0xc8:
			sz, err = r.u16()
		default:
			sz, err = r.u32()
		}
		if err != nil {
			return err
		}
		if sz > math.MaxInt32 {
			return errShort
		}
		n = int(sz) + 1
	default:
		return fmt.Errorf("msgpack: invalid type byte 0x%02x", c)
	}
	switch c {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext: type byte + data
		n++
	}
	_, err = r.take(n)
	return err
}
