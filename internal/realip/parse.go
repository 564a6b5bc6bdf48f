package realip

import "net/netip"

// ParseEntry reads one X-Forwarded-For element, without the white space
// around it, as proxies write it: an IPv4 address with or without a port
// (192.0.2.7, 192.0.2.7:41234), an IPv6 address bare or in brackets with
// or without a port (2001:db8::7, [2001:db8::7], [2001:db8::7]:41234).
// The address is returned unmapped. Anything else is refused: a zone, a
// host name, "unknown", an IPv4 address in brackets, a port past 65535.
// The addresses are read as net/netip reads them (no leading zeros in an
// IPv4 octet, at most one "::"), without allocating: fasthttp's bytes are
// parsed in place.
func ParseEntry[S ~string | ~[]byte](s S) (netip.Addr, bool) {
	if len(s) == 0 {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		j := 1
		for j < len(s) && s[j] != ']' {
			j++
		}
		if j == len(s) {
			return netip.Addr{}, false
		}
		if rest := s[j+1:]; len(rest) > 0 && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, false
		}
		a, ok := parse6(s[1:j])
		return a.Unmap(), ok
	}
	colons, last := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			colons++
			last = i
		}
	}
	switch colons {
	case 0:
		return parse4(s)
	case 1: // an IPv4 address and its port (an IPv6 address has two colons at least)
		if !validPort(s[last+1:]) {
			return netip.Addr{}, false
		}
		return parse4(s[:last])
	}
	a, ok := parse6(s)
	return a.Unmap(), ok
}

// validPort reports a decimal port, 0 to 65535 (leading zeros allowed,
// as strconv.ParseUint reads them for netip.ParseAddrPort).
func validPort[S ~string | ~[]byte](s S) bool {
	if len(s) == 0 {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
		if n > 65535 {
			return false
		}
	}
	return true
}

// parse4 reads a dotted IPv4 address: four decimal octets, no leading
// zeros (netip refuses them: 010 would be octal to some readers).
func parse4[S ~string | ~[]byte](s S) (netip.Addr, bool) {
	var ip [4]byte
	field, digits, val := 0, 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			if digits == 1 && val == 0 {
				return netip.Addr{}, false // a leading zero
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return netip.Addr{}, false
			}
		case c == '.' && digits > 0 && field < 3:
			ip[field] = byte(val)
			field++
			digits, val = 0, 0
		default:
			return netip.Addr{}, false
		}
	}
	if field != 3 || digits == 0 {
		return netip.Addr{}, false
	}
	ip[3] = byte(val)
	return netip.AddrFrom4(ip), true
}

// parse6 reads an IPv6 address without a zone: groups of 1 to 4 hex
// digits, at most one "::" standing for one group or more, and an
// optional IPv4 address in the last 32 bits.
func parse6[S ~string | ~[]byte](s S) (netip.Addr, bool) {
	var ip [16]byte
	ellipsis := -1 // where "::" is, in bytes of ip
	if len(s) >= 2 && s[0] == ':' && s[1] == ':' {
		ellipsis = 0
		s = s[2:]
		if len(s) == 0 {
			return netip.IPv6Unspecified(), true
		}
	}
	i := 0
	for i < 16 {
		off, acc := 0, 0
		for ; off < len(s); off++ {
			v, ok := hexDigit(s[off])
			if !ok {
				break
			}
			if off > 3 {
				return netip.Addr{}, false // a group of more than 4 digits
			}
			acc = acc<<4 | v
		}
		if off == 0 {
			return netip.Addr{}, false
		}
		if off < len(s) && s[off] == '.' {
			// The IPv4 address in the last 32 bits.
			if (ellipsis < 0 && i != 12) || i+4 > 16 {
				return netip.Addr{}, false
			}
			v4, ok := parse4(s)
			if !ok {
				return netip.Addr{}, false
			}
			b := v4.As4()
			copy(ip[i:], b[:])
			i += 4
			s = s[:0]
			break
		}
		ip[i], ip[i+1] = byte(acc>>8), byte(acc)
		i += 2
		s = s[off:]
		if len(s) == 0 {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return netip.Addr{}, false // not a separator, or a trailing one
		}
		s = s[1:]
		if s[0] == ':' {
			if ellipsis >= 0 {
				return netip.Addr{}, false // a second "::"
			}
			ellipsis = i
			s = s[1:]
			if len(s) == 0 {
				break
			}
		}
	}
	if len(s) != 0 {
		return netip.Addr{}, false // more than 8 groups
	}
	if i < 16 {
		if ellipsis < 0 {
			return netip.Addr{}, false // too few groups
		}
		n := 16 - i
		for j := i - 1; j >= ellipsis; j-- {
			ip[j+n] = ip[j]
		}
		clear(ip[ellipsis : ellipsis+n])
	} else if ellipsis >= 0 {
		return netip.Addr{}, false // "::" standing for no group
	}
	return netip.AddrFrom16(ip), true
}

func hexDigit(c byte) (int, bool) {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0'), true
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10), true
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10), true
	}
	return 0, false
}
