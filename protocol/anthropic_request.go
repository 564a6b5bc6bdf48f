package protocol

import (
	"fmt"
)

// AnthropicToChat converts an Anthropic Messages request body
// (POST /v1/messages) to a chat completions request body appended to dst.
// m is reset and filled with what the response conversion needs. Errors
// are *Error (status 400) naming the offending field in Param.
//
// Duplicate keys: the last one wins, as in the engines' JSON decoders.
func AnthropicToChat(dst, body []byte, opt *Options, m *Meta) ([]byte, error) {
	return anthropicToChat(dst, body, opt, m, false)
}

// AnthropicCountTokensToChat converts a count_tokens request body
// (POST /v1/messages/count_tokens: a Messages body without max_tokens) to
// a chat body whose messages and tools are the prompt the engine would
// see. Render and tokenize it (ChatMessages) and answer with
// AppendCountTokens.
func AnthropicCountTokensToChat(dst, body []byte, opt *Options, m *Meta) ([]byte, error) {
	return anthropicToChat(dst, body, opt, m, true)
}

// AppendCountTokens appends the count_tokens answer {"input_tokens":n}.
func AppendCountTokens(dst []byte, n int) []byte {
	dst = append(dst, `{"input_tokens":`...)
	dst = appendInt(dst, int64(n))
	return append(dst, '}')
}

type span struct{ s, e int }

func (sp span) ok() bool { return sp.e > sp.s }

type anthropicReq struct {
	model, messages, system, maxTokens, stopSeqs, stream span
	temperature, topP, topK, metadata, tools, toolChoice span
	thinking, outputConfig, outputFormat                 span
}

// conv is the output state of one request conversion.
type conv struct {
	d    []byte
	out  []byte
	opt  *Options
	m    *Meta
	nMsg int
	// lastAssistant: the last message written is the assistant's.
	lastAssistant bool
}

func (c *conv) v(sp span) []byte { return c.d[sp.s:sp.e] }

// beginMsg writes the separator and the start of a message object.
func (c *conv) beginMsg(role string) {
	if c.nMsg > 0 {
		c.out = append(c.out, ',')
	}
	c.nMsg++
	c.out = append(c.out, `{"role":"`...)
	c.out = append(c.out, role...)
	c.out = append(c.out, `"`...)
	c.lastAssistant = role == "assistant"
}

// at locates a content value for error messages: a message index, or -1
// for the top-level system field. Messages are built only on error.
type at int

func (a at) err(msg string) *Error {
	if a < 0 {
		return badRequest("system", "system"+msg)
	}
	return badRequest("messages", fmt.Sprintf("messages[%d].content%s", int(a), msg))
}

func msgErr(i int, msg string) *Error {
	return badRequest("messages", fmt.Sprintf("messages[%d]%s", i, msg))
}

