package jinja

// IteratesMessageContent reports whether the template loops over a
// message's content, as vLLM's --chat-template-content-format auto decides
// it (vllm/renderers/hf.py, _detect_content_format): such a template gets
// each message's content as a list of parts ({"type": "text", "text": ...}),
// others get a string.
//
// As vLLM does, on the template's syntax only: the names holding the
// messages are "messages" and those a {% set %} assigns from one of them
// (possibly through filters, tests and slices: messages[1:],
// messages|selectattr(...)); a message is the target of a for loop over
// one of those; the template iterates the content when a for loop's
// iterable is a message's ['content'] or .content (again through filters,
// tests and slices). Where vLLM's detection fails (such an assignment or
// loop with another target than a plain name), the answer is false, its
// "string" default.
func (t *Template) IteratesMessageContent() bool {
	var sets []*setNode
	var loops []*forNode
	walkStmts(t.body, func(n node) {
		switch n := n.(type) {
		case *setNode:
			if n.value != nil {
				sets = append(sets, n)
			}
		case *forNode:
			loops = append(loops, n)
		}
	})
	// The names holding the messages, found breadth first as vLLM does.
	msgNames := []string{"messages"}
	seen := map[string]bool{"messages": true}
	for i := 0; i < len(msgNames); i++ {
		for _, s := range sets {
			if !isVarOrElems(s.value, msgNames[i], "") {
				continue
			}
			id, ok := s.target.(*ident)
			if !ok {
				return false // vLLM's assertion fails: "string"
			}
			if !seen[id.name] {
				seen[id.name] = true
				msgNames = append(msgNames, id.name)
			}
		}
	}
	var itemNames []string
	for _, l := range loops {
		for _, name := range msgNames {
			if isVarOrElems(forIterable(l), name, "") {
				id, ok := l.loopvar.(*ident)
				if !ok {
					return false
				}
				itemNames = append(itemNames, id.name)
				break
			}
		}
	}
	for _, l := range loops {
		for _, name := range itemNames {
			if isVarOrElems(forIterable(l), name, "content") {
				_, ok := l.loopvar.(*ident)
				return ok
			}
		}
	}
	return false
}

// forIterable is a for loop's iterable without its filter (for x in y if
// c iterates y, as jinja2's For.iter).
func forIterable(l *forNode) node {
	if s, ok := l.iterable.(*selectExpr); ok {
		return s.lhs
	}
	return l.iterable
}

// isVarOrElems implements vLLM's _is_var_or_elems_access: n is the variable
// name (key == "") or its item key (name['key'] or name.key), possibly
// under filters, tests and slices.
func isVarOrElems(n node, name, key string) bool {
	switch n := n.(type) {
	case *filterExpr:
		return isVarOrElems(n.operand, name, key)
	case *testExpr:
		return isVarOrElems(n.operand, name, key)
	case *memberExpr:
		if _, ok := n.property.(*sliceExpr); ok && n.computed {
			return isVarOrElems(n.object, name, key)
		}
		if key == "" {
			return false
		}
		id, ok := n.object.(*ident)
		if !ok || id.name != name {
			return false
		}
		if n.computed {
			s, ok := n.property.(*strLit)
			return ok && s.s == key
		}
		p, ok := n.property.(*ident)
		return ok && p.name == key
	case *ident:
		return key == "" && n.name == name
	}
	return false
}

// walkStmts calls f for each statement of body and of the bodies nested in
// them, in document order (jinja2's find_all).
func walkStmts(body []node, f func(node)) {
	for _, n := range body {
		f(n)
		switch n := n.(type) {
		case *ifNode:
			walkStmts(n.body, f)
			walkStmts(n.alt, f)
		case *forNode:
			walkStmts(n.body, f)
			walkStmts(n.elseBody, f)
		case *setNode:
			walkStmts(n.body, f)
		case *macroNode:
			walkStmts(n.body, f)
		case *callStmt:
			walkStmts(n.body, f)
		case *filterStmt:
			walkStmts(n.body, f)
		}
	}
}
