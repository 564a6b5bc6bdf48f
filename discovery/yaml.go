package discovery

import (
	"fmt"
	"strconv"
	"strings"
)

// parseYAML parses the block-style YAML subset kubeconfig files use:
// nested mappings, sequences ("- " items, including "- key: v" maps),
// plain, 'single' and "double" quoted scalars, comments and blank lines.
// Every scalar is a string. Flow collections other than {} and [], anchors,
// tags and multi-line scalars are rejected or read as plain strings.
func parseYAML(data []byte) (any, error) {
	var ls []yline
	for n, raw := range strings.Split(string(data), "\n") {
		raw = strings.TrimRight(raw, "\r")
		if strings.HasPrefix(raw, "---") || strings.HasPrefix(raw, "...") {
			continue
		}
		if strings.ContainsRune(raw, '\t') && strings.TrimLeft(raw, " ") != strings.TrimLeft(raw, " \t") {
			return nil, fmt.Errorf("yaml line %d: tab indentation", n+1)
		}
		text := stripComment(strings.TrimLeft(raw, " "))
		if strings.TrimSpace(text) == "" {
			continue
		}
		ls = append(ls, yline{indent: len(raw) - len(strings.TrimLeft(raw, " ")), text: strings.TrimRight(text, " "), n: n + 1})
	}
	if len(ls) == 0 {
		return map[string]any{}, nil
	}
	p := &yparser{ls: ls}
	v, err := p.node(ls[0].indent)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.ls) {
		return nil, fmt.Errorf("yaml line %d: unexpected indentation", p.ls[p.i].n)
	}
	return v, nil
}

type yline struct {
	indent int
	text   string
	n      int
}

type yparser struct {
	ls    []yline
	i     int
	depth int
}

func isSeqItem(t string) bool { return t == "-" || strings.HasPrefix(t, "- ") }

func (p *yparser) node(indent int) (any, error) {
	if p.depth++; p.depth > 100 {
		return nil, fmt.Errorf("yaml: nesting too deep")
	}
	defer func() { p.depth-- }()
	if isSeqItem(p.ls[p.i].text) {
		return p.seq(indent)
	}
	return p.mapping(indent)
}

func (p *yparser) seq(indent int) (any, error) {
	out := []any{}
	for p.i < len(p.ls) && p.ls[p.i].indent == indent && isSeqItem(p.ls[p.i].text) {
		l := p.ls[p.i]
		rest := strings.TrimLeft(l.text[1:], " ")
		if rest == "" {
			p.i++
			if p.i < len(p.ls) && p.ls[p.i].indent > indent {
				v, err := p.node(p.ls[p.i].indent)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			} else {
				out = append(out, "")
			}
			continue
		}
		if _, _, ok := splitKey(rest); ok && !isQuoted(rest) {
			// "- key: v": a mapping whose first line starts after "- ".
			p.ls[p.i] = yline{indent: l.indent + len(l.text) - len(rest), text: rest, n: l.n}
			v, err := p.node(p.ls[p.i].indent)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			continue
		}
		s, err := scalar(rest, l.n)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		p.i++
	}
	return out, nil
}

func (p *yparser) mapping(indent int) (any, error) {
	out := map[string]any{}
	for p.i < len(p.ls) && p.ls[p.i].indent == indent && !isSeqItem(p.ls[p.i].text) {
		l := p.ls[p.i]
		k, v, ok := splitKey(l.text)
		if !ok {
			return nil, fmt.Errorf("yaml line %d: expected key: value", l.n)
		}
		key, err := scalar(k, l.n)
		if err != nil {
			return nil, err
		}
		p.i++
		if v != "" {
			s, err := scalar(v, l.n)
			if err != nil {
				return nil, err
			}
			out[key.(string)] = s
			continue
		}
		switch {
		case p.i < len(p.ls) && p.ls[p.i].indent > indent:
			child, err := p.node(p.ls[p.i].indent)
			if err != nil {
				return nil, err
			}
			out[key.(string)] = child
		case p.i < len(p.ls) && p.ls[p.i].indent == indent && isSeqItem(p.ls[p.i].text):
			child, err := p.seq(indent)
			if err != nil {
				return nil, err
			}
			out[key.(string)] = child
		default:
			out[key.(string)] = ""
		}
	}
	return out, nil
}

// splitKey splits "key: value" / "key:" outside quotes.
func splitKey(t string) (k, v string, ok bool) {
	inQ := byte(0)
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case inQ != 0:
			if c == inQ {
				inQ = 0
			}
		case (c == '"' || c == '\'') && i == 0:
			inQ = c
		case c == ':' && (i+1 == len(t) || t[i+1] == ' '):
			return strings.TrimSpace(t[:i]), strings.TrimSpace(t[i+1:]), true
		}
	}
	return "", "", false
}

func isQuoted(t string) bool {
	if len(t) < 2 || (t[0] != '"' && t[0] != '\'') {
		return false
	}
	_, _, ok := splitKey(t)
	if !ok {
		return true
	}
	return t[len(t)-1] == t[0] && !strings.Contains(t[1:len(t)-1], string(t[0])+":")
}

// stripComment drops a " #" comment outside quotes.
func stripComment(t string) string {
	inQ := byte(0)
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case inQ != 0:
			if c == inQ {
				inQ = 0
			}
		case c == '"' || c == '\'':
			if i == 0 || t[i-1] == ' ' || t[i-1] == ':' || t[i-1] == '-' {
				inQ = c
			}
		case c == '#' && (i == 0 || t[i-1] == ' '):
			return t[:i]
		}
	}
	return t
}

func scalar(s string, n int) (any, error) {
	switch {
	case s == "{}":
		return map[string]any{}, nil
	case s == "[]":
		return []any{}, nil
	case strings.HasPrefix(s, `"`):
		v, err := strconv.Unquote(s)
		if err != nil {
			return nil, fmt.Errorf("yaml line %d: bad double-quoted string", n)
		}
		return v, nil
	case strings.HasPrefix(s, "'"):
		if len(s) < 2 || s[len(s)-1] != '\'' {
			return nil, fmt.Errorf("yaml line %d: bad single-quoted string", n)
		}
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'"), nil
	case strings.HasPrefix(s, "|") || strings.HasPrefix(s, ">"):
		return nil, fmt.Errorf("yaml line %d: block scalars are not supported", n)
	}
	return s, nil
}
