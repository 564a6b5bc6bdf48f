package protocol

import (
	"fmt"
	"math"
	"slices"
)

// ResponsesToChat converts an OpenAI Responses request body
// (POST /v1/responses) to a chat completions request body appended to dst.
// m is reset and filled with what the response conversion needs (the
// settings a Response object echoes). Errors are *Error, HTTP 400.
//
// Stored state is refused: previous_response_id, conversation, prompt
// (stored prompt templates) and background need responses the router does
// not keep, so the client must send the whole conversation in input.
func ResponsesToChat(dst, body []byte, opt *Options, m *Meta) ([]byte, error) {
	m.start(Responses, "resp_")
	start := skipSpace(body, 0)
	if start >= len(body) || body[start] != '{' {
		if j, err := skipValue(body, start, 0); err != nil || skipSpace(body, j) != len(body) {
			return dst, errMalformedBody
		}
		return dst, errNotObject
	}
	var r struct {
		model, input, instructions, maxOut, temperature, topP, tools  span
		toolChoice, parallel, stream, text, reasoning, user, safetyID span
		metadata, truncation                                          span
	}
	var refuse *Error
	end, err := walkObject(body, start, 0, func(key []byte, vs, ve int) error {
		sp := span{vs, ve}
		v := body[vs:ve]
		switch string(key) {
		case "model":
			r.model = sp
		case "input":
			r.input = sp
		case "instructions":
			r.instructions = sp
		case "max_output_tokens":
			r.maxOut = sp
		case "temperature":
			r.temperature = sp
		case "top_p":
			r.topP = sp
		case "tools":
			r.tools = sp
		case "tool_choice":
			r.toolChoice = sp
		case "parallel_tool_calls":
			r.parallel = sp
		case "stream":
			r.stream = sp
		case "text":
			r.text = sp
		case "reasoning":
			r.reasoning = sp
		case "user":
			r.user = sp
		case "safety_identifier":
			r.safetyID = sp
		case "metadata":
			r.metadata = sp
		case "truncation":
			r.truncation = sp
		case "previous_response_id":
			if !isNull(v) && !strIs(v, "") {
				refuse = badRequest("previous_response_id", "previous_response_id is not supported: this gateway does not store responses; send the whole conversation in input")
			}
		case "conversation":
			if !isNull(v) {
				refuse = badRequest("conversation", "conversation is not supported: this gateway does not store conversations; send the whole conversation in input")
			}
		case "prompt":
			if !isNull(v) {
				refuse = badRequest("prompt", "prompt (stored prompt templates) is not supported; send instructions and input")
			}
		case "background":
			if v[0] == 't' {
				refuse = badRequest("background", "background responses are not supported: this gateway does not store responses")
			}
		}
		return nil
	})
	if err != nil || skipSpace(body, end) != len(body) {
		return dst, errMalformedBody
	}
	if refuse != nil {
		return dst, refuse
	}
	c := conv{d: body, out: dst, opt: opt, m: m}
	mark := len(dst)
	fail := func(e error) ([]byte, error) { return dst[:mark], e }

	if !r.model.ok() || isNull(c.v(r.model)) {
		return fail(badRequest("model", "model: field required"))
	}
	modelRaw, ok := rawStr(c.v(r.model))
	if !ok {
		return fail(badRequest("model", "model must be a string"))
	}
	m.Model = unescape(m.Model, modelRaw)
	if r.stream.ok() {
		if m.Stream, err = opt.readStream(c.v(r.stream)); err != nil {
			return fail(err)
		}
	}
	if !r.input.ok() || isNull(c.v(r.input)) {
		return fail(badRequest("input", "input: field required"))
	}
	c.out = append(c.out, `{"model":`...)
	c.out = append(c.out, c.v(r.model)...)
	c.out = append(c.out, `,"messages":[`...)
	if r.instructions.ok() && !isNull(c.v(r.instructions)) {
		raw, ok := rawStr(c.v(r.instructions))
		if !ok {
			return fail(badRequest("instructions", "instructions must be a string"))
		}
		m.setEcho(echoInstructions, c.v(r.instructions))
		if len(raw) > 0 { // "" gives no system message, as in vLLM
			c.beginMsg("system")
			c.out = append(c.out, `,"content":"`...)
			c.out = append(c.out, raw...)
			c.out = append(c.out, `"}`...)
		}
	}
	if err := c.responsesInput(c.v(r.input)); err != nil {
		return fail(err)
	}
	if c.nMsg == 0 {
		return fail(badRequest("input", "input: at least one message is required"))
	}
	c.out = append(c.out, ']')
	if r.maxOut.ok() && !isNull(c.v(r.maxOut)) {
		n, ok := intVal(c.v(r.maxOut))
		if !ok || n < 1 || n > math.MaxInt32 {
			return fail(badRequest("max_output_tokens", "max_output_tokens must be an integer in [1, 2147483647]"))
		}
		m.MaxTokens = n
		// Written as an integer: 100.0 and 1e2 are accepted (as Python
		// reads them) but are no integer to the router's parse of the
		// chat body, or to an engine that decodes into an int.
		c.out = append(c.out, `,"max_tokens":`...)
		at := len(c.out)
		c.out = appendInt(c.out, n)
		m.setEcho(echoMaxOutputTokens, c.out[at:])
	}
	if m.Stream {
		c.out = append(c.out, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	for _, f := range [...]struct {
		sp   span
		name string
		echo echoField
	}{{r.temperature, "temperature", echoTemperature}, {r.topP, "top_p", echoTopP}} {
		if !f.sp.ok() || isNull(c.v(f.sp)) {
			continue
		}
		if !isNumber(c.v(f.sp)) {
			return fail(badRequest(f.name, f.name+" must be a number"))
		}
		m.setEcho(f.echo, c.v(f.sp))
		c.out = append(c.out, `,"`...)
		c.out = append(c.out, f.name...)
		c.out = append(c.out, `":`...)
		c.out = append(c.out, c.v(f.sp)...)
	}
	if err := c.responsesTools(r.tools, r.toolChoice); err != nil {
		return fail(err)
	}
	if r.parallel.ok() && !isNull(c.v(r.parallel)) {
		v := c.v(r.parallel)
		if v[0] != 't' && v[0] != 'f' {
			return fail(badRequest("parallel_tool_calls", "parallel_tool_calls must be a boolean"))
		}
		m.setEcho(echoParallelToolCalls, v)
		c.out = append(c.out, `,"parallel_tool_calls":`...)
		c.out = append(c.out, v...)
	}
	if err := c.responsesText(r.text); err != nil {
		return fail(err)
	}
	for _, sp := range [...]span{r.user, r.safetyID} {
		if sp.ok() && !isNull(c.v(sp)) {
			if _, ok := rawStr(c.v(sp)); !ok {
				return fail(badRequest("user", "user and safety_identifier must be strings"))
			}
			if sp == r.user {
				m.setEcho(echoUser, c.v(sp))
			}
			c.out = append(c.out, `,"user":`...)
			c.out = append(c.out, c.v(sp)...)
			break
		}
	}
	if r.metadata.ok() && c.d[r.metadata.s] == '{' {
		m.setEcho(echoMetadata, c.v(r.metadata))
	}
	if r.truncation.ok() {
		if _, ok := rawStr(c.v(r.truncation)); ok {
			m.setEcho(echoTruncation, c.v(r.truncation))
		}
	}
	var rs reasoning
	if r.reasoning.ok() && !isNull(c.v(r.reasoning)) {
		v := c.v(r.reasoning)
		if v[0] != '{' {
			return fail(badRequest("reasoning", "reasoning must be an object"))
		}
		m.setEchoObj(echoReasoning, v, [2]string{"effort", "null"}, [2]string{"summary", "null"})
		var eff []byte
		fields(v, func(k []byte, s, e int) error {
			if string(k) == "effort" {
				eff = v[s:e]
			}
			return nil
		})
		if eff != nil && !isNull(eff) {
			raw, ok := rawStr(eff)
			if !ok {
				return fail(badRequest("reasoning", "reasoning.effort must be a string"))
			}
			rs.level, rs.raw = parseEffort(raw), raw
		}
	}
	c.out = opt.Reasoning.appendFields(c.out, rs)
	c.out = append(c.out, '}')
	return c.out, nil
}

// item locates an input item for error messages (built only on error).
type item int

func (i item) err(msg string) *Error {
	return badRequest("input", fmt.Sprintf("input[%d]%s", int(i), msg))
}

// responsesInput writes the input (a string, or an array of items) as
// vLLM's Responses front door builds chat messages from it
// (vllm/entrypoints/openai/responses/utils.py at 01ca842d,
// _construct_message_from_response_item): a function_call joins the
// assistant message just written as one of its tool_calls; a reasoning
// item's text becomes that message's reasoning_content unless it has one
// already (else it starts an assistant message of its own), and an
// assistant message item fills the content of the assistant message a
// reasoning item started.
func (c *conv) responsesInput(in []byte) error {
	if raw, ok := rawStr(in); ok {
		c.beginMsg("user")
		c.out = append(c.out, `,"content":"`...)
		c.out = append(c.out, raw...)
		c.out = append(c.out, `"}`...)
		return nil
	}
	if in[0] != '[' {
		return badRequest("input", "input must be a string or an array of items")
	}
	// The assistant message being written: its fields start at asstAt
	// (after its role); it has content, reasoning, asstCalls tool calls
	// (their array still open).
	asstOpen, asstCalls, asstAt := false, 0, 0
	asstContent, asstReasoning := false, false
	closeAsst := func() {
		if !asstOpen {
			return
		}
		if asstCalls > 0 {
			c.out = append(c.out, ']')
		}
		c.out = append(c.out, '}')
		asstOpen, asstCalls = false, 0
	}
	openAsst := func() {
		c.beginMsg("assistant")
		asstOpen, asstCalls, asstAt = true, 0, len(c.out)
		asstContent, asstReasoning = false, false
	}
	idx := 0
	err := elems(in, func(vs, ve int) error {
		it := item(idx)
		idx++
		v := in[vs:ve]
		if v[0] != '{' {
			return it.err(" must be an object")
		}
		var typ, role, content, callID, name, args, output, summary []byte
		fields(v, func(k []byte, s, e int) error {
			switch string(k) {
			case "summary":
				summary = v[s:e]
			case "type":
				typ = v[s:e]
			case "role":
				role = v[s:e]
			case "content":
				content = v[s:e]
			case "call_id":
				callID = v[s:e]
			case "name":
				name = v[s:e]
			case "arguments":
				args = v[s:e]
			case "output":
				output = v[s:e]
			}
			return nil
		})
		switch {
		case typ == nil || isNull(typ) || strIs(typ, "message"):
			if content == nil || isNull(content) {
				return it.err(".content: field required")
			}
			switch {
			case strIs(role, "assistant"):
				if !asstOpen || asstContent {
					closeAsst()
					openAsst()
				}
				// Written at the end, and moved before the tool calls
				// when the message has some.
				at := len(c.out)
				c.out = append(c.out, `,"content":"`...)
				if err := c.textParts(content, it, ".content"); err != nil {
					return err
				}
				c.out = append(c.out, '"')
				if asstCalls > 0 {
					c.moveBack(at, asstAt)
				}
				asstContent = true
			case strIs(role, "user"):
				closeAsst()
				return c.responsesUser(content, it)
			case strIs(role, "system"), strIs(role, "developer"):
				closeAsst()
				c.beginMsg("system")
				c.out = append(c.out, `,"content":"`...)
				if err := c.textParts(content, it, ".content"); err != nil {
					return err
				}
				c.out = append(c.out, `"}`...)
			default:
				return it.err(".role must be user, assistant, system or developer")
			}
		case strIs(typ, "function_call"):
			idRaw, ok1 := rawStr(callID)
			nameRaw, ok2 := rawStr(name)
			argsRaw, ok3 := rawStr(args)
			if !ok1 || !ok2 || !ok3 {
				return it.err(": a function_call needs string call_id, name and arguments")
			}
			if !asstOpen {
				openAsst() // no content, as vLLM writes it
			}
			if asstCalls == 0 {
				c.out = append(c.out, `,"tool_calls":[`...)
			} else {
				c.out = append(c.out, ',')
			}
			asstCalls++
			c.out = append(c.out, `{"id":"`...)
			c.out = append(c.out, idRaw...)
			c.out = append(c.out, `","type":"function","function":{"name":"`...)
			c.out = append(c.out, nameRaw...)
			c.out = append(c.out, `","arguments":"`...)
			c.out = append(c.out, argsRaw...)
			c.out = append(c.out, `"}}`...)
		case strIs(typ, "function_call_output"):
			closeAsst()
			idRaw, ok := rawStr(callID)
			if !ok {
				return it.err(": a function_call_output needs a string call_id")
			}
			c.beginMsg("tool")
			c.out = append(c.out, `,"tool_call_id":"`...)
			c.out = append(c.out, idRaw...)
			c.out = append(c.out, `","content":"`...)
			if output == nil || isNull(output) {
				return it.err(".output: field required")
			}
			if err := c.textParts(output, it, ".output"); err != nil {
				return err
			}
			c.out = append(c.out, `"}`...)
		case strIs(typ, "reasoning"):
			// Its text: the first content part's, else the first
			// summary part's, else "" (encrypted content gives none).
			text, ok := firstPartText(content)
			if !ok {
				text, _ = firstPartText(summary)
			}
			if asstOpen && asstReasoning || !asstOpen {
				closeAsst()
				openAsst()
			}
			at := len(c.out)
			c.out = append(c.out, `,"reasoning_content":"`...)
			c.out = append(c.out, text...)
			c.out = append(c.out, '"')
			if asstCalls > 0 {
				c.moveBack(at, asstAt)
			}
			asstReasoning = true
		case strIs(typ, "item_reference"):
			return it.err(": item_reference is not supported: this gateway does not store items")
		default:
			return it.err(": unsupported item type (supported: message, function_call, function_call_output, reasoning)")
		}
		return nil
	})
	if err != nil {
		return jsonErr(err)
	}
	closeAsst()
	return nil
}

// firstPartText returns the raw text of the first part of a reasoning
// item's content or summary v (the part's "text", "" when it has none, or
// the part when it is a string); ok is false when v has no part.
func firstPartText(v []byte) (text []byte, ok bool) {
	if len(v) == 0 || v[0] != '[' {
		return nil, false
	}
	elems(v, func(s, e int) error {
		if ok {
			return nil
		}
		ok = true
		p := v[s:e]
		if raw, isStr := rawStr(p); isStr {
			text = raw
		} else if p[0] == '{' {
			fields(p, func(k []byte, s, e int) error {
				if string(k) == "text" {
					text, _ = rawStr(p[s:e])
				}
				return nil
			})
		}
		return nil
	})
	return text, ok
}

// moveBack moves c.out[from:] to position to (to <= from), shifting what
// lies between after it, without allocating.
func (c *conv) moveBack(from, to int) {
	b := c.out[to:]
	n := len(c.out) - from
	slices.Reverse(b)
	slices.Reverse(b[:n])
	slices.Reverse(b[n:])
}

// textParts writes the text of a content value (a string or an array
// of input_text/output_text/refusal parts) into an open JSON string, the
// non-empty texts joined by "\n" as vLLM's chat_utils joins a content's
// parts for a template that takes a string; field names the value in
// errors (".content", ".output").
func (c *conv) textParts(v []byte, it item, field string) error {
	if raw, ok := rawStr(v); ok {
		c.out = append(c.out, raw...)
		return nil
	}
	if v[0] != '[' {
		return it.err(field + " must be a string or an array of parts")
	}
	n := 0
	err := elems(v, func(s, e int) error {
		p := v[s:e]
		if p[0] != '{' {
			return it.err(field + " must be an array of parts")
		}
		var typ, text []byte
		fields(p, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = p[s:e]
			case "text", "refusal":
				text = p[s:e]
			}
			return nil
		})
		if !strIs(typ, "input_text") && !strIs(typ, "output_text") && !strIs(typ, "refusal") {
			return it.err(": only text parts are supported here")
		}
		raw, ok := rawStr(text)
		if !ok {
			return it.err(": a text part needs a string text")
		}
		if len(raw) == 0 {
			return nil
		}
		if n > 0 {
			c.out = append(c.out, `\n`...)
		}
		n++
		c.out = append(c.out, raw...)
		return nil
	})
	return jsonErr2(err)
}

