package protocol

import (
	"sync"

	"github.com/infera/infera/internal/jsonscan"
)

// maxStreamTools bounds the tool calls of one streamed answer.
const maxStreamTools = 256

var errTooManyTools = &Error{Status: 502, Type: TypeServer, Message: "the engine streamed more than 256 tool calls"}

// block kinds of the client-side output (Anthropic content blocks,
// Responses output items).
type blockKind uint8

const (
	blockNone blockKind = iota
	blockText
	blockThinking
	blockTool
	blockRefusal // Responses: a message item with a refusal part
)

// streamTool is one tool call being streamed.
type streamTool struct {
	id, name, args []byte // raw string bodies
	opened         bool
	block          int // Anthropic block index / Responses output index
	itemID         []byte
	scan           argsScan   // whether the arguments sent so far are a whole JSON value
	prefix         jsonPrefix // Anthropic: how much of the arguments is a JSON object's prefix
}

// argsScan follows a tool call's arguments (the raw, JSON-escaped body of
// the arguments string, in fragments) far enough to tell when they form a
// whole JSON object or array: depth outside strings.
type argsScan struct {
	depth      int
	started    bool
	inStr, esc bool // inside a string of the arguments, after its backslash
	rawEsc     bool // after a backslash of the raw (escaped) form
	hexLeft    int  // hex digits left of a raw \uXXXX
}

func (a *argsScan) feed(raw []byte) {
	for _, b := range raw {
		switch {
		case a.hexLeft > 0:
			a.hexLeft--
			continue
		case a.rawEsc:
			a.rawEsc = false
			switch b {
			case '"', '\\':
			case 'u':
				a.hexLeft = 4
				b = 'x' // an escaped code point: an ordinary character here
			default:
				b = 'x' // \n, \t, ...
			}
		case b == '\\':
			a.rawEsc = true
			continue
		}
		if a.inStr {
			switch {
			case a.esc:
				a.esc = false
			case b == '\\':
				a.esc = true
			case b == '"':
				a.inStr = false
			}
			continue
		}
		switch b {
		case '"':
			a.inStr = true
		case '{', '[':
			a.depth++
			a.started = true
		case '}', ']':
			a.depth--
		}
	}
}

// complete reports whether the arguments seen form a whole object or array.
func (a *argsScan) complete() bool { return a.started && a.depth <= 0 && !a.inStr }

// outItem is a finished-or-open Responses output item.
type outItem struct {
	kind blockKind
	id   []byte
	s, e int // text span in acc (text, thinking)
	tool int // tool index (blockTool)
}

// StreamConverter turns an engine's chat completions SSE stream into the
// client protocol's SSE stream (Anthropic Messages or OpenAI Responses).
//
// Feed it the upstream bytes as they arrive, in any pieces (an event may
// be split across reads); each call appends the client bytes ready so far
// to dst. Finish ends the stream when the upstream body ended; Fail ends it
// with an error event when the upstream failed mid-stream. Acquire one per
// stream (AcquireStreamConverter) and release it when the response is done;
// it keeps its buffers across uses. Not safe for concurrent use.
type StreamConverter struct {
	m   *Meta
	sse sseReader
	err error // the first conversion error; the stream is over

	started, finished bool
	failStatus        int  // the HTTP status of the failure the stream ended with (fail)
	gotFinish         bool // a finish_reason arrived
	refused           bool // the engine sent a refusal (chat's delta.refusal)
	finish            []byte
	stopReason        []byte
	usage             Usage
	deltas            int64 // content deltas seen (output token fallback)

	cur      blockKind
	nBlocks  int // Anthropic block indexes / Responses output indexes used
	pingSent bool
	tools    []streamTool
	nTools   int
	// remap[i]-1 is the call the engine's tool-call index i now names (0:
	// the call at i): an engine that numbers every parallel call 0 (older
	// Ollama, some OpenAI-compatible servers) tells calls apart by id.
	remap []int32
	// liveTool+1 is the tool call streaming now (0: none). A call that
	// opens while another streams is held (its name and arguments kept)
	// and sent whole at the end: the Messages API allows one content
	// block at a time and a tool block is final once stopped, and engines
	// may interleave the fragments of parallel calls.
	liveTool int
	// heldText is text that arrived while the live tool call's arguments
	// were not yet whole (vLLM sends "\n" as content before the rest of
	// the arguments): a tool block is final once stopped, so the text
	// waits until the arguments are whole, another call opens, or the end.
	heldText    []byte
	heldRefusal []byte // a refusal that arrived while text was held
	// heldThinking is reasoning that arrived while text is held: a
	// thinking block would stop the tool block just as text would.
	heldThinking []byte
	failed       bool // the stream ended with an error event
	// Messages only: text, then a refusal, were sent (a refusal after text
	// is set apart by a newline, as in a whole answer).
	textSent, refusalSent bool

	// Responses only
	seq   int64
	items []outItem
	acc   []byte // accumulated raw text of text and reasoning items

	out []byte // dst while an event is processed
}

