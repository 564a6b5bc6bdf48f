package jinja

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

type node interface{}

type (
	textNode    struct{ s string }
	commentNode struct{}
	intLit      struct{ v float64 }
	floatLit    struct{ v float64 }
	strLit      struct{ s string }
	ident       struct{ name string }
	arrayLit    struct{ items []node }
	tupleLit    struct{ items []node }
	objectLit   struct {
		keys []node
		vals []node
	}
	ifNode struct {
		test      node
		body, alt []node
	}
	forNode struct {
		loopvar  node // *ident or *tupleLit
		iterable node
		body     []node
		elseBody []node
	}
	setNode struct {
		target node
		value  node // nil for block set
		body   []node
	}
	macroNode struct {
		name string
		args []node // *ident or *kwArg
		body []node
		fn   Value // the macro as a function, built once by the parser
	}
	callStmt struct {
		call       *callExpr
		callerArgs []node
		body       []node
	}
	filterStmt struct {
		filter node // *ident or *callExpr
		body   []node
	}
	breakNode    struct{}
	continueNode struct{}
	memberExpr   struct {
		object   node
		property node
		computed bool
	}
	sliceExpr struct{ start, stop, step node }
	callExpr  struct {
		callee node
		args   []node
	}
	kwArg struct {
		key   string
		value node
	}
	spreadExpr   struct{ arg node }
	kwSpreadExpr struct{ arg node }
	binaryExpr   struct {
		op          string
		code        binOp // op, resolved once by the parser
		left, right node
	}
	unaryExpr struct {
		op  string
		arg node
	}
	filterExpr struct {
		operand node
		filter  node // *ident or *callExpr
	}
	testExpr struct {
		operand node
		negate  bool
		test    string
	}
	selectExpr struct{ lhs, test node }
	ternary    struct{ cond, trueExpr, falseExpr node }
)

const maxParseDepth = 200

// binOp is a binary operator, so that evaluation switches on an integer.
type binOp uint8

const (
	opOther binOp = iota // reported as unknown by eval, with its text
	opAnd
	opOr
	opEq
	opNe
	opIn
	opNotIn
	opConcat // ~
	opPow
	opAdd
	opSub
	opMul
	opDiv
	opFloorDiv
	opMod
	opLt
	opGt
	opGe
	opLe
)

var binOps = map[string]binOp{
	"and": opAnd, "or": opOr, "==": opEq, "!=": opNe, "in": opIn, "not in": opNotIn, "~": opConcat,
	"**": opPow, "+": opAdd, "-": opSub, "*": opMul, "/": opDiv, "//": opFloorDiv, "%": opMod,
	"<": opLt, ">": opGt, ">=": opGe, "<=": opLe,
}

func newBinary(op string, left, right node) *binaryExpr {
	return &binaryExpr{op: op, code: binOps[op], left: left, right: right}
}

type parser struct {
	toks  []token
	pos   int
	depth int
}

var errTokens = errors.New("unexpected end of template")

func (p *parser) peek(off int) (token, bool) {
	if p.pos+off < len(p.toks) {
		return p.toks[p.pos+off], true
	}
	return token{}, false
}

func (p *parser) is(types ...tokType) bool {
	if p.pos+len(types) > len(p.toks) {
		return false
	}
	for i, t := range types {
		if p.toks[p.pos+i].typ != t {
			return false
		}
	}
	return true
}

func (p *parser) isIdent(names ...string) bool {
	if p.pos+len(names) > len(p.toks) {
		return false
	}
	for i, n := range names {
		t := p.toks[p.pos+i]
		if t.typ != tIdent || t.val != n {
			return false
		}
	}
	return true
}

func (p *parser) isStatement(names ...string) bool {
	t0, ok0 := p.peek(0)
	t1, ok1 := p.peek(1)
	if !ok0 || !ok1 || t0.typ != tOpenStmt || t1.typ != tIdent {
		return false
	}
	for _, n := range names {
		if t1.val == n {
			return true
		}
	}
	return false
}

