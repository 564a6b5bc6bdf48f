package protocol

// jsonPrefix checks, fragment by fragment, that a tool call's arguments
// stay a prefix of a JSON object: the raw (JSON-escaped) body of the chat
// chunk's arguments string is decoded as it comes and each character is
// run through JSON's grammar. Anthropic's SDKs parse input_json_delta's
// partial_json as it streams and throw on the first character that no
// JSON text can continue with, losing the whole stream: vLLM's tool
// parsers do stream such arguments (a model that writes prose, or a call
// cut mid-escape). The zero value expects the object's opening brace.
type jsonPrefix struct {
	bad   bool // a character no JSON object can continue with was seen
	state uint8
	depth uint8
	stack [maxPrefixDepth]byte // '{' or '[' per open container
	key   bool                 // the open string is an object key
	esc   bool                 // after a backslash inside a string
	hex   uint8                // hex digits left of a \uXXXX inside a string
	lit   string               // the rest of a literal (true, false, null)
	num   uint8                // the number's state (numXxx)

	// The raw form's own escapes: the fragment is the body of a JSON
	// string, so its \n, \" and \uXXXX are one character of the arguments.
	rawEsc bool
	rawHex uint8
	rawCP  rune
}

// maxPrefixDepth bounds the nesting checked; deeper arguments are cut
// there (no tool schema nests 64 deep).
const maxPrefixDepth = 64

const (
	psStart      uint8 = iota // before the object's '{'
	psValue                   // a value is due (after ':' or ',' in an array)
	psValueOrEnd              // after '[': a value or ']'
	psKeyOrEnd                // after '{': a key or '}'
	psKey                     // after ',' in an object: a key
	psColon                   // after a key
	psCommaOrEnd              // after a value inside a container
	psString                  // inside a string
	psLiteral                 // inside true, false or null
	psNumber                  // inside a number
	psDone                    // the object is whole: only whitespace may follow
)

const (
	numSign  uint8 = iota // after '-'
	numZero               // after a leading 0
	numInt                // in the integer digits
	numDot                // after '.'
	numFrac               // in the fraction digits
	numE                  // after 'e' or 'E'
	numESign              // after the exponent's sign
	numExp                // in the exponent digits
)

// feed checks raw, the next fragment of the escaped arguments, and returns
// how many of its bytes keep them a JSON object's prefix (len(raw) while
// they do; a cut never splits one of raw's escapes).
func (p *jsonPrefix) feed(raw []byte) int {
	if p.bad {
		return 0
	}
	start := 0 // where the character being decoded starts in raw
	for i := 0; i < len(raw); i++ {
		b := raw[i]
		var c rune
		switch {
		case p.rawHex > 0:
			p.rawCP = p.rawCP<<4 | rune(hexVal(b))
			p.rawHex--
			if p.rawHex > 0 {
				continue
			}
			c = p.rawCP
		case p.rawEsc:
			p.rawEsc = false
			switch b {
			case 'u':
				p.rawHex, p.rawCP = 4, 0
				continue
			case 'n':
				c = '\n'
			case 't':
				c = '\t'
			case 'r':
				c = '\r'
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			default: // \" \\ \/
				c = rune(b)
			}
		case b == '\\':
			p.rawEsc = true
			start = i
			continue
		default:
			start = i
			c = rune(b)
		}
		if !p.step(c) {
			p.bad = true
			return start
		}
	}
	return len(raw)
}

// hexVal is the value of a hex digit (0 for anything else: the raw form
// comes from a JSON string the parser accepted).
func hexVal(b byte) byte {
	switch {
	case b >= '0' && b <= '9':
		return b - '0'
	case b >= 'a' && b <= 'f':
		return b - 'a' + 10
	case b >= 'A' && b <= 'F':
		return b - 'A' + 10
	}
	return 0
}