var streamPool = sync.Pool{New: func() any { return new(StreamConverter) }}

// AcquireStreamConverter returns a converter for a stream whose request
// was converted into m. m must stay valid until the converter is released.
func AcquireStreamConverter(m *Meta) *StreamConverter {
	c := streamPool.Get().(*StreamConverter)
	c.Reset(m)
	return c
}

// ReleaseStreamConverter returns c to the pool; c must not be used after.
func ReleaseStreamConverter(c *StreamConverter) {
	c.Reset(nil)
	streamPool.Put(c)
}

// Reset prepares c for a new stream of the request converted into m.
func (c *StreamConverter) Reset(m *Meta) {
	tools := c.tools[:cap(c.tools)]
	for i := range tools {
		t := &tools[i]
		*t = streamTool{id: t.id[:0], name: t.name[:0], args: reuse(t.args), itemID: t.itemID[:0]}
	}
	items := c.items[:cap(c.items)]
	for i := range items {
		items[i] = outItem{id: items[i].id[:0]}
	}
	c.sse.reset()
	*c = StreamConverter{
		m:            m,
		sse:          c.sse,
		finish:       c.finish[:0],
		stopReason:   c.stopReason[:0],
		tools:        c.tools[:0],
		remap:        c.remap[:0],
		items:        c.items[:0],
		acc:          reuse(c.acc),
		heldText:     reuse(c.heldText),
		heldRefusal:  reuse(c.heldRefusal),
		heldThinking: reuse(c.heldThinking),
	}
}

// maxKeptBuffer is the largest buffer a reset keeps: a stream with huge
// events or answers must not pin that memory in a pooled value.
const maxKeptBuffer = 256 << 10

// reuse empties b for reuse, or drops it when it grew past maxKeptBuffer.
func reuse(b []byte) []byte {
	if cap(b) > maxKeptBuffer {
		return nil
	}
	return b[:0]
}

// Usage returns the usage the engine reported so far.
func (c *StreamConverter) Usage() Usage { return c.usage }

// Done reports whether the client stream has ended (completed, failed, or
// stopped by a conversion error); later Feed calls append nothing.
func (c *StreamConverter) Done() bool { return c.finished }

// Feed consumes a piece of the upstream chat SSE stream and appends the
// client SSE bytes it yields to dst. The first call also writes the
// stream's opening events. A malformed engine stream ends the client stream
// with an error event (Err reports it).
func (c *StreamConverter) Feed(dst, src []byte) []byte {
	if c.finished {
		return dst
	}
	c.out = dst
	if !c.started {
		c.start()
	}
	if err := c.sse.feed(src, c); err != nil {
		c.failWith(err)
	}
	dst = c.out
	c.out = nil
	return dst
}

// Finish ends the stream after the upstream body ended (with or without
// "data: [DONE]"), appending the closing events. An upstream that ended
// before its answer finished (no finish_reason) ends the client stream with
// an error event. Calling Finish on a finished stream appends nothing.
func (c *StreamConverter) Finish(dst []byte) []byte {
	if c.finished {
		return dst
	}
	c.out = dst
	if !c.started {
		c.start()
	}
	if err := c.sse.flush(c); err != nil {
		c.failWith(err)
	}
	if !c.finished {
		if c.gotFinish {
			c.end()
		} else {
			c.fail(502, TypeServer, "the engine's stream ended before the answer was complete")
		}
	}
	dst = c.out
	c.out = nil
	return dst
}