func (p *parser) expect(t tokType, what string) (token, error) {
	tok, ok := p.peek(0)
	if !ok {
		return token{}, fmt.Errorf("parser error: %s: %w", what, errTokens)
	}
	p.pos++
	if tok.typ != t {
		return token{}, fmt.Errorf("parser error: %s: got %s, want %s", what, tok.typ, t)
	}
	return tok, nil
}

func (p *parser) expectIdent(name string) error {
	if !p.isIdent(name) {
		return fmt.Errorf("parser error: expected %s", name)
	}
	p.pos++
	return nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxParseDepth {
		return errors.New("parser error: template nested too deeply")
	}
	return nil
}

// link enters one more link of a left-deep chain (a + b + c, a and b,
// a.b.c, a|f|g) and counts it in *n, which the caller leaves when the
// chain ends (p.depth -= *n): each link nests the chain so far one level
// deeper in the tree that evaluation recurses through, so chains count
// against maxParseDepth as parentheses do. Uncounted, a template of
// 400,000 "+" (8 MB) overflowed the goroutine stack on its first render,
// killing the process, and one of 25,000 took 240 MB of stack a render.
func (p *parser) link(n *int) error {
	*n++
	return p.enter()
}

func parse(toks []token) ([]node, error) {
	p := &parser{toks: toks}
	var body []node
	for p.pos < len(p.toks) {
		n, err := p.parseAny()
		if err != nil {
			return nil, err
		}
		body = append(body, n)
	}
	return body, nil
}

func (p *parser) parseAny() (node, error) {
	tok, ok := p.peek(0)
	if !ok {
		return nil, errTokens
	}
	switch tok.typ {
	case tComment:
		p.pos++
		return &commentNode{}, nil
	case tText:
		p.pos++
		return &textNode{tok.val}, nil
	case tOpenStmt:
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		return p.parseStatement()
	case tOpenExpr:
		p.pos++
		e, err := p.parseExpression()
		if err != nil {
			return nil, err
		}
		if _, err := p.expect(tCloseExpr, "expected closing expression token"); err != nil {
			return nil, err
		}
		return e, nil
	}
	return nil, fmt.Errorf("parser error: unexpected token type %s", tok.typ)
}

// parseUntil parses nodes until one of the statements names opens.
func (p *parser) parseUntil(names ...string) ([]node, error) {
	var body []node
	for !p.isStatement(names...) {
		if p.pos >= len(p.toks) {
			return nil, fmt.Errorf("parser error: missing {%% %s %%}", names[len(names)-1])
		}
		n, err := p.parseAny()
		if err != nil {
			return nil, err
		}
		body = append(body, n)
	}
	return body, nil
}

func (p *parser) closeStmt() error {
	_, err := p.expect(tCloseStmt, "expected closing statement token")
	return err
}

func (p *parser) endStmt(name string) error {
	if _, err := p.expect(tOpenStmt, "expected {% token"); err != nil {
		return err
	}
	if err := p.expectIdent(name); err != nil {
		return err
	}
	return p.closeStmt()
}