// step runs one character of the arguments through the grammar.
func (p *jsonPrefix) step(c rune) bool {
	switch p.state {
	case psString:
		switch {
		case p.hex > 0:
			if !isHexDigit(c) {
				return false
			}
			p.hex--
		case p.esc:
			p.esc = false
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				p.hex = 4
			default:
				return false
			}
		case c == '\\':
			p.esc = true
		case c == '"':
			if p.key {
				p.state = psColon
			} else {
				p.valueDone()
			}
		case c < 0x20:
			return false // a control character must be escaped
		}
		return true
	case psLiteral:
		if c != rune(p.lit[0]) {
			return false
		}
		if p.lit = p.lit[1:]; p.lit == "" {
			p.valueDone()
		}
		return true
	case psNumber:
		if p.number(c) {
			return true
		}
		if p.num == numSign || p.num == numDot || p.num == numE || p.num == numESign {
			return false // "-", "1.", "1e", "1e+" end nothing
		}
		p.valueDone() // the character after a number is the next token
	}
	if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
		return true
	}
	switch p.state {
	case psStart:
		if c != '{' {
			return false
		}
		return p.open('{')
	case psValue, psValueOrEnd:
		if c == ']' && p.state == psValueOrEnd {
			return p.close()
		}
		return p.value(c)
	case psKeyOrEnd, psKey:
		if c == '}' && p.state == psKeyOrEnd {
			return p.close()
		}
		if c != '"' {
			return false
		}
		p.state, p.key = psString, true
		return true
	case psColon:
		if c != ':' {
			return false
		}
		p.state = psValue
		return true
	case psCommaOrEnd:
		top := p.stack[p.depth-1]
		switch {
		case c == ',' && top == '{':
			p.state = psKey
		case c == ',':
			p.state = psValue
		case c == '}' && top == '{', c == ']' && top == '[':
			return p.close()
		default:
			return false
		}
		return true
	}
	return false // psDone: nothing but whitespace
}

// value starts the value whose first character is c.
func (p *jsonPrefix) value(c rune) bool {
	switch {
	case c == '{' || c == '[':
		return p.open(byte(c))
	case c == '"':
		p.state, p.key = psString, false
	case c == 't':
		p.state, p.lit = psLiteral, "rue"
	case c == 'f':
		p.state, p.lit = psLiteral, "alse"
	case c == 'n':
		p.state, p.lit = psLiteral, "ull"
	case c == '-':
		p.state, p.num = psNumber, numSign
	case c == '0':
		p.state, p.num = psNumber, numZero
	case c >= '1' && c <= '9':
		p.state, p.num = psNumber, numInt
	default:
		return false
	}
	return true
}

// number advances the number's state with c; false when c does not
// continue it.
func (p *jsonPrefix) number(c rune) bool {
	digit := c >= '0' && c <= '9'
	switch p.num {
	case numSign:
		switch {
		case c == '0':
			p.num = numZero
		case digit:
			p.num = numInt
		default:
			return false
		}
	case numZero, numInt:
		switch {
		case digit && p.num == numInt:
		case c == '.':
			p.num = numDot
		case c == 'e' || c == 'E':
			p.num = numE
		default:
			return false
		}
	case numDot, numFrac:
		switch {
		case digit:
			p.num = numFrac
		case (c == 'e' || c == 'E') && p.num == numFrac:
			p.num = numE
		default:
			return false
		}
	case numE:
		switch {
		case c == '+' || c == '-':
			p.num = numESign
		case digit:
			p.num = numExp
		default:
			return false
		}
	case numESign, numExp:
		if !digit {
			return false
		}
		p.num = numExp
	}
	return true
}

func (p *jsonPrefix) open(c byte) bool {
	if int(p.depth) == maxPrefixDepth {
		return false
	}
	p.stack[p.depth] = c
	p.depth++
	if c == '{' {
		p.state = psKeyOrEnd
	} else {
		p.state = psValueOrEnd
	}
	return true
}

// close ends the innermost container (the caller checked its bracket).
func (p *jsonPrefix) close() bool {
	p.depth--
	p.valueDone()
	return true
}

// valueDone moves past a finished value.
func (p *jsonPrefix) valueDone() {
	if p.depth == 0 {
		p.state = psDone
	} else {
		p.state = psCommaOrEnd
	}
}

func isHexDigit(c rune) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