// responsesUser writes a user message: text parts joined as a string, or
// an array of parts when there are images.
func (c *conv) responsesUser(content []byte, it item) error {
	c.beginMsg("user")
	if raw, ok := rawStr(content); ok {
		c.out = append(c.out, `,"content":"`...)
		c.out = append(c.out, raw...)
		c.out = append(c.out, `"}`...)
		return nil
	}
	if content[0] != '[' {
		return it.err(".content must be a string or an array of parts")
	}
	images := false
	err := elems(content, func(s, e int) error {
		p := content[s:e]
		if p[0] != '{' {
			return it.err(".content must be an array of parts")
		}
		var typ []byte
		fields(p, func(k []byte, s, e int) error {
			if string(k) == "type" {
				typ = p[s:e]
			}
			return nil
		})
		switch {
		case strIs(typ, "input_text"), strIs(typ, "output_text"):
		case strIs(typ, "input_image"):
			images = true
		default:
			return it.err(": unsupported content part type (supported: input_text, input_image)")
		}
		return nil
	})
	if err != nil {
		return jsonErr(err)
	}
	if !images {
		c.out = append(c.out, `,"content":"`...)
		if err := c.textParts(content, it, ".content"); err != nil {
			return err
		}
		c.out = append(c.out, `"}`...)
		return nil
	}
	c.out = append(c.out, `,"content":[`...)
	n := 0
	err = elems(content, func(s, e int) error {
		p := content[s:e]
		var typ, text, url, detail []byte
		fields(p, func(k []byte, s, e int) error {
			switch string(k) {
			case "type":
				typ = p[s:e]
			case "text":
				text = p[s:e]
			case "image_url":
				url = p[s:e]
			case "detail":
				detail = p[s:e]
			}
			return nil
		})
		if strIs(typ, "input_image") {
			u, ok := rawStr(url)
			if !ok {
				return it.err(": input_image needs an image_url string (file_id is not supported)")
			}
			if n > 0 {
				c.out = append(c.out, ',')
			}
			n++
			c.out = append(c.out, `{"type":"image_url","image_url":{"url":"`...)
			c.out = append(c.out, u...)
			c.out = append(c.out, '"')
			if d, ok := rawStr(detail); ok {
				c.out = append(c.out, `,"detail":"`...)
				c.out = append(c.out, d...)
				c.out = append(c.out, '"')
			}
			c.out = append(c.out, "}}"...)
			return nil
		}
		raw, ok := rawStr(text)
		if !ok {
			return it.err(": a text part needs a string text")
		}
		c.textPart(&n, raw)
		return nil
	})
	if err != nil {
		return jsonErr(err)
	}
	c.out = append(c.out, "]}"...)
	return nil
}

