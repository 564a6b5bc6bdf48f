package jinja

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

type tokType uint8

const (
	tText tokType = iota
	tNumber
	tString
	tIdent
	tEquals
	tOpenParen
	tCloseParen
	tOpenStmt
	tCloseStmt
	tOpenExpr
	tCloseExpr
	tOpenSquare
	tCloseSquare
	tOpenCurly
	tCloseCurly
	tComma
	tDot
	tColon
	tPipe
	tAdditive
	tMultiplicative
	tPower
	tComparison
	tUnary
	tComment
)

var tokNames = [...]string{"Text", "NumericLiteral", "StringLiteral", "Identifier", "Equals", "OpenParen",
	"CloseParen", "OpenStatement", "CloseStatement", "OpenExpression", "CloseExpression", "OpenSquareBracket",
	"CloseSquareBracket", "OpenCurlyBracket", "CloseCurlyBracket", "Comma", "Dot", "Colon", "Pipe",
	"AdditiveBinaryOperator", "MultiplicativeBinaryOperator", "ExponentiationBinaryOperator",
	"ComparisonBinaryOperator", "UnaryOperator", "Comment"}

func (t tokType) String() string { return tokNames[t] }

type token struct {
	typ tokType
	val string
}

var orderedTokens = []struct {
	seq string
	typ tokType
}{
	{"{%", tOpenStmt}, {"%}", tCloseStmt}, {"{{", tOpenExpr}, {"}}", tCloseExpr},
	{"(", tOpenParen}, {")", tCloseParen}, {"{", tOpenCurly}, {"}", tCloseCurly},
	{"[", tOpenSquare}, {"]", tCloseSquare}, {",", tComma}, {".", tDot}, {":", tColon}, {"|", tPipe},
	{"<=", tComparison}, {">=", tComparison}, {"==", tComparison}, {"!=", tComparison},
	{"<", tComparison}, {">", tComparison},
	{"+", tAdditive}, {"-", tAdditive}, {"~", tAdditive},
	{"**", tPower}, {"*", tMultiplicative}, {"//", tMultiplicative}, {"/", tMultiplicative}, {"%", tMultiplicative},
	{"=", tEquals},
}

var errEOF = errors.New("unexpected end of input")

func isJSLineTerminator(r rune) bool { return r == '\n' || r == '\r' || r == 0x2028 || r == 0x2029 }

// preprocess applies the transformations @huggingface/jinja makes before
// lexing, with trim_blocks and lstrip_blocks on as transformers renders.
func preprocess(src string) string {
	src = strings.TrimSuffix(src, "\n")
	// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1"
	var b strings.Builder
	b.Grow(len(src))
	lineStart := true
	for i := 0; i < len(src); {
		if lineStart {
			j := i
			for j < len(src) && (src[j] == ' ' || src[j] == '\t') {
				j++
			}
			if j+1 < len(src) && src[j] == '{' && (src[j+1] == '#' || src[j+1] == '%' || src[j+1] == '-') {
				i = j
			}
		}
		r, size := utf8.DecodeRuneInString(src[i:])
		b.WriteString(src[i : i+size])
		i += size
		lineStart = isJSLineTerminator(r)
	}
	src = b.String()
	// trim_blocks: /([#%-]})\n/g -> "$1"
	b.Reset()
	for i := 0; i < len(src); i++ {
		b.WriteByte(src[i])
		if src[i] == '}' && i > 0 && (src[i-1] == '#' || src[i-1] == '%' || src[i-1] == '-') && i+1 < len(src) && src[i+1] == '\n' {
			i++
		}
	}
	src = b.String()
	if strings.Contains(src, "generation") {
		src = stripGenerationTags(src)
	}
	return src
}

