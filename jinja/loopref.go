package jinja

// keepsLoop reports whether a template may keep a reference to a loop
// object beyond the iteration that made it: whether the name loop appears
// anywhere but as the object of a member access (loop.index, loop["first"]).
// Macros see their caller's scope, so the whole template is scanned, not
// only a loop's body. Where it does not, a for statement reuses one loop
// object for all its iterations instead of building one per iteration.
// Node types the scan does not know count as keeping a reference.
func keepsLoop(nodes []node) bool {
	for _, n := range nodes {
		if mentionsLoop(n) {
			return true
		}
	}
	return false
}

func mentionsLoop(n node) bool {
	switch n := n.(type) {
	case nil, *textNode, *commentNode, *intLit, *floatLit, *strLit, *breakNode, *continueNode:
		return false
	case *ident:
		return n.name == "loop"
	case *arrayLit:
		return keepsLoop(n.items)
	case *tupleLit:
		return keepsLoop(n.items)
	case *objectLit:
		return keepsLoop(n.keys) || keepsLoop(n.vals)
	case *ifNode:
		return mentionsLoop(n.test) || keepsLoop(n.body) || keepsLoop(n.alt)
	case *forNode:
		return mentionsLoop(n.loopvar) || mentionsLoop(n.iterable) || keepsLoop(n.body) || keepsLoop(n.elseBody)
	case *setNode:
		return mentionsLoop(n.target) || mentionsLoop(n.value) || keepsLoop(n.body)
	case *macroNode:
		return n.name == "loop" || keepsLoop(n.args) || keepsLoop(n.body)
	case *callStmt:
		return mentionsLoop(n.call) || keepsLoop(n.callerArgs) || keepsLoop(n.body)
	case *filterStmt:
		return mentionsLoop(n.filter) || keepsLoop(n.body)
	case *memberExpr:
		if id, ok := n.object.(*ident); ok && id.name == "loop" {
			return mentionsLoop(n.property)
		}
		return mentionsLoop(n.object) || mentionsLoop(n.property)
	case *sliceExpr:
		return mentionsLoop(n.start) || mentionsLoop(n.stop) || mentionsLoop(n.step)
	case *callExpr:
		return mentionsLoop(n.callee) || keepsLoop(n.args)
	case *kwArg:
		return n.key == "loop" || mentionsLoop(n.value)
	case *spreadExpr:
		return mentionsLoop(n.arg)
	case *kwSpreadExpr:
		return mentionsLoop(n.arg)
	case *binaryExpr:
		return mentionsLoop(n.left) || mentionsLoop(n.right)
	case *unaryExpr:
		return mentionsLoop(n.arg)
	case *filterExpr:
		return mentionsLoop(n.operand) || mentionsLoop(n.filter)
	case *testExpr:
		return mentionsLoop(n.operand)
	case *selectExpr:
		return mentionsLoop(n.lhs) || mentionsLoop(n.test)
	case *ternary:
		return mentionsLoop(n.cond) || mentionsLoop(n.trueExpr) || mentionsLoop(n.falseExpr)
	}
	return true
}