// responsesTools writes function tools and tool_choice.
func (c *conv) responsesTools(tools, choice span) error {
	n := 0
	if tools.ok() && !isNull(c.v(tools)) {
		v := c.v(tools)
		if v[0] != '[' {
			return badRequest("tools", "tools must be an array")
		}
		c.m.setEcho(echoTools, v)
		mark := len(c.out)
		c.out = append(c.out, `,"tools":[`...)
		err := elems(v, func(s, e int) error {
			t := v[s:e]
			if t[0] != '{' {
				return badRequest("tools", pathErr("tools[%d] must be an object", n))
			}
			var typ, name, desc, params, strict []byte
			fields(t, func(k []byte, s, e int) error {
				switch string(k) {
				case "type":
					typ = t[s:e]
				case "name":
					name = t[s:e]
				case "description":
					desc = t[s:e]
				case "parameters":
					params = t[s:e]
				case "strict":
					strict = t[s:e]
				}
				return nil
			})
			if !strIs(typ, "function") {
				return badRequest("tools", pathErr("tools[%d]: only function tools are supported", n))
			}
			nameRaw, ok := rawStr(name)
			if !ok || len(nameRaw) == 0 {
				return badRequest("tools", pathErr("tools[%d].name: a non-empty string is required", n))
			}
			if n > 0 {
				c.out = append(c.out, ',')
			}
			n++
			c.out = append(c.out, `{"type":"function","function":{"name":"`...)
			c.out = append(c.out, nameRaw...)
			c.out = append(c.out, '"')
			if _, ok := rawStr(desc); ok {
				c.out = append(c.out, `,"description":`...)
				c.out = append(c.out, desc...)
			}
			if params != nil && params[0] != '{' && !isNull(params) {
				return badRequest("tools", pathErr("tools[%d].parameters: a JSON Schema object is required", n))
			}
			if params != nil && params[0] == '{' {
				c.out = append(c.out, `,"parameters":`...)
				c.out = append(c.out, params...)
			}
			if strict != nil && (strict[0] == 't' || strict[0] == 'f') {
				c.out = append(c.out, `,"strict":`...)
				c.out = append(c.out, strict...)
			}
			c.out = append(c.out, "}}"...)
			return nil
		})
		if err != nil {
			return jsonErr(err)
		}
		if n == 0 {
			c.out = c.out[:mark]
		} else {
			c.out = append(c.out, ']')
		}
	}
	if !choice.ok() || isNull(c.v(choice)) {
		return nil
	}
	v := c.v(choice)
	c.m.setEcho(echoToolChoice, v)
	if raw, ok := rawStr(v); ok {
		switch string(raw) {
		case "none", "auto", "required":
			if n > 0 {
				c.out = append(c.out, `,"tool_choice":`...)
				c.out = append(c.out, v...)
			}
			return nil
		}
		return badRequest("tool_choice", "tool_choice must be none, auto, required or a function choice")
	}
	if v[0] != '{' {
		return badRequest("tool_choice", "tool_choice must be a string or an object")
	}
	var typ, name []byte
	fields(v, func(k []byte, s, e int) error {
		switch string(k) {
		case "type":
			typ = v[s:e]
		case "name":
			name = v[s:e]
		}
		return nil
	})
	raw, ok := rawStr(name)
	if !strIs(typ, "function") || !ok {
		return badRequest("tool_choice", "tool_choice: only {\"type\":\"function\",\"name\":...} is supported")
	}
	if n > 0 {
		c.out = append(c.out, `,"tool_choice":{"type":"function","function":{"name":"`...)
		c.out = append(c.out, raw...)
		c.out = append(c.out, `"}}`...)
	}
	return nil
}