func (p *parser) parseStatement() (node, error) {
	p.pos++ // {%
	tok, ok := p.peek(0)
	if !ok || tok.typ != tIdent {
		return nil, errors.New("parser error: unknown statement")
	}
	p.pos++
	switch tok.val {
	case "set":
		return p.parseSet()
	case "if":
		n, err := p.parseIf()
		if err != nil {
			return nil, err
		}
		return n, p.endStmt("endif")
	case "macro":
		name, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		id, ok := name.(*ident)
		if !ok {
			return nil, errors.New("parser error: expected identifier following macro statement")
		}
		args, err := p.parseArgs(true)
		if err != nil {
			return nil, err
		}
		if err := p.closeStmt(); err != nil {
			return nil, err
		}
		body, err := p.parseUntil("endmacro")
		if err != nil {
			return nil, err
		}
		m := &macroNode{name: id.name, args: args, body: body}
		m.fn = macroFunc(m)
		return m, p.endStmt("endmacro")
	case "for":
		n, err := p.parseFor()
		if err != nil {
			return nil, err
		}
		return n, p.endStmt("endfor")
	case "call":
		var callerArgs []node
		if p.is(tOpenParen) {
			var err error
			if callerArgs, err = p.parseArgs(true); err != nil {
				return nil, err
			}
		}
		callee, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if _, ok := callee.(*ident); !ok {
			return nil, errors.New("parser error: expected identifier following call statement")
		}
		args, err := p.parseArgs(false)
		if err != nil {
			return nil, err
		}
		if err := p.closeStmt(); err != nil {
			return nil, err
		}
		body, err := p.parseUntil("endcall")
		if err != nil {
			return nil, err
		}
		return &callStmt{call: &callExpr{callee: callee, args: args}, callerArgs: callerArgs, body: body}, p.endStmt("endcall")
	case "break":
		return &breakNode{}, p.closeStmt()
	case "continue":
		return &continueNode{}, p.closeStmt()
	case "filter":
		f, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if _, ok := f.(*ident); ok && p.is(tOpenParen) {
			if f, err = p.parseCall(f); err != nil {
				return nil, err
			}
		}
		if err := p.closeStmt(); err != nil {
			return nil, err
		}
		body, err := p.parseUntil("endfilter")
		if err != nil {
			return nil, err
		}
		return &filterStmt{filter: f, body: body}, p.endStmt("endfilter")
	}
	return nil, fmt.Errorf("parser error: unknown statement type %q", tok.val)
}

func (p *parser) parseSet() (node, error) {
	left, err := p.parseExpressionSequence(false)
	if err != nil {
		return nil, err
	}
	n := &setNode{target: left}
	if p.is(tEquals) {
		p.pos++
		if n.value, err = p.parseExpressionSequence(false); err != nil {
			return nil, err
		}
	} else {
		if err := p.closeStmt(); err != nil {
			return nil, err
		}
		if n.body, err = p.parseUntil("endset"); err != nil {
			return nil, err
		}
		if _, err := p.expect(tOpenStmt, "expected {% token"); err != nil {
			return nil, err
		}
		if err := p.expectIdent("endset"); err != nil {
			return nil, err
		}
	}
	return n, p.closeStmt()
}