func pathErr(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func anthropicToChat(dst, body []byte, opt *Options, m *Meta, countOnly bool) ([]byte, error) {
	m.start(Anthropic, "msg_")
	start := skipSpace(body, 0)
	if start >= len(body) || body[start] != '{' {
		if j, err := skipValue(body, start, 0); err != nil || skipSpace(body, j) != len(body) {
			return dst, errMalformedBody
		}
		return dst, errNotObject
	}
	var r anthropicReq
	end, err := walkObject(body, start, 0, func(key []byte, vs, ve int) error {
		sp := span{vs, ve}
		switch string(key) {
		case "model":
			r.model = sp
		case "messages":
			r.messages = sp
		case "system":
			r.system = sp
		case "max_tokens":
			r.maxTokens = sp
		case "stop_sequences":
			r.stopSeqs = sp
		case "stream":
			r.stream = sp
		case "temperature":
			r.temperature = sp
		case "top_p":
			r.topP = sp
		case "top_k":
			r.topK = sp
		case "metadata":
			r.metadata = sp
		case "tools":
			r.tools = sp
		case "tool_choice":
			r.toolChoice = sp
		case "thinking":
			r.thinking = sp
		case "output_config":
			r.outputConfig = sp
		case "output_format": // the structured-outputs beta's name of output_config.format
			r.outputFormat = sp
		case "thread":
			if body[vs] != 'n' { // null: no thread
				return errThreadUnsupported
			}
		}
		return nil
	})
	if err == errThreadUnsupported {
		return dst, err
	}
	if err != nil || skipSpace(body, end) != len(body) {
		return dst, errMalformedBody
	}
	c := conv{d: body, out: dst, opt: opt, m: m}
	mark := len(dst)

	if !r.model.ok() || isNull(c.v(r.model)) {
		return dst, badRequest("model", "model: field required")
	}
	modelRaw, ok := rawStr(c.v(r.model))
	if !ok {
		return dst, badRequest("model", "model must be a string")
	}
	m.Model = unescape(m.Model, modelRaw)
	if !countOnly {
		if !r.maxTokens.ok() {
			return dst, badRequest("max_tokens", "max_tokens: field required")
		}
		n, ok := intVal(c.v(r.maxTokens))
		if !ok || n < 1 {
			return dst, badRequest("max_tokens", "max_tokens must be an integer >= 1")
		}
		m.MaxTokens = n
	}
	if r.stream.ok() && !countOnly {
		var err error
		if m.Stream, err = opt.readStream(c.v(r.stream)); err != nil {
			return dst, err
		}
	}
	if !r.messages.ok() || c.d[r.messages.s] != '[' {
		return dst, badRequest("messages", "messages: field required (an array of messages)")
	}

	c.out = append(c.out, `{"model":`...)
	c.out = append(c.out, c.v(r.model)...)
	c.out = append(c.out, `,"messages":[`...)
	if err := c.anthropicMessages(r); err != nil {
		return dst[:mark], err
	}
	c.out = append(c.out, ']')
	if !countOnly {
		c.out = append(c.out, `,"max_tokens":`...)
		c.out = appendInt(c.out, m.MaxTokens)
		if m.Stream {
			c.out = append(c.out, `,"stream":true,"stream_options":{"include_usage":true}`...)
		}
		for _, f := range [...]struct {
			sp   span
			name string
		}{{r.temperature, "temperature"}, {r.topP, "top_p"}, {r.topK, "top_k"}} {
			if !f.sp.ok() || isNull(c.v(f.sp)) {
				continue
			}
			if !isNumber(c.v(f.sp)) {
				return dst[:mark], badRequest(f.name, f.name+" must be a number")
			}
			c.out = append(c.out, `,"`...)
			c.out = append(c.out, f.name...)
			c.out = append(c.out, `":`...)
			c.out = append(c.out, c.v(f.sp)...)
		}
		if err := c.stopSequences(r.stopSeqs); err != nil {
			return dst[:mark], err
		}
		if r.metadata.ok() && c.d[r.metadata.s] == '{' {
			md := c.v(r.metadata)
			var uid []byte
			fields(md, func(k []byte, vs, ve int) error {
				if string(k) == "user_id" {
					uid = md[vs:ve]
				}
				return nil
			})
			if uid != nil && !isNull(uid) {
				if _, ok := rawStr(uid); !ok {
					return dst[:mark], badRequest("metadata.user_id", "metadata.user_id must be a string")
				}
				c.out = append(c.out, `,"user":`...)
				c.out = append(c.out, uid...)
			}
		}
	}
	if err := c.anthropicTools(r, countOnly); err != nil {
		return dst[:mark], err
	}
	// A count gets the reasoning fields too: mapped to
	// chat_template_kwargs.enable_thinking they change the rendered
	// prompt. Its thinking field is not checked (it is ignored when bad).
	rs, err := c.anthropicReasoning(r)
	if err != nil && !countOnly {
		return dst[:mark], err
	}
	if err == nil {
		c.out = opt.Reasoning.appendFields(c.out, rs)
	}
	if !countOnly {
		if err := c.anthropicFormat(r); err != nil {
			return dst[:mark], err
		}
	}
	if c.lastAssistant {
		// Anthropic continues a final assistant message (prefill); chat
		// engines (vLLM, SGLang) do so when asked.
		c.out = append(c.out, `,"add_generation_prompt":false,"continue_final_message":true`...)
		m.ContinueFinal = true
	}
	c.out = append(c.out, '}')
	return c.out, nil
}

func (c *conv) stopSequences(sp span) error {
	if !sp.ok() || isNull(c.v(sp)) {
		return nil
	}
	v := c.v(sp)
	if v[0] != '[' {
		return badRequest("stop_sequences", "stop_sequences must be an array of strings")
	}
	mark := len(c.out)
	c.out = append(c.out, `,"stop":[`...)
	n := 0
	err := elems(v, func(vs, ve int) error {
		raw, ok := rawStr(v[vs:ve])
		if !ok {
			return badRequest("stop_sequences", "stop_sequences must be an array of strings")
		}
		if n > 0 {
			c.out = append(c.out, ',')
		}
		n++
		c.out = append(c.out, v[vs:ve]...)
		c.m.addStop(raw)
		return nil
	})
	if err != nil {
		return jsonErr(err)
	}
	if n == 0 {
		c.out = c.out[:mark]
		return nil
	}
	c.out = append(c.out, ']')
	return nil
}

// anthropicMessages writes the system content and the messages.
func (c *conv) anthropicMessages(r anthropicReq) error {
	preserve := c.opt.PreserveSystemPosition
	msgs := c.v(r.messages)
	// System content: the top-level field, then (unless preserved in
	// place) every in-array system message, as one message at the front,
	// their texts concatenated as vLLM's _convert_system_message does
	// (vllm/entrypoints/anthropic/serving.py at 0001948b: "".join); none
	// when they hold no text.
	sysOpen := false
	addSys := func(v []byte, a at) error {
		if isNull(v) {
			return nil
		}
		opened := !sysOpen
		undo := c.mark()
		if opened {
			c.beginMsg("system")
			c.out = append(c.out, `,"content":"`...)
			sysOpen = true
		}
		wrote, err := c.textContent(v, a)
		if err == nil && opened && !wrote {
			c.undo(undo)
			sysOpen = false
		}
		return err
	}
	if r.system.ok() {
		if err := addSys(c.v(r.system), -1); err != nil {
			return err
		}
		if preserve && sysOpen {
			c.out = append(c.out, `"}`...)
			sysOpen = false
		}
	}
	if !preserve {
		i := 0
		err := elems(msgs, func(vs, ve int) error {
			defer func() { i++ }()
			msg := msgs[vs:ve]
			if msg[0] != '{' {
				return msgErr(i, " must be an object")
			}
			role, content := msgFields(msg)
			if role != nil && strIs(role, "system") {
				if content == nil {
					return msgErr(i, ".content: field required")
				}
				return addSys(content, at(i))
			}
			return nil
		})
		if err != nil {
			return jsonErr(err)
		}
	}
	if sysOpen {
		c.out = append(c.out, `"}`...)
	}
	// The turns: each run of consecutive user (or assistant) turns is
	// written as one turn holding all their blocks. System messages moved
	// to the front do not part a run; kept in place, they do.
	var run turnRun
	i := 0
	err := elems(msgs, func(vs, ve int) error {
		defer func() { i++ }()
		msg := msgs[vs:ve]
		var role, content []byte
		var bad *Error
		if msg[0] != '{' {
			bad = msgErr(i, " must be an object")
		} else if role, content = msgFields(msg); role == nil {
			bad = msgErr(i, ".role: field required")
		} else if content == nil || isNull(content) {
			bad = msgErr(i, ".content: field required")
		}
		kind := turnSystem
		switch {
		case bad != nil:
		case strIs(role, "user"):
			kind = turnUser
		case strIs(role, "assistant"):
			kind = turnAssistant
		case strIs(role, "system"):
			if !preserve {
				return nil // moved to the front
			}
		default:
			bad = msgErr(i, ".role must be user, assistant or system")
		}
		if bad == nil && kind != turnSystem && run.n > 0 && run.kind == kind {
			run.add(content, i, vs, ve)
			return nil
		}
		// The run ends here: written first, so that errors come in
		// message order.
		if err := c.anthropicRun(msgs, &run); err != nil {
			return err
		}
		run.n = 0
		if bad != nil {
			return bad
		}
		if kind != turnSystem {
			run.kind = kind
			run.add(content, i, vs, ve)
			return nil
		}
		// Kept even when it holds no text: it parts the runs around it.
		c.beginMsg("system")
		c.out = append(c.out, `,"content":"`...)
		if _, err := c.textContent(content, at(i)); err != nil {
			return err
		}
		c.out = append(c.out, `"}`...)
		return nil
	})
	if err == nil {
		err = c.anthropicRun(msgs, &run)
	}
	if err != nil {
		return jsonErr(err)
	}
	if c.nMsg == 0 {
		return badRequest("messages", "messages: at least one message is required")
	}
	return nil
}

type turnKind uint8

const (
	turnSystem turnKind = iota
	turnUser
	turnAssistant
)

// runAtHand is how many turns of a run keep their content at hand; the
// others are found again in the messages, once per pass over the run.
const runAtHand = 4

// turnRun is a run of n consecutive turns of one role: the first
// runAtHand in contents (content values) and idx (message indexes), the
// others in msgs[s:e], which starts with messages[si] and where in-array
// system messages moved to the front may lie between them.
type turnRun struct {
	kind     turnKind
	n        int
	contents [runAtHand][]byte
	idx      [runAtHand]int
	s, e, si int
}

// add adds messages[i], msgs[vs:ve] with content content, to the run.
func (r *turnRun) add(content []byte, i, vs, ve int) {
	switch {
	case r.n < runAtHand:
		r.contents[r.n], r.idx[r.n] = content, i
	case r.n == runAtHand:
		r.s, r.e, r.si = vs, ve, i
	default:
		r.e = ve
	}
	r.n++
}

// anthropicRun writes a run of turns as one turn holding all their blocks
// in order. The Messages API combines consecutive turns of one role into
// one; chat templates that want roles to alternate (Mistral's, Gemma's)
// refuse them apart.
func (c *conv) anthropicRun(msgs []byte, r *turnRun) error {
	it := turnIter{r: *r, msgs: msgs}
	switch {
	case r.n == 0:
		return nil
	case r.kind == turnUser:
		return c.anthropicUser(it)
	default:
		return c.anthropicAssistant(it)
	}
}

// turnIter walks the turns of a run; a copy starts again from where the
// original stood.
type turnIter struct {
	r    turnRun
	msgs []byte
	k    int // turns returned
	p, i int // past runAtHand: the next turn's offset in msgs and index
}

// next returns the content of the next turn and its message index.
func (t *turnIter) next() (content []byte, i int, ok bool) {
	r := &t.r
	if t.k < r.n && t.k < runAtHand {
		content, i = r.contents[t.k], r.idx[t.k]
		t.k++
		if t.k == runAtHand {
			t.p, t.i = r.s, r.si
		}
		return content, i, true
	}
	for t.k < r.n && t.p < r.e {
		var role []byte
		end, err := fieldsAt(t.msgs, t.p, func(k []byte, vs, ve int) error {
			switch string(k) {
			case "role":
				role = t.msgs[vs:ve]
			case "content":
				content = t.msgs[vs:ve]
			}
			return nil
		})
		if err != nil {
			panic("BUG: a run of turns lost its validated message bounds")
		}
		i = t.i
		t.i++
		t.p = skipSpace(t.msgs, end)
		if t.p < r.e && t.msgs[t.p] == ',' {
			t.p = skipSpace(t.msgs, t.p+1)
		}
		if !strIs(role, "system") {
			t.k++
			return content, i, true
		}
	}
	return nil, 0, false
}

// msgFields returns the role and content values of a message object.
func msgFields(msg []byte) (role, content []byte) {
	fields(msg, func(k []byte, vs, ve int) error {
		switch string(k) {
		case "role":
			role = msg[vs:ve]
		case "content":
			content = msg[vs:ve]
		}
		return nil
	})
	return
}

// billingHeader starts the text block in which Claude Code sends a
// per-request attribution hash with its system prompt.
const billingHeader = "x-anthropic-billing-header"

// textContent writes the text of a system value v (a string, or an array
// of text blocks) as the body of an open JSON string, and reports whether
// it wrote any. Blocks are concatenated, and empty ones and those that
// start with Claude Code's billing header are left out, as vLLM's
// Messages API converter does (vllm/entrypoints/anthropic/serving.py at
// 0001948b, _convert_system_message: the header's hash changes with every
// request and would end the engine's cached prefix there).
func (c *conv) textContent(v []byte, a at) (bool, error) {
	if raw, ok := rawStr(v); ok {
		c.out = append(c.out, raw...)
		return len(raw) > 0, nil
	}
	if v[0] != '[' {
		return false, a.err(" must be a string or an array of text blocks")
	}
	wrote := false
	err := elems(v, func(vs, ve int) error {
		b := v[vs:ve]
		if b[0] != '{' {
			return a.err(" must be a string or an array of text blocks")
		}
		typ, text := blockTypeText(b)
		if !strIs(typ, "text") {
			return a.err(": only text blocks are supported here")
		}
		raw, ok := rawStr(text)
		if !ok {
			return a.err(": a text block needs a string text")
		}
		if len(raw) == 0 || hasDecodedPrefix(raw, billingHeader) {
			return nil
		}
		wrote = true
		c.out = append(c.out, raw...)
		return nil
	})
	return wrote, jsonErr2(err)
}

// convMark is a point of a conversion's output to go back to.
type convMark struct {
	n, nMsg       int
	lastAssistant bool
}

func (c *conv) mark() convMark { return convMark{len(c.out), c.nMsg, c.lastAssistant} }

// undo takes the output back to m.
func (c *conv) undo(m convMark) {
	c.out, c.nMsg, c.lastAssistant = c.out[:m.n], m.nMsg, m.lastAssistant
}

// jsonErr2 is jsonErr that keeps nil nil.
func jsonErr2(err error) error {
	if err == nil {
		return nil
	}
	return jsonErr(err)
}

func blockTypeText(b []byte) (typ, text []byte) {
	fields(b, func(k []byte, vs, ve int) error {
		switch string(k) {
		case "type":
			typ = b[vs:ve]
		case "text":
			text = b[vs:ve]
		}
		return nil
	})
	return
}

// anthropicUser writes a run of user turns as one turn: the tool_result
// blocks become tool messages (first, in order, as chat requires them
// right after the assistant's calls), the other blocks one user message
// after them, in order. A string content is one text block.
func (c *conv) anthropicUser(run turnIter) error {
	// Pass 1: tool results; classify the rest.
	nOther, images := 0, false
	for t := run; ; {
		content, i, ok := t.next()
		if !ok {
			break
		}
		n, img, err := c.userToolResults(content, at(i))
		if err != nil {
			return err
		}
		nOther += n
		images = images || img
	}
	if nOther == 0 && !images {
		return nil
	}
	// Pass 2: the user message with text, documents and images (including
	// images returned inside tool results, which chat tool messages cannot
	// carry): a string without images, else an array of parts.
	c.beginMsg("user")
	if images {
		c.out = append(c.out, `,"content":[`...)
	} else {
		c.out = append(c.out, `,"content":"`...)
	}
	n := 0
	for t := run; ; {
		content, i, ok := t.next()
		if !ok {
			break
		}
		var err error
		if images {
			err = c.userParts(content, at(i), &n)
		} else {
			err = c.userText(content, at(i), &n)
		}
		if err != nil {
			return err
		}
	}
	if images {
		c.out = append(c.out, "]}"...)
	} else {
		c.out = append(c.out, `"}`...)
	}
	return nil
}

// userToolResults writes the tool_result blocks of one user turn as tool
// messages and returns how many other blocks it holds and whether it
// holds images (inside tool results too).
func (c *conv) userToolResults(content []byte, a at) (nOther int, images bool, err error) {
	if _, ok := rawStr(content); ok {
		return 1, false, nil
	}
	if content[0] != '[' {
		return 0, false, a.err(" must be a string or an array of content blocks")
	}
	err = elems(content, func(vs, ve int) error {
		b := content[vs:ve]
		if b[0] != '{' {
			return a.err(" must be an array of content blocks")
		}
		var typ, toolID, inner []byte
		fields(b, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = b[s:e]
			case "tool_use_id":
				toolID = b[s:e]
			case "content":
				inner = b[s:e]
			}
			return nil
		})
		switch {
		case strIs(typ, "tool_result"):
			idRaw, ok := rawStr(toolID)
			if !ok {
				return a.err(": tool_result needs a string tool_use_id")
			}
			c.beginMsg("tool")
			c.out = append(c.out, `,"tool_call_id":"`...)
			c.out = append(c.out, idRaw...)
			c.out = append(c.out, `","content":"`...)
			has, err := c.toolResultText(inner, a)
			if err != nil {
				return err
			}
			images = images || has
			c.out = append(c.out, `"}`...)
			c.toolReferences(idRaw, inner)
		case strIs(typ, "text"), strIs(typ, "document"):
			nOther++
		case strIs(typ, "image"):
			nOther++
			images = true
		case strIs(typ, "thinking"), strIs(typ, "redacted_thinking"), strIs(typ, "tool_reference"):
			// not meaningful in a user turn; dropped (vLLM expands tool
			// references only inside a tool_result)
		default:
			return a.err(": unsupported content block type")
		}
		return nil
	})
	return nOther, images, jsonErr2(err)
}