// FeedAnswer writes a whole chat completion (an engine that answered the
// stream request with one JSON body) as the client's complete stream:
// its reasoning, text, refusal and tool calls as the events a stream of
// them would give, then the closing events. It appends nothing and
// returns false when body is not a readable chat completion (the caller
// answers with an error instead).
func (c *StreamConverter) FeedAnswer(dst, body []byte) ([]byte, bool) {
	if c.finished || c.started {
		return dst, false
	}
	r, err := parseChat(body)
	if err != nil {
		return dst, false
	}
	c.out = dst
	c.start()
	c.usage = r.usage
	if len(r.reasoning) > 0 {
		c.deltas++
		c.emitThinking(r.reasoning)
	}
	if len(r.content) > 0 {
		c.deltas++
		c.emitText(r.content)
	}
	if len(r.refusal) > 0 {
		c.deltas++
		c.refused = true
		c.emitRefusal(r.refusal)
	}
	idx := int64(0)
	r.eachToolCall(func(tc toolCall) {
		if err != nil {
			return
		}
		args := tc.args
		if tc.argsObj { // an object, not a string: sent as the string it encodes
			args = jsonscan.AppendStringBody(nil, bytesString(tc.args))
		}
		err = c.onToolCall(idx, tc.id, tc.name, args)
		idx++
	})
	if err != nil {
		c.failWith(err)
	} else {
		// A whole answer is complete, as ChatToAnthropic and
		// ChatToResponses take it, whatever its finish_reason.
		c.gotFinish = true
		c.finish = append(c.finish[:0], r.finish...)
		c.stopReason = append(c.stopReason[:0], r.stopReason...)
		c.end()
	}
	dst = c.out
	c.out = nil
	return dst, true
}

// Fail ends the stream with an error event in the client protocol (for an
// upstream that failed or timed out after the first byte). status and typ
// (an OpenAI error type) classify it; msg is the client-facing message.
func (c *StreamConverter) Fail(dst []byte, status int, typ, msg string) []byte {
	if c.finished {
		return dst
	}
	c.out = dst
	c.fail(status, typ, msg)
	dst = c.out
	c.out = nil
	return dst
}

// Finished reports whether the converted stream is complete (its closing
// events were produced, or its error event).
func (c *StreamConverter) Finished() bool { return c.finished }

// Failed reports whether the stream ended with an error event (the
// engine's error chunk, a malformed chunk, a failure passed to Fail).
func (c *StreamConverter) Failed() bool { return c.failed }

// Err returns the conversion error that ended the stream, if any.
func (c *StreamConverter) Err() error { return c.err }

// FailStatus is the HTTP status of the failure a Failed stream ended with:
// an engine's error chunk's code (400-599), else 502.
func (c *StreamConverter) FailStatus() int { return c.failStatus }

// EngineErrorStatus is the HTTP status an engine's error event stands for:
// the "code" (400-599) of data's "error" object (vLLM's and SGLang's
// {"error":{...,"code":400}}) or of data itself when it is the error
// (older vLLM's {"object":"error",...,"code":400}); 0 when data holds none.
func EngineErrorStatus(data []byte) int {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return 0
	}
	var errObj []byte
	flatErr := false
	end, err := walkObject(data, i, 0, func(k []byte, s, e int) error {
		switch string(k) {
		case "error":
			if !isNull(data[s:e]) {
				errObj = data[s:e]
			}
		case "object":
			flatErr = strIs(data[s:e], "error")
		}
		return nil
	})
	if err != nil {
		return 0
	}
	if flatErr {
		errObj = data[i:end]
	}
	return engineErrorCode(errObj)
}

func (c *StreamConverter) failWith(err error) {
	c.err = err
	if e, ok := err.(*Error); ok {
		c.fail(e.Status, e.Type, e.Message)
		return
	}
	c.fail(502, TypeServer, "the engine sent a malformed stream")
}

// onComment passes an engine's keep-alive (an SSE comment line) on as a
// comment of the client's stream, so a converted stream is no quieter than
// the engine's: a client or proxy that drops an idle stream keeps it as it
// would keep the engine's. The output is always between whole events here.
func (c *StreamConverter) onComment() {
	if !c.finished {
		c.out = append(c.out, ":\n\n"...)
	}
}