// responsesText writes text.format as response_format.
func (c *conv) responsesText(sp span) error {
	if !sp.ok() || isNull(c.v(sp)) {
		return nil
	}
	v := c.v(sp)
	if v[0] != '{' {
		return badRequest("text", "text must be an object")
	}
	c.m.setEchoObj(echoText, v, [2]string{"format", `{"type":"text"}`})
	var format []byte
	fields(v, func(k []byte, s, e int) error {
		if string(k) == "format" {
			format = v[s:e]
		}
		return nil
	})
	if format == nil || isNull(format) {
		return nil
	}
	if format[0] != '{' {
		return badRequest("text", "text.format must be an object")
	}
	var typ, name, schema, strict, desc []byte
	fields(format, func(k []byte, s, e int) error {
		switch string(k) {
		case "type":
			typ = format[s:e]
		case "name":
			name = format[s:e]
		case "schema":
			schema = format[s:e]
		case "strict":
			strict = format[s:e]
		case "description":
			desc = format[s:e]
		}
		return nil
	})
	switch {
	case strIs(typ, "text"):
	case strIs(typ, "json_object"):
		c.out = append(c.out, `,"response_format":{"type":"json_object"}`...)
	case strIs(typ, "json_schema"):
		nameRaw, ok := rawStr(name)
		if !ok || schema == nil || schema[0] != '{' {
			return badRequest("text", "text.format json_schema needs a name string and a schema object")
		}
		c.out = append(c.out, `,"response_format":{"type":"json_schema","json_schema":{"name":"`...)
		c.out = append(c.out, nameRaw...)
		c.out = append(c.out, `","schema":`...)
		c.out = append(c.out, schema...)
		if strict != nil && (strict[0] == 't' || strict[0] == 'f') {
			c.out = append(c.out, `,"strict":`...)
			c.out = append(c.out, strict...)
		}
		if _, ok := rawStr(desc); ok {
			c.out = append(c.out, `,"description":`...)
			c.out = append(c.out, desc...)
		}
		c.out = append(c.out, "}}"...)
	default:
		return badRequest("text", "text.format.type must be text, json_object or json_schema")
	}
	return nil
}