// userText writes the text and documents of one user turn into the open
// content string, each after a newline unless it is the first (*n counts
// them).
func (c *conv) userText(content []byte, a at, n *int) error {
	if raw, ok := rawStr(content); ok {
		c.textSep(n)
		c.out = append(c.out, raw...)
		return nil
	}
	err := elems(content, func(vs, ve int) error {
		b := content[vs:ve]
		raw, typ, err := textBlock(b, a)
		if err != nil || typ != nil || len(raw) == 0 {
			return err // an empty block adds nothing, as in vLLM
		}
		c.textSep(n)
		c.out = append(c.out, raw...)
		return nil
	})
	return jsonErr2(err)
}

func (c *conv) textSep(n *int) {
	if *n > 0 {
		c.out = append(c.out, `\n`...)
	}
	*n++
}

// userParts writes the text, documents and images of one user turn as
// parts of the open content array (*n counts them).
func (c *conv) userParts(content []byte, a at, n *int) error {
	if raw, ok := rawStr(content); ok {
		c.textPart(n, raw)
		return nil
	}
	err := elems(content, func(vs, ve int) error {
		b := content[vs:ve]
		typ, text := blockTypeText(b)
		switch {
		case strIs(typ, "text"):
			raw, ok := rawStr(text)
			if !ok {
				return a.err(": a text block needs a string text")
			}
			if len(raw) > 0 {
				c.textPart(n, raw)
			}
		case strIs(typ, "document"):
			raw, err := documentText(b, a)
			if err != nil {
				return err
			}
			if len(raw) > 0 {
				c.textPart(n, raw)
			}
		case strIs(typ, "image"):
			return c.imagePart(n, b, a)
		case strIs(typ, "tool_result"):
			var inner []byte
			fields(b, func(k []byte, s, e int) error {
				if string(k) == "content" {
					inner = b[s:e]
				}
				return nil
			})
			if inner == nil || inner[0] != '[' {
				return nil
			}
			return elems(inner, func(s, e int) error {
				ib := inner[s:e]
				if t, _ := blockTypeText(ib); strIs(t, "image") {
					return c.imagePart(n, ib, a)
				}
				return nil
			})
		}
		return nil
	})
	return jsonErr2(err)
}