func (p *parser) parseIf() (*ifNode, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	test, err := p.parseExpression()
	if err != nil {
		return nil, err
	}
	if err := p.closeStmt(); err != nil {
		return nil, err
	}
	n := &ifNode{test: test}
	if n.body, err = p.parseUntil("elif", "else", "endif"); err != nil {
		return nil, err
	}
	switch {
	case p.isStatement("elif"):
		p.pos += 2
		sub, err := p.parseIf()
		if err != nil {
			return nil, err
		}
		n.alt = []node{sub}
	case p.isStatement("else"):
		p.pos += 2
		if err := p.closeStmt(); err != nil {
			return nil, err
		}
		if n.alt, err = p.parseUntil("endif"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (p *parser) parseFor() (node, error) {
	lv, err := p.parseExpressionSequence(true)
	if err != nil {
		return nil, err
	}
	switch lv.(type) {
	case *ident, *tupleLit:
	default:
		return nil, errors.New("parser error: expected identifier/tuple for the loop variable")
	}
	if !p.isIdent("in") {
		return nil, errors.New("parser error: expected `in` keyword following loop variable")
	}
	p.pos++
	it, err := p.parseExpression()
	if err != nil {
		return nil, err
	}
	if err := p.closeStmt(); err != nil {
		return nil, err
	}
	n := &forNode{loopvar: lv, iterable: it}
	if n.body, err = p.parseUntil("endfor", "else"); err != nil {
		return nil, err
	}
	if p.isStatement("else") {
		p.pos += 2
		if err := p.closeStmt(); err != nil {
			return nil, err
		}
		if n.elseBody, err = p.parseUntil("endfor"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (p *parser) parseExpressionSequence(primary bool) (node, error) {
	fn := p.parseExpression
	if primary {
		fn = p.parsePrimary
	}
	first, err := fn()
	if err != nil {
		return nil, err
	}
	if !p.is(tComma) {
		return first, nil
	}
	items := []node{first}
	for p.is(tComma) {
		p.pos++
		e, err := fn()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &tupleLit{items: items}, nil
}

func (p *parser) parseExpression() (node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	a, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.isIdent("if") {
		p.pos++
		test, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		if p.isIdent("else") {
			p.pos++
			f, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			return &ternary{cond: test, trueExpr: a, falseExpr: f}, nil
		}
		return &selectExpr{lhs: a, test: test}, nil
	}
	return a, nil
}

func (p *parser) parseOr() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	left, err := p.parseAnd()
	for err == nil && p.isIdent("or") {
		p.pos++
		if err = p.link(&links); err != nil {
			break
		}
		var right node
		if right, err = p.parseAnd(); err == nil {
			left = newBinary("or", left, right)
		}
	}
	return left, err
}

func (p *parser) parseAnd() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	left, err := p.parseNot()
	for err == nil && p.isIdent("and") {
		p.pos++
		if err = p.link(&links); err != nil {
			break
		}
		var right node
		if right, err = p.parseNot(); err == nil {
			left = newBinary("and", left, right)
		}
	}
	return left, err
}

func (p *parser) parseNot() (node, error) {
	if p.isIdent("not") {
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		p.pos++
		arg, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{op: "not", arg: arg}, nil
	}
	return p.parseComparison()
}

func (p *parser) parseComparison() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	left, err := p.parseAdditive()
	for err == nil {
		var op string
		switch {
		case p.isIdent("not", "in"):
			op = "not in"
			p.pos += 2
		case p.isIdent("in"):
			op = "in"
			p.pos++
		case p.is(tComparison):
			op = p.toks[p.pos].val
			p.pos++
		default:
			return left, nil
		}
		if err = p.link(&links); err != nil {
			break
		}
		var right node
		if right, err = p.parseAdditive(); err == nil {
			left = newBinary(op, left, right)
		}
	}
	return left, err
}

func (p *parser) parseAdditive() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	left, err := p.parseMultiplicative()
	for err == nil && p.is(tAdditive) {
		op := p.toks[p.pos].val
		p.pos++
		if err = p.link(&links); err != nil {
			break
		}
		var right node
		if right, err = p.parseMultiplicative(); err == nil {
			left = newBinary(op, left, right)
		}
	}
	return left, err
}

func (p *parser) parseMultiplicative() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	left, err := p.parsePower()
	for err == nil && p.is(tMultiplicative) {
		op := p.toks[p.pos].val
		p.pos++
		if err = p.link(&links); err != nil {
			break
		}
		var right node
		if right, err = p.parsePower(); err == nil {
			left = newBinary(op, left, right)
		}
	}
	return left, err
}

func (p *parser) parsePower() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	left, err := p.parseTest()
	for err == nil && p.is(tPower) {
		p.pos++
		if err = p.link(&links); err != nil {
			break
		}
		var right node
		if right, err = p.parseTest(); err == nil {
			left = newBinary("**", left, right)
		}
	}
	return left, err
}

func (p *parser) parseTest() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	operand, err := p.parseFilter()
	for err == nil && p.isIdent("is") {
		p.pos++
		if err = p.link(&links); err != nil {
			return nil, err
		}
		negate := p.isIdent("not")
		if negate {
			p.pos++
		}
		var t node
		if t, err = p.parsePrimary(); err != nil {
			return nil, err
		}
		id, ok := t.(*ident)
		if !ok {
			return nil, errors.New("parser error: expected identifier for the test")
		}
		operand = &testExpr{operand: operand, negate: negate, test: id.name}
	}
	return operand, err
}