// stripGenerationTags implements
// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs.
func stripGenerationTags(src string) string {
	var b strings.Builder
	last := 0 // end of the previous match
	for i := 0; i+1 < len(src); {
		if src[i] != '{' || src[i+1] != '%' {
			i++
			continue
		}
		j := i + 2
		lstrip := j < len(src) && src[j] == '-'
		if lstrip {
			j++
		}
		j = skipJSSpace(src, j)
		if strings.HasPrefix(src[j:], "end") {
			j += 3
		}
		if !strings.HasPrefix(src[j:], "generation") {
			i++
			continue
		}
		j = skipJSSpace(src, j+len("generation"))
		rstrip := j < len(src) && src[j] == '-'
		if rstrip {
			j++
		}
		if !strings.HasPrefix(src[j:], "%}") {
			i++
			continue
		}
		j += 2
		// Leading whitespace run, not reaching into the previous match.
		k := i
		for k > last {
			r, size := utf8.DecodeLastRuneInString(src[last:k])
			if !isJSSpace(r) {
				break
			}
			k -= size
		}
		end := skipJSSpace(src, j)
		b.WriteString(src[last:k])
		if !lstrip {
			b.WriteString(src[k:i])
		}
		if !rstrip {
			b.WriteString(src[j:end])
		}
		last, i = end, end
	}
	b.WriteString(src[last:])
	return b.String()
}

func skipJSSpace(s string, i int) int {
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !isJSSpace(r) {
			break
		}
		i += size
	}
	return i
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isWordByte(c byte) bool {
	return c == '_' || isDigit(c) || (c|0x20) >= 'a' && (c|0x20) <= 'z'
}

var escapes = map[byte]string{'n': "\n", 't': "\t", 'r': "\r", 'b': "\b", 'f': "\f", 'v': "\v", '\'': "'", '"': "\"", '\\': "\\"}