func (c *conv) textPart(n *int, raw []byte) {
	if *n > 0 {
		c.out = append(c.out, ',')
	}
	*n++
	c.out = append(c.out, `{"type":"text","text":"`...)
	c.out = append(c.out, raw...)
	c.out = append(c.out, `"}`...)
}

// imagePart writes an image block as an image_url part: base64 sources
// become data: URLs, url sources stay URLs.
func (c *conv) imagePart(n *int, b []byte, a at) error {
	var src []byte
	fields(b, func(k []byte, s, e int) error {
		if string(k) == "source" {
			src = b[s:e]
		}
		return nil
	})
	if src == nil || src[0] != '{' {
		return a.err(": an image block needs a source object")
	}
	var typ, mediaType, data, url []byte
	fields(src, func(k []byte, s, e int) error {
		switch string(k) {
		case "type":
			typ = src[s:e]
		case "media_type":
			mediaType = src[s:e]
		case "data":
			data = src[s:e]
		case "url":
			url = src[s:e]
		}
		return nil
	})
	if *n > 0 {
		c.out = append(c.out, ',')
	}
	*n++
	switch {
	case strIs(typ, "base64"):
		mt, ok1 := rawStr(mediaType)
		dt, ok2 := rawStr(data)
		if !ok1 || !ok2 {
			return a.err(": a base64 image source needs media_type and data strings")
		}
		c.out = append(c.out, `{"type":"image_url","image_url":{"url":"data:`...)
		c.out = append(c.out, mt...)
		c.out = append(c.out, `;base64,`...)
		c.out = append(c.out, dt...)
		c.out = append(c.out, `"}}`...)
	case strIs(typ, "url"):
		u, ok := rawStr(url)
		if !ok {
			return a.err(": a url image source needs a url string")
		}
		c.out = append(c.out, `{"type":"image_url","image_url":{"url":"`...)
		c.out = append(c.out, u...)
		c.out = append(c.out, `"}}`...)
	default:
		return a.err(": image source type must be base64 or url")
	}
	return nil
}