func (p *parser) parseFilter() (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	operand, err := p.parseUnarySign()
	for err == nil && p.is(tPipe) {
		p.pos++
		if err = p.link(&links); err != nil {
			return nil, err
		}
		var f node
		if f, err = p.parsePrimary(); err != nil {
			return nil, err
		}
		if _, ok := f.(*ident); !ok {
			return nil, errors.New("parser error: expected identifier for the filter")
		}
		if p.is(tOpenParen) {
			if f, err = p.parseCall(f); err != nil {
				return nil, err
			}
		}
		operand = &filterExpr{operand: operand, filter: f}
	}
	return operand, err
}

func (p *parser) parseUnarySign() (node, error) {
	if tok, ok := p.peek(0); ok && (tok.typ == tUnary || tok.typ == tAdditive) && (tok.val == "-" || tok.val == "+") {
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		p.pos++
		arg, err := p.parseUnarySign()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{op: tok.val, arg: arg}, nil
	}
	prim, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	m, err := p.parseMember(prim)
	if err != nil {
		return nil, err
	}
	if p.is(tOpenParen) {
		return p.parseCall(m)
	}
	return m, nil
}

func (p *parser) parseCall(callee node) (node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	args, err := p.parseArgs(false)
	if err != nil {
		return nil, err
	}
	var e node = &callExpr{callee: callee, args: args}
	if e, err = p.parseMember(e); err != nil {
		return nil, err
	}
	if p.is(tOpenParen) {
		return p.parseCall(e)
	}
	return e, nil
}

// parseArgs parses a parenthesised argument list; params selects macro
// parameter declarations rather than call arguments.
func (p *parser) parseArgs(params bool) ([]node, error) {
	if _, err := p.expect(tOpenParen, "expected opening parenthesis for arguments list"); err != nil {
		return nil, err
	}
	var args []node
	names := map[string]bool{}
	sawKw, sawSpread := false, false
	for !p.is(tCloseParen) {
		if p.pos >= len(p.toks) {
			return nil, errTokens
		}
		isKwSpread := p.is(tPower)
		isSpread := p.is(tMultiplicative) && p.toks[p.pos].val == "*"
		if params && (isKwSpread || isSpread) {
			return nil, errors.New("parser error: argument unpacking is not allowed in parameter declarations")
		}
		if isKwSpread {
			p.pos++
			e, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			args = append(args, &kwSpreadExpr{arg: e})
			if p.is(tComma) {
				p.pos++
			}
			if !p.is(tCloseParen) {
				return nil, errors.New("parser error: `**` must be applied to the final argument")
			}
			break
		}
		var arg node
		if isSpread {
			if sawSpread {
				return nil, errors.New("parser error: only one `*` argument unpacking is allowed")
			}
			sawSpread = true
			p.pos++
			e, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			arg = &spreadExpr{arg: e}
		} else {
			e, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			arg = e
			if p.is(tEquals) {
				p.pos++
				id, ok := e.(*ident)
				if !ok {
					return nil, errors.New("parser error: expected identifier for keyword argument")
				}
				v, err := p.parseExpression()
				if err != nil {
					return nil, err
				}
				arg = &kwArg{key: id.name, value: v}
			}
			if params {
				var name string
				switch a := arg.(type) {
				case *ident:
					name = a.name
				case *kwArg:
					name = a.key
				default:
					return nil, errors.New("parser error: expected identifier for parameter declaration")
				}
				if names[name] {
					return nil, fmt.Errorf("parser error: duplicate parameter name %s", name)
				}
				names[name] = true
			}
			if _, ok := arg.(*kwArg); ok {
				sawKw = true
			} else if sawKw {
				return nil, errors.New("parser error: positional arguments must come before keyword arguments")
			} else if sawSpread {
				return nil, errors.New("parser error: positional arguments must not follow `*` argument unpacking")
			}
		}
		args = append(args, arg)
		if p.is(tComma) {
			p.pos++
		}
	}
	p.pos++ // )
	return args, nil
}