// tokenize ports @huggingface/jinja's lexer.
func tokenize(source string) ([]token, error) {
	src := preprocess(source)
	var tokens []token
	pos := 0
	curlyDepth := 0
	last := func() (tokType, bool) {
		if len(tokens) == 0 {
			return 0, false
		}
		return tokens[len(tokens)-1].typ, true
	}
	// consumeWhile consumes while pred holds, decoding backslash escapes.
	consumeWhile := func(pred func(s string, i int) bool) (string, error) {
		var sb strings.Builder
		for pos < len(src) && pred(src, pos) {
			if src[pos] == '\\' {
				pos++
				if pos >= len(src) {
					return "", errEOF
				}
				esc := src[pos]
				pos++
				if esc == 'x' || esc == 'u' {
					n := 2
					if esc == 'u' {
						n = 4
					}
					if pos+n > len(src) {
						return "", fmt.Errorf("invalid hexadecimal escape sequence")
					}
					code, err := strconv.ParseUint(src[pos:pos+n], 16, 32)
					if err != nil {
						return "", fmt.Errorf("invalid hexadecimal escape sequence: \\%c%s", esc, src[pos:pos+n])
					}
					sb.WriteRune(rune(code))
					pos += n
					continue
				}
				un, ok := escapes[esc]
				if !ok {
					return "", fmt.Errorf("unexpected escaped character: %c", esc)
				}
				sb.WriteString(un)
				continue
			}
			_, size := utf8.DecodeRuneInString(src[pos:])
			sb.WriteString(src[pos : pos+size])
			pos += size
			if pos >= len(src) {
				return "", errEOF
			}
		}
		return sb.String(), nil
	}
	isSpaceAt := func(s string, i int) bool {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return isJSSpace(r)
	}
	isDigitAt := func(s string, i int) bool { return isDigit(s[i]) }
	isWordAt := func(s string, i int) bool { return isWordByte(s[i]) }
	stripTrailing := func() {
		if n := len(tokens); n > 0 && tokens[n-1].typ == tText {
			tokens[n-1].val = jsTrimRight(tokens[n-1].val)
			if tokens[n-1].val == "" {
				tokens = tokens[:n-1]
			}
		}
	}
	skipLeading := func() { pos = skipJSSpace(src, pos) }

main:
	for pos < len(src) {
		if lt, ok := last(); !ok || lt == tCloseStmt || lt == tCloseExpr || lt == tComment {
			start := pos
			for pos < len(src) && !(src[pos] == '{' && pos+1 < len(src) && (src[pos+1] == '%' || src[pos+1] == '{' || src[pos+1] == '#')) {
				pos++
			}
			if pos > start {
				tokens = append(tokens, token{tText, src[start:pos]})
				continue
			}
		}
		if strings.HasPrefix(src[pos:], "{#") {
			pos += 2
			stripBefore := pos < len(src) && src[pos] == '-'
			if stripBefore {
				pos++
			}
			start := pos
			for !(pos+1 < len(src) && src[pos] == '#' && src[pos+1] == '}') {
				if pos+2 >= len(src) {
					return nil, errors.New("missing end of comment tag")
				}
				pos++
			}
			comment := src[start:pos]
			stripAfter := strings.HasSuffix(comment, "-")
			if stripAfter {
				comment = comment[:len(comment)-1]
			}
			if stripBefore {
				stripTrailing()
			}
			tokens = append(tokens, token{tComment, comment})
			pos += 2
			if stripAfter {
				skipLeading()
			}
			continue
		}
		if strings.HasPrefix(src[pos:], "{%-") {
			stripTrailing()
			tokens = append(tokens, token{tOpenStmt, "{%"})
			pos += 3
			continue
		}
		if strings.HasPrefix(src[pos:], "{{-") {
			stripTrailing()
			tokens = append(tokens, token{tOpenExpr, "{{"})
			curlyDepth = 0
			pos += 3
			continue
		}
		if _, err := consumeWhile(isSpaceAt); err != nil {
			return nil, err
		}
		if pos >= len(src) {
			break
		}
		if strings.HasPrefix(src[pos:], "-%}") {
			tokens = append(tokens, token{tCloseStmt, "%}"})
			pos += 3
			skipLeading()
			continue
		}
		if strings.HasPrefix(src[pos:], "-}}") {
			tokens = append(tokens, token{tCloseExpr, "}}"})
			pos += 3
			skipLeading()
			continue
		}
		c := src[pos]
		if c == '-' || c == '+' {
			lt, ok := last()
			if !ok || lt == tText {
				return nil, fmt.Errorf("unexpected character: %c", c)
			}
			switch lt {
			case tIdent, tNumber, tString, tCloseParen, tCloseSquare:
			default:
				pos++
				num, err := consumeWhile(isDigitAt)
				if err != nil {
					return nil, err
				}
				if num != "" && pos+1 < len(src) && src[pos] == '.' && isDigit(src[pos+1]) {
					pos++
					frac, err := consumeWhile(isDigitAt)
					if err != nil {
						return nil, err
					}
					num += "." + frac
				}
				typ := tUnary
				if num != "" {
					typ = tNumber
				}
				tokens = append(tokens, token{typ, string(c) + num})
				continue
			}
		}
		for _, ot := range orderedTokens {
			if ot.seq == "}}" && curlyDepth > 0 {
				continue
			}
			if strings.HasPrefix(src[pos:], ot.seq) {
				tokens = append(tokens, token{ot.typ, ot.seq})
				switch ot.typ {
				case tOpenExpr:
					curlyDepth = 0
				case tOpenCurly:
					curlyDepth++
				case tCloseCurly:
					curlyDepth--
				}
				pos += len(ot.seq)
				continue main
			}
		}
		if c == '\'' || c == '"' {
			pos++
			s, err := consumeWhile(func(s string, i int) bool { return s[i] != c })
			if err != nil {
				return nil, err
			}
			if pos >= len(src) {
				return nil, errEOF
			}
			tokens = append(tokens, token{tString, s})
			pos++
			continue
		}
		if isDigit(c) {
			num, err := consumeWhile(isDigitAt)
			if err != nil {
				return nil, err
			}
			if lt, _ := last(); lt != tDot && pos+1 < len(src) && src[pos] == '.' && isDigit(src[pos+1]) {
				pos++
				frac, err := consumeWhile(isDigitAt)
				if err != nil {
					return nil, err
				}
				num += "." + frac
			}
			tokens = append(tokens, token{tNumber, num})
			continue
		}
		if isWordByte(c) {
			w, err := consumeWhile(isWordAt)
			if err != nil {
				return nil, err
			}
			tokens = append(tokens, token{tIdent, w})
			continue
		}
		r, _ := utf8.DecodeRuneInString(src[pos:])
		return nil, fmt.Errorf("unexpected character: %q", r)
	}
	return tokens, nil
}