// textBlock returns the raw text of a text block or of a plain-text
// document block. For any other block it returns the block's type instead
// (other is nil for text and documents), for the caller to handle.
func textBlock(b []byte, a at) (raw, other []byte, err error) {
	typ, text := blockTypeText(b)
	switch {
	case strIs(typ, "text"):
		var ok bool
		if raw, ok = rawStr(text); !ok {
			return nil, nil, a.err(": a text block needs a string text")
		}
		return raw, nil, nil
	case strIs(typ, "document"):
		raw, err = documentText(b, a)
		return raw, nil, err
	}
	if typ == nil {
		typ = []byte{}
	}
	return nil, typ, nil
}

// documentText returns the raw text of a plain-text document block
// (source type "text"); other documents (PDF, files) are refused.
func documentText(b []byte, a at) ([]byte, error) {
	var src []byte
	fields(b, func(k []byte, s, e int) error {
		if string(k) == "source" {
			src = b[s:e]
		}
		return nil
	})
	var typ, data []byte
	if src != nil && src[0] == '{' {
		fields(src, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = src[s:e]
			case "data":
				data = src[s:e]
			}
			return nil
		})
	}
	raw, ok := rawStr(data)
	if !strIs(typ, "text") || !ok {
		return nil, a.err(": only plain-text documents (source type text) are supported")
	}
	return raw, nil
}