func (p *parser) parseMember(object node) (node, error) {
	links := 0
	defer func() { p.depth -= links }()
	for p.is(tDot) || p.is(tOpenSquare) {
		computed := p.toks[p.pos].typ == tOpenSquare
		p.pos++
		if err := p.link(&links); err != nil {
			return nil, err
		}
		var prop node
		var err error
		if computed {
			if prop, err = p.parseSubscript(); err != nil {
				return nil, err
			}
			if _, err := p.expect(tCloseSquare, "expected closing square bracket"); err != nil {
				return nil, err
			}
		} else {
			if prop, err = p.parsePrimary(); err != nil {
				return nil, err
			}
			switch prop.(type) {
			case *ident, *intLit:
			default:
				return nil, errors.New("parser error: expected identifier or integer following dot operator")
			}
		}
		object = &memberExpr{object: object, property: prop, computed: computed}
	}
	return object, nil
}

func (p *parser) parseSubscript() (node, error) {
	var parts []node
	isSlice := false
	for !p.is(tCloseSquare) {
		if p.pos >= len(p.toks) {
			return nil, errTokens
		}
		if p.is(tColon) {
			parts = append(parts, nil)
			p.pos++
			isSlice = true
			continue
		}
		e, err := p.parseExpression()
		if err != nil {
			return nil, err
		}
		parts = append(parts, e)
		if p.is(tColon) {
			p.pos++
			isSlice = true
		}
	}
	if len(parts) == 0 {
		return nil, errors.New("parser error: expected at least one argument for member/slice expression")
	}
	if isSlice {
		if len(parts) > 3 {
			return nil, errors.New("parser error: expected 0-3 arguments for slice expression")
		}
		s := &sliceExpr{}
		for i, part := range parts {
			switch i {
			case 0:
				s.start = part
			case 1:
				s.stop = part
			case 2:
				s.step = part
			}
		}
		return s, nil
	}
	return parts[0], nil
}

func (p *parser) parsePrimary() (node, error) {
	tok, ok := p.peek(0)
	if !ok {
		return nil, errTokens
	}
	p.pos++
	switch tok.typ {
	case tNumber:
		f, err := strconv.ParseFloat(tok.val, 64)
		if err != nil {
			return nil, fmt.Errorf("parser error: bad number %q", tok.val)
		}
		if strings.Contains(tok.val, ".") {
			return &floatLit{f}, nil
		}
		return &intLit{f}, nil
	case tString:
		s := tok.val
		for p.is(tString) {
			s += p.toks[p.pos].val
			p.pos++
		}
		return &strLit{s}, nil
	case tIdent:
		return &ident{tok.val}, nil
	case tOpenParen:
		e, err := p.parseExpressionSequence(false)
		if err != nil {
			return nil, err
		}
		if _, err := p.expect(tCloseParen, "expected closing parenthesis"); err != nil {
			return nil, err
		}
		return e, nil
	case tOpenSquare:
		a := &arrayLit{}
		for !p.is(tCloseSquare) {
			if p.pos >= len(p.toks) {
				return nil, errTokens
			}
			e, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			a.items = append(a.items, e)
			if p.is(tComma) {
				p.pos++
			}
		}
		p.pos++
		return a, nil
	case tOpenCurly:
		o := &objectLit{}
		for !p.is(tCloseCurly) {
			if p.pos >= len(p.toks) {
				return nil, errTokens
			}
			k, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			if _, err := p.expect(tColon, "expected colon between key and value in object literal"); err != nil {
				return nil, err
			}
			v, err := p.parseExpression()
			if err != nil {
				return nil, err
			}
			o.keys = append(o.keys, k)
			o.vals = append(o.vals, v)
			if p.is(tComma) {
				p.pos++
			}
		}
		p.pos++
		return o, nil
	}
	return nil, fmt.Errorf("parser error: unexpected token %s", tok.typ)
}