// onData handles one upstream event's data.
func (c *StreamConverter) onData(data []byte) error {
	if c.finished {
		return nil
	}
	if string(data) == "[DONE]" {
		if c.gotFinish {
			c.end()
			return nil
		}
		c.fail(502, TypeServer, "the engine's stream ended before the answer was complete")
		return nil
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return errBadChunk
	}
	var choices, errObj []byte
	flatErr := false
	end, err := walkObject(data, i, 0, func(k []byte, s, e int) error {
		switch string(k) {
		case "choices":
			choices = data[s:e]
		case "usage":
			if data[s] == '{' {
				c.usage.read(data[s:e])
			}
		case "error":
			if !isNull(data[s:e]) {
				errObj = data[s:e]
			}
		case "object":
			flatErr = strIs(data[s:e], "error")
		}
		return nil
	})
	if err != nil || skipSpace(data, end) != len(data) {
		return errBadChunk
	}
	if errObj != nil || flatErr {
		// The engine reported an error inside the stream: its code (vLLM's
		// and SGLang's error chunks carry the HTTP status it stands for)
		// classifies it, as the status of an error answer does.
		status, typ := 502, TypeServer
		if n := EngineErrorStatus(data); n != 0 {
			status, typ = n, ""
		}
		c.fail(status, typ, engineErrorMessage(data))
		return nil
	}
	if choices == nil || choices[0] != '[' {
		return nil
	}
	first := true
	return elems(choices, func(s, e int) error {
		ch := choices[s:e]
		if !first || ch[0] != '{' {
			return nil
		}
		first = false
		return c.onChoice(ch)
	})
}

var errBadChunk = &Error{Status: 502, Type: TypeServer, Message: "the engine sent a malformed stream chunk"}

// engineErrorCode is the "code" of an engine's error object when it is an
// HTTP error status (400-599), else 0.
func engineErrorCode(obj []byte) int {
	code := 0
	if len(obj) == 0 || obj[0] != '{' {
		return 0
	}
	fields(obj, func(k []byte, s, e int) error {
		if string(k) == "code" {
			if n, ok := intVal(obj[s:e]); ok && n >= 400 && n <= 599 {
				code = int(n)
			} else {
				code = 0
			}
		}
		return nil
	})
	return code
}

// engineErrorMessage extracts the message of an error chunk (the engine's
// words, re-encoded), or a generic one.
func engineErrorMessage(data []byte) string {
	var b [512]byte
	out := ConvertError(b[:0], Chat, 502, data)
	var msg []byte
	fields(out, func(k []byte, s, e int) error {
		if string(k) == "error" {
			inner := out[s:e]
			fields(inner, func(k []byte, s, e int) error {
				if string(k) == "message" {
					msg = decodeStr(nil, inner[s:e])
				}
				return nil
			})
		}
		return nil
	})
	if msg == nil {
		return "the engine reported an error"
	}
	return "the engine reported an error: " + string(msg)
}

func (c *StreamConverter) onChoice(ch []byte) error {
	var delta, finish, stop []byte
	fields(ch, func(k []byte, s, e int) error {
		switch string(k) {
		case "delta":
			delta = ch[s:e]
		case "finish_reason":
			finish = ch[s:e]
		case "stop_reason", "matched_stop": // vLLM's, SGLang's (a string when a stop string matched)
			if _, ok := rawStr(ch[s:e]); ok {
				stop = ch[s:e]
			}
		}
		return nil
	})
	if delta != nil && delta[0] == '{' {
		var content, reasoning, calls, refusal, fcall []byte
		fields(delta, func(k []byte, s, e int) error {
			v := delta[s:e]
			switch string(k) {
			case "content":
				content, _ = rawStr(v)
			case "refusal":
				refusal, _ = rawStr(v)
			case "reasoning_content", "reasoning":
				if raw, ok := rawStr(v); ok && len(raw) > 0 {
					reasoning = raw
				}
			case "tool_calls":
				if v[0] == '[' {
					calls = v
				}
			case "function_call": // the deprecated single call, as an old engine streams it
				if v[0] == '{' {
					fcall = v
				}
			}
			return nil
		})
		if len(reasoning) > 0 {
			c.deltas++
			if c.holdingText() {
				c.heldThinking = append(c.heldThinking, reasoning...)
			} else {
				c.emitThinking(reasoning)
			}
		}
		if len(content) > 0 {
			c.deltas++
			if c.holdingText() {
				c.heldText = append(c.heldText, content...)
			} else {
				c.emitText(content)
			}
		}
		if len(refusal) > 0 {
			c.deltas++
			c.refused = true
			if c.holdingText() {
				c.heldRefusal = append(c.heldRefusal, refusal...)
			} else {
				c.emitRefusal(refusal)
			}
		}
		if calls != nil {
			if err := c.onToolCalls(calls); err != nil {
				return err
			}
		} else if fcall != nil {
			name, args := functionFields(fcall)
			if err := c.onToolCall(0, nil, name, args); err != nil {
				return err
			}
		}
	}
	if raw, ok := rawStr(finish); ok {
		c.gotFinish = true
		c.finish = append(c.finish[:0], raw...)
	}
	if raw, ok := rawStr(stop); ok {
		c.stopReason = append(c.stopReason[:0], raw...)
	}
	return nil
}