// toolReferences writes the tool_reference blocks of a tool_result's
// content inner (references to deferred tools, as Claude Code's tool
// search returns them) as vLLM's Messages front door does
// (vllm/entrypoints/anthropic/serving.py at 0001948b,
// _convert_user_tool_result): one more tool message for the call, its
// content {"type": "tool_reference", "name": N} parts, N a block's
// tool_name, else its name (blocks with neither are left out). A chat
// template that loops over content parts expands them.
func (c *conv) toolReferences(idRaw, inner []byte) {
	if len(inner) == 0 || inner[0] != '[' {
		return
	}
	n := 0
	elems(inner, func(vs, ve int) error {
		b := inner[vs:ve]
		if b[0] != '{' {
			return nil
		}
		var typ, toolName, name []byte
		fields(b, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = b[s:e]
			case "tool_name":
				toolName = b[s:e]
			case "name":
				name = b[s:e]
			}
			return nil
		})
		if !strIs(typ, "tool_reference") {
			return nil
		}
		ref, ok := rawStr(toolName)
		if !ok || len(ref) == 0 {
			ref, ok = rawStr(name)
		}
		if !ok || len(ref) == 0 {
			return nil
		}
		if n == 0 {
			c.beginMsg("tool")
			c.out = append(c.out, `,"tool_call_id":"`...)
			c.out = append(c.out, idRaw...)
			c.out = append(c.out, `","content":[`...)
		} else {
			c.out = append(c.out, ',')
		}
		n++
		c.out = append(c.out, `{"type":"tool_reference","name":"`...)
		c.out = append(c.out, ref...)
		c.out = append(c.out, `"}`...)
		return nil
	})
	if n > 0 {
		c.out = append(c.out, "]}"...)
	}
}

// toolResultText writes the text of a tool_result's content (a string or
// text blocks joined with '\n') into an open JSON string and reports
// whether it holds images (written later, in the user message);
// tool_reference blocks are written apart (toolReferences).
func (c *conv) toolResultText(v []byte, a at) (images bool, err error) {
	if v == nil || isNull(v) {
		return false, nil
	}
	if raw, ok := rawStr(v); ok {
		c.out = append(c.out, raw...)
		return false, nil
	}
	if v[0] != '[' {
		return false, a.err(": tool_result content must be a string or an array of blocks")
	}
	n := 0
	err = elems(v, func(vs, ve int) error {
		b := v[vs:ve]
		if b[0] != '{' {
			return a.err(": tool_result content must be an array of blocks")
		}
		raw, typ, err := textBlock(b, a)
		switch {
		case err != nil:
			return err
		case strIs(typ, "image"):
			images = true
			return nil
		case strIs(typ, "tool_reference"):
			return nil
		case typ != nil:
			return a.err(": unsupported block type in tool_result content")
		}
		if n > 0 {
			c.out = append(c.out, `\n`...)
		}
		n++
		c.out = append(c.out, raw...)
		return nil
	})
	return images, jsonErr2(err)
}

// anthropicAssistant writes a run of assistant turns as one assistant
// message: text blocks joined with '\n' as content, thinking blocks as
// reasoning_content, tool_use blocks as tool_calls, each in order. A
// string content is one text block.
func (c *conv) anthropicAssistant(run turnIter) error {
	c.beginMsg("assistant")
	c.out = append(c.out, `,"content":"`...)
	n, nThink, nTools := 0, 0, 0
	for t := run; ; {
		content, i, ok := t.next()
		if !ok {
			break
		}
		a := at(i)
		if raw, ok := rawStr(content); ok {
			c.textSep(&n)
			c.out = append(c.out, raw...)
			continue
		}
		if content[0] != '[' {
			return a.err(" must be a string or an array of content blocks")
		}
		err := elems(content, func(vs, ve int) error {
			b := content[vs:ve]
			if b[0] != '{' {
				return a.err(" must be an array of content blocks")
			}
			typ, text := blockTypeText(b)
			switch {
			case strIs(typ, "text"):
				raw, ok := rawStr(text)
				if !ok {
					return a.err(": a text block needs a string text")
				}
				if len(raw) > 0 { // an empty block adds nothing, as in vLLM
					c.textSep(&n)
					c.out = append(c.out, raw...)
				}
			case strIs(typ, "thinking"):
				nThink++
			case strIs(typ, "tool_use"):
				nTools++
			case strIs(typ, "redacted_thinking"):
			default:
				return a.err(": unsupported content block type in an assistant message")
			}
			return nil
		})
		if err != nil {
			return jsonErr(err)
		}
	}
	c.out = append(c.out, '"')
	if nThink > 0 {
		// Concatenated, as vLLM's "".join(reasoning_parts).
		c.out = append(c.out, `,"reasoning_content":"`...)
		for t := run; ; {
			content, _, ok := t.next()
			if !ok {
				break
			}
			if content[0] != '[' {
				continue
			}
			elems(content, func(vs, ve int) error {
				b := content[vs:ve]
				var typ, th []byte
				fields(b, func(k []byte, s, e int) error {
					switch string(k) {
					case "type":
						typ = b[s:e]
					case "thinking":
						th = b[s:e]
					}
					return nil
				})
				if raw, ok := rawStr(th); ok && strIs(typ, "thinking") {
					c.out = append(c.out, raw...)
				}
				return nil
			})
		}
		c.out = append(c.out, '"')
	}
	if nTools > 0 {
		c.out = append(c.out, `,"tool_calls":[`...)
		n := 0
		for t := run; ; {
			content, i, ok := t.next()
			if !ok {
				break
			}
			if content[0] != '[' {
				continue
			}
			if err := c.toolCalls(content, at(i), &n); err != nil {
				return err
			}
		}
		c.out = append(c.out, ']')
	}
	c.out = append(c.out, '}')
	return nil
}

// toolCalls writes the tool_use blocks of one assistant turn as parts of
// the open tool_calls array (*n counts them).
func (c *conv) toolCalls(content []byte, a at, n *int) error {
	err := elems(content, func(vs, ve int) error {
		b := content[vs:ve]
		var typ, id, name, input []byte
		fields(b, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = b[s:e]
			case "id":
				id = b[s:e]
			case "name":
				name = b[s:e]
			case "input":
				input = b[s:e]
			}
			return nil
		})
		if !strIs(typ, "tool_use") {
			return nil
		}
		idRaw, ok1 := rawStr(id)
		nameRaw, ok2 := rawStr(name)
		if !ok1 || !ok2 {
			return a.err(": tool_use needs string id and name")
		}
		if input == nil || input[0] != '{' {
			return a.err(": tool_use input must be an object")
		}
		if *n > 0 {
			c.out = append(c.out, ',')
		}
		*n++
		c.out = append(c.out, `{"id":"`...)
		c.out = append(c.out, idRaw...)
		c.out = append(c.out, `","type":"function","function":{"name":"`...)
		c.out = append(c.out, nameRaw...)
		c.out = append(c.out, `","arguments":"`...)
		c.out = appendJSONAsString(c.out, input)
		c.out = append(c.out, `"}}`...)
		return nil
	})
	return jsonErr2(err)
}

// appendJSONAsString appends the validated JSON value v, compacted, as the
// body of a JSON string (the chat "arguments" encoding).
func appendJSONAsString(dst, v []byte) []byte {
	in := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case in && c == '\\':
			// an escape inside a string: both bytes, each escaped
			dst = append(dst, '\\', '\\')
			i++
			if v[i] == '"' || v[i] == '\\' {
				dst = append(dst, '\\')
			}
			dst = append(dst, v[i])
		case c == '"':
			in = !in
			dst = append(dst, '\\', '"')
		case !in && isSpace(c):
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// anthropicTools writes tools and tool_choice.
func (c *conv) anthropicTools(r anthropicReq, countOnly bool) error {
	if !r.tools.ok() || isNull(c.v(r.tools)) {
		return nil
	}
	tools := c.v(r.tools)
	if tools[0] != '[' {
		return badRequest("tools", "tools must be an array")
	}
	mark := len(c.out)
	c.out = append(c.out, `,"tools":[`...)
	n := 0
	err := elems(tools, func(vs, ve int) error {
		t := tools[vs:ve]
		if t[0] != '{' {
			return badRequest("tools", pathErr("tools[%d] must be an object", n))
		}
		var typ, name, desc, schema, strict []byte
		fields(t, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = t[s:e]
			case "name":
				name = t[s:e]
			case "description":
				desc = t[s:e]
			case "input_schema":
				schema = t[s:e]
			case "strict":
				strict = t[s:e]
			}
			return nil
		})
		if typ != nil && !isNull(typ) && !strIs(typ, "custom") {
			return badRequest("tools", pathErr("tools[%d]: server tools are not supported (only client tools with an input_schema)", n))
		}
		nameRaw, ok := rawStr(name)
		if !ok || len(nameRaw) == 0 {
			return badRequest("tools", pathErr("tools[%d].name: a non-empty string is required", n))
		}
		if n > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, `{"type":"function","function":{"name":"`...)
		c.out = append(c.out, nameRaw...)
		c.out = append(c.out, '"')
		if _, ok := rawStr(desc); ok {
			c.out = append(c.out, `,"description":`...)
			c.out = append(c.out, desc...)
		}
		c.out = append(c.out, `,"parameters":`...)
		if schema != nil && schema[0] == '{' {
			c.out = append(c.out, schema...)
		} else if schema == nil || isNull(schema) {
			c.out = append(c.out, `{"type":"object","properties":{}}`...)
		} else {
			return badRequest("tools", pathErr("tools[%d].input_schema must be an object", n))
		}
		if strict != nil && (strict[0] == 't' || strict[0] == 'f') {
			c.out = append(c.out, `,"strict":`...)
			c.out = append(c.out, strict...)
		}
		c.out = append(c.out, "}}"...)
		n++
		return nil
	})
	if err != nil {
		return jsonErr(err)
	}
	if n == 0 {
		c.out = c.out[:mark]
		return nil
	}
	c.out = append(c.out, ']')
	if countOnly || !r.toolChoice.ok() || isNull(c.v(r.toolChoice)) {
		return nil
	}
	tc := c.v(r.toolChoice)
	if tc[0] != '{' {
		return badRequest("tool_choice", "tool_choice must be an object")
	}
	var typ, name, dpu []byte
	fields(tc, func(k []byte, s, e int) error {
		switch string(k) {
		case "type":
			typ = tc[s:e]
		case "name":
			name = tc[s:e]
		case "disable_parallel_tool_use":
			dpu = tc[s:e]
		}
		return nil
	})
	switch {
	case strIs(typ, "auto"):
		c.out = append(c.out, `,"tool_choice":"auto"`...)
	case strIs(typ, "any"):
		c.out = append(c.out, `,"tool_choice":"required"`...)
	case strIs(typ, "none"):
		c.out = append(c.out, `,"tool_choice":"none"`...)
	case strIs(typ, "tool"):
		raw, ok := rawStr(name)
		if !ok {
			return badRequest("tool_choice", "tool_choice.name is required for type tool")
		}
		c.out = append(c.out, `,"tool_choice":{"type":"function","function":{"name":"`...)
		c.out = append(c.out, raw...)
		c.out = append(c.out, `"}}`...)
	default:
		return badRequest("tool_choice", "tool_choice.type must be auto, any, tool or none")
	}
	if dpu != nil && dpu[0] == 't' {
		c.out = append(c.out, `,"parallel_tool_calls":false`...)
	}
	return nil
}