func (c *StreamConverter) onToolCalls(calls []byte) error {
	return elems(calls, func(s, e int) error {
		tc := calls[s:e]
		if tc[0] != '{' {
			return nil
		}
		idx := int64(-1)
		var id, name, args []byte
		fields(tc, func(k []byte, s, e int) error {
			v := tc[s:e]
			switch string(k) {
			case "index":
				if n, ok := intVal(v); ok {
					idx = n
				}
			case "id":
				id, _ = rawStr(v)
			case "function":
				name, args = functionFields(v)
			}
			return nil
		})
		return c.onToolCall(idx, id, name, args)
	})
}

// functionFields returns the raw name and arguments strings of a chat
// function object ({"name":..,"arguments":..}), nil when absent.
func functionFields(v []byte) (name, args []byte) {
	if len(v) == 0 || v[0] != '{' {
		return nil, nil
	}
	fields(v, func(k []byte, s, e int) error {
		switch string(k) {
		case "name":
			name, _ = rawStr(v[s:e])
		case "arguments":
			args, _ = rawStr(v[s:e])
		}
		return nil
	})
	return name, args
}

// onToolCall takes one fragment of a tool call: idx is the engine's index
// (-1 when it gives none).
func (c *StreamConverter) onToolCall(idx int64, id, name, args []byte) error {
	if idx < 0 { // engines that omit the index stream one call at a time
		idx = int64(c.nTools) - 1
		if len(id) > 0 && (idx < 0 || string(id) != string(c.tools[idx].id)) || idx < 0 {
			idx++ // a new id opens a new call; a repeated or empty one continues
		}
	} else {
		if idx >= maxStreamTools {
			return errTooManyTools
		}
		eng := idx
		if int(eng) < len(c.remap) && c.remap[eng] > 0 {
			idx = int64(c.remap[eng] - 1)
		}
		if len(id) > 0 && int(idx) < c.nTools && len(c.tools[idx].id) > 0 && string(id) != string(c.tools[idx].id) {
			// Another id at an index in use: a call of its own, and
			// the index's later fragments continue it.
			idx = int64(c.nTools)
			for int(eng) >= len(c.remap) {
				c.remap = append(c.remap, 0)
			}
			c.remap[eng] = int32(idx) + 1
		}
	}
	if idx >= maxStreamTools {
		return errTooManyTools
	}
	for int(idx) >= len(c.tools) {
		if len(c.tools) < cap(c.tools) {
			c.tools = c.tools[:len(c.tools)+1]
		} else {
			c.tools = append(c.tools, streamTool{})
		}
	}
	if int(idx) >= c.nTools {
		c.nTools = int(idx) + 1
	}
	t := &c.tools[idx]
	if len(id) > 0 && len(t.id) == 0 {
		t.id = append(t.id, id...)
	}
	if !t.opened {
		if len(t.name) == 0 { // a name repeated in every fragment is the name, as for the live call
			t.name = append(t.name, name...)
		}
		t.args = append(t.args, args...)
		if len(t.name) > 0 && (c.liveTool == 0 || c.liveTool == int(idx)+1) {
			c.liveTool = int(idx) + 1
			c.openTool(int(idx))
		}
		return nil
	}
	if len(args) > 0 {
		if c.cur != blockTool || c.liveTool != int(idx)+1 {
			// Its block was stopped (text followed its whole arguments),
			// and a stopped block is final for the client, which may have
			// run the call: what follows whole arguments is whitespace
			// (vLLM's end-of-stream flush), or junk that would spoil them.
			return nil
		}
		c.deltas++
		c.emitToolArgs(int(idx), args)
		t.scan.feed(args)
		if len(c.heldThinking)+len(c.heldText)+len(c.heldRefusal) > 0 && t.scan.complete() {
			c.flushText()
		}
	}
	return nil
}

// holdingText reports whether text must wait: the live tool call's block
// is open and its arguments are not whole yet.
func (c *StreamConverter) holdingText() bool {
	if c.cur != blockTool || c.liveTool == 0 {
		return false
	}
	t := &c.tools[c.liveTool-1]
	return t.opened && !t.scan.complete()
}

// flushText sends the held reasoning, text, then refusal (closing the tool
// block).
func (c *StreamConverter) flushText() {
	if len(c.heldThinking) > 0 {
		c.emitThinking(c.heldThinking)
		c.heldThinking = c.heldThinking[:0]
	}
	if len(c.heldText) > 0 {
		c.emitText(c.heldText)
		c.heldText = c.heldText[:0]
	}
	if len(c.heldRefusal) > 0 {
		c.emitRefusal(c.heldRefusal)
		c.heldRefusal = c.heldRefusal[:0]
	}
}

// emitRefusal sends a refusal: Messages has no refusal block, so it is
// text there (and stop_reason refusal); Responses has refusal parts.
func (c *StreamConverter) emitRefusal(raw []byte) {
	if c.m.API == Responses {
		c.rRefusal(raw)
		return
	}
	if c.textSent && !c.refusalSent {
		c.aText(escapedNewline) // as a whole answer joins them (chat_response.go)
	}
	c.refusalSent = true
	c.aText(raw)
}

// escapedNewline is "\n" inside a JSON string.
var escapedNewline = []byte(`\n`)

// ---- dispatch to the protocol emitters ----

func (c *StreamConverter) start() {
	c.started = true
	if c.m.API == Responses {
		c.rStart()
	} else {
		c.aStart()
	}
}

func (c *StreamConverter) emitText(raw []byte) {
	if c.m.API == Responses {
		c.rText(raw)
	} else {
		c.textSent = c.textSent || len(raw) > 0
		c.aText(raw)
	}
}

func (c *StreamConverter) emitThinking(raw []byte) {
	if c.m.API == Responses {
		c.rThinking(raw)
	} else {
		c.aThinking(raw)
	}
}

func (c *StreamConverter) openTool(i int) {
	t := &c.tools[i]
	t.opened = true
	if len(t.id) == 0 {
		t.id = appendID(t.id, "call_")
	}
	if c.m.API == Responses {
		c.rOpenTool(i)
	} else {
		c.aOpenTool(i)
	}
	if len(t.args) > 0 { // arguments that came before the name
		c.emitToolArgsBuffered(i)
		t.scan.feed(t.args)
	}
}

func (c *StreamConverter) emitToolArgs(i int, raw []byte) {
	if c.m.API == Responses {
		t := &c.tools[i]
		t.args = append(t.args, raw...)
		c.rToolArgs(i, raw)
	} else {
		c.aToolArgs(i, raw)
	}
}

// emitToolArgsBuffered emits the arguments already held in the tool.
func (c *StreamConverter) emitToolArgsBuffered(i int) {
	if c.m.API == Responses {
		c.rToolArgs(i, c.tools[i].args)
	} else {
		c.aToolArgs(i, c.tools[i].args)
	}
}

func (c *StreamConverter) end() {
	c.flushText()
	for i := 0; i < c.nTools; i++ { // the calls held while another streamed
		if t := &c.tools[i]; !t.opened && len(t.name) > 0 {
			c.openTool(i)
		}
	}
	c.finished = true
	if c.m.API == Responses {
		c.rEnd()
	} else {
		c.aEnd()
	}
}

func (c *StreamConverter) fail(status int, typ, msg string) {
	c.finished, c.failed = true, true
	c.failStatus = status
	if c.m.API == Responses {
		c.rError(status, typ, msg)
	} else {
		c.aError(status, msg)
	}
}

// outputTokens is the engine's count, or the number of deltas when the
// engine reported no usage.
func (c *StreamConverter) outputTokens() int64 {
	if c.usage.Seen {
		return c.usage.CompletionTokens
	}
	return c.deltas
}

// event starts an SSE event with the given name.
func (c *StreamConverter) event(name string) {
	c.out = append(c.out, "event: "...)
	c.out = append(c.out, name...)
	c.out = append(c.out, "\ndata: "...)
}

func (c *StreamConverter) endEvent() { c.out = append(c.out, "\n\n"...) }