// anthropicFormat writes output_config.format (structured outputs; the
// beta's top-level output_format too) as response_format: Anthropic's
// {"type":"json_schema","schema":{...}} is always strict and unnamed, a
// chat engine's json_schema needs a name.
func (c *conv) anthropicFormat(r anthropicReq) error {
	var format []byte
	param := "output_config.format"
	if r.outputConfig.ok() && c.d[r.outputConfig.s] == '{' {
		oc := c.v(r.outputConfig)
		fields(oc, func(k []byte, s, e int) error {
			if string(k) == "format" {
				format = oc[s:e]
			}
			return nil
		})
	}
	if (format == nil || isNull(format)) && r.outputFormat.ok() {
		format, param = c.v(r.outputFormat), "output_format"
	}
	if format == nil || isNull(format) {
		return nil
	}
	if format[0] != '{' {
		return badRequest(param, param+" must be an object")
	}
	var typ, schema []byte
	fields(format, func(k []byte, s, e int) error {
		switch string(k) {
		case "type":
			typ = format[s:e]
		case "schema":
			schema = format[s:e]
		}
		return nil
	})
	if !strIs(typ, "json_schema") || schema == nil || schema[0] != '{' {
		return badRequest(param, param+` must be {"type":"json_schema","schema":{...}}`)
	}
	c.out = append(c.out, `,"response_format":{"type":"json_schema","json_schema":{"name":"output","schema":`...)
	c.out = append(c.out, schema...)
	c.out = append(c.out, `,"strict":true}}`...)
	return nil
}

// anthropicReasoning reads thinking and output_config.effort.
func (c *conv) anthropicReasoning(r anthropicReq) (reasoning, error) {
	var rs reasoning
	if r.thinking.ok() && !isNull(c.v(r.thinking)) {
		th := c.v(r.thinking)
		if th[0] != '{' {
			return rs, badRequest("thinking", "thinking must be an object")
		}
		var typ, budget []byte
		fields(th, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = th[s:e]
			case "budget_tokens":
				budget = th[s:e]
			}
			return nil
		})
		switch {
		case strIs(typ, "enabled"):
			n, ok := intVal(budget)
			if !ok {
				return rs, badRequest("thinking", "thinking.budget_tokens must be a non-negative integer")
			}
			rs.level = c.opt.Reasoning.budgetEffort(n)
		case strIs(typ, "disabled"):
			rs.level = effOff
		case strIs(typ, "adaptive"), strIs(typ, "between_tools"):
			rs.level = effOn
		default:
			return rs, badRequest("thinking", "thinking.type must be enabled, disabled, adaptive or between_tools")
		}
	}
	if r.outputConfig.ok() && c.d[r.outputConfig.s] == '{' && rs.level != effOff {
		oc := c.v(r.outputConfig)
		var eff []byte
		fields(oc, func(k []byte, s, e int) error {
			if string(k) == "effort" {
				eff = oc[s:e]
			}
			return nil
		})
		if eff != nil && !isNull(eff) && eff[0] != '"' {
			return rs, badRequest("output_config", "output_config.effort must be low, medium, high, xhigh or max")
		}
		if raw, ok := rawStr(eff); ok {
			switch string(raw) {
			case "low":
				rs.level = effLow
			case "medium":
				rs.level = effMedium
			case "high":
				rs.level = effHigh
			case "xhigh", "max":
				rs.level = effXHigh
			default:
				return rs, badRequest("output_config", "output_config.effort must be low, medium, high, xhigh or max")
			}
		}
	}
	return rs, nil
}
