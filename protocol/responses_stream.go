package protocol

// OpenAI Responses streaming, as documented (API reference, "Streaming
// events") and typed by the openai SDK (ResponseStreamEvent): every event
// has an event: line naming its type and data whose "type" repeats it,
// with a sequence_number counting from 0.
//
//	response.created, response.in_progress      (Response, status in_progress)
//	per output item, output_index 0, 1, ...:
//	  response.output_item.added                (item, status in_progress)
//	  message:   response.content_part.added (output_text)
//	             response.output_text.delta ...
//	             response.output_text.done, response.content_part.done
//	  reasoning: response.content_part.added (reasoning_text)
//	             response.reasoning_text.delta ...
//	             response.reasoning_text.done, response.content_part.done
//	  function_call: response.function_call_arguments.delta ...
//	             response.function_call_arguments.done
//	  response.output_item.done                 (item, status completed)
//	response.completed (or response.incomplete)  (Response with output, usage)

// rEvent starts an event: type and sequence number written, the caller
// continues with ",..." and closes with rEnd1.
func (c *StreamConverter) rEvent(name string) {
	c.event(name)
	c.out = append(c.out, `{"type":"`...)
	c.out = append(c.out, name...)
	c.out = append(c.out, `","sequence_number":`...)
	c.out = appendInt(c.out, c.seq)
	c.seq++
}

func (c *StreamConverter) rDone() {
	c.out = append(c.out, '}')
	c.endEvent()
}

func (c *StreamConverter) rStart() {
	for _, name := range [...]string{"response.created", "response.in_progress"} {
		c.rEvent(name)
		c.out = append(c.out, `,"response":`...)
		c.out = appendResponseHead(c.out, c.m, "in_progress", "")
		c.out = append(c.out, `,"output":[]`...)
		c.out = appendResponseTail(c.out, c.m, nil, false)
		c.rDone()
	}
}

// rItemRef writes ,"item_id":"...","output_index":N for item k.
func (c *StreamConverter) rItemRef(k int) {
	it := &c.items[k]
	c.out = append(c.out, `,"item_id":"`...)
	c.out = append(c.out, it.id...)
	c.out = append(c.out, `","output_index":`...)
	c.out = appendInt(c.out, int64(k))
}

// rOpen closes the open item and adds one of kind; it returns its index.
func (c *StreamConverter) rOpen(kind blockKind, prefix string) int {
	c.rClose()
	k := len(c.items)
	if k < cap(c.items) {
		c.items = c.items[:k+1]
	} else {
		c.items = append(c.items, outItem{})
	}
	it := &c.items[k]
	it.kind = kind
	it.id = appendID(it.id[:0], prefix)
	it.s, it.e = len(c.acc), len(c.acc)
	c.cur = kind
	c.nBlocks = k + 1
	return k
}

// rItem appends the JSON of item k with the given status (in_progress:
// without its content yet).
func (c *StreamConverter) rItem(k int, status string) {
	it := &c.items[k]
	whole := status != "in_progress"
	switch it.kind {
	case blockText:
		var text []byte
		if whole {
			text = c.acc[it.s:it.e]
		}
		c.out = appendMessageItem(c.out, it.id, text, status)
	case blockRefusal:
		var text []byte
		if whole {
			text = c.acc[it.s:it.e]
		}
		c.out = appendRefusalItem(c.out, it.id, text, status)
	case blockThinking:
		var text []byte
		if whole {
			text = c.acc[it.s:it.e]
		}
		c.out = appendReasoningItem(c.out, it.id, text, status)
	case blockTool:
		t := &c.tools[it.tool]
		var args []byte
		if whole {
			args = t.args
		}
		c.out = appendFunctionCallItem(c.out, it.id, t.id, t.name, args, false, status)
	}
}

func (c *StreamConverter) rItemAdded(k int) {
	c.rEvent("response.output_item.added")
	c.out = append(c.out, `,"output_index":`...)
	c.out = appendInt(c.out, int64(k))
	c.out = append(c.out, `,"item":`...)
	c.rItem(k, "in_progress")
	c.rDone()
}

func (c *StreamConverter) rPart(name string, k int, done bool) {
	c.rEvent(name)
	c.rItemRef(k)
	c.out = append(c.out, `,"content_index":0,"part":`...)
	it := &c.items[k]
	var text []byte
	if done {
		text = c.acc[it.s:it.e]
	}
	switch it.kind {
	case blockText:
		c.out = appendOutputText(c.out, text)
	case blockRefusal:
		c.out = appendRefusalPart(c.out, text)
	default:
		c.out = append(c.out, `{"type":"reasoning_text","text":"`...)
		c.out = append(c.out, text...)
		c.out = append(c.out, `"}`...)
	}
	c.rDone()
}

func (c *StreamConverter) rText(raw []byte) {
	c.rDelta(blockText, "msg_", "response.output_text.delta", raw, `","logprobs":[]`)
}

// rRefusal streams a refusal (chat's delta.refusal): a message item with
// a refusal part, response.refusal.delta events.
func (c *StreamConverter) rRefusal(raw []byte) {
	c.rDelta(blockRefusal, "msg_", "response.refusal.delta", raw, `"`)
}

func (c *StreamConverter) rThinking(raw []byte) {
	c.rDelta(blockThinking, "rs_", "response.reasoning_text.delta", raw, `"`)
}

// rDelta appends raw to the open item of kind (opening one, with its
// part, when another kind is open) and emits its delta event; tail closes
// the delta string and adds the event's other fields.
func (c *StreamConverter) rDelta(kind blockKind, prefix, event string, raw []byte, tail string) {
	if c.cur != kind {
		k := c.rOpen(kind, prefix)
		c.rItemAdded(k)
		c.rPart("response.content_part.added", k, false)
	}
	k := len(c.items) - 1
	c.acc = append(c.acc, raw...)
	c.items[k].e = len(c.acc)
	c.rEvent(event)
	c.rItemRef(k)
	c.out = append(c.out, `,"content_index":0,"delta":"`...)
	c.out = append(c.out, raw...)
	c.out = append(c.out, tail...)
	c.rDone()
}

func (c *StreamConverter) rOpenTool(i int) {
	k := c.rOpen(blockTool, "fc_")
	c.items[k].tool = i
	c.tools[i].block = k
	c.rItemAdded(k)
}

// rToolArgs emits an arguments fragment (already accumulated in the tool)
// for the open item (see onToolCalls for calls that interleave).
func (c *StreamConverter) rToolArgs(i int, raw []byte) {
	c.rEvent("response.function_call_arguments.delta")
	c.rItemRef(c.tools[i].block)
	c.out = append(c.out, `,"delta":"`...)
	c.out = append(c.out, raw...)
	c.out = append(c.out, '"')
	c.rDone()
}

// rClose finishes the open item with its done events.
func (c *StreamConverter) rClose() { c.rCloseAs("completed") }

// rCloseAs finishes the open item with its done events, the item with the
// given status: incomplete for the one the output limit cut.
func (c *StreamConverter) rCloseAs(status string) {
	if c.cur == blockNone {
		return
	}
	k := len(c.items) - 1
	it := &c.items[k]
	switch it.kind {
	case blockText, blockThinking, blockRefusal:
		name, field := "response.output_text.done", `,"content_index":0,"text":"`
		switch it.kind {
		case blockThinking:
			name = "response.reasoning_text.done"
		case blockRefusal:
			name, field = "response.refusal.done", `,"content_index":0,"refusal":"`
		}
		c.rEvent(name)
		c.rItemRef(k)
		c.out = append(c.out, field...)
		c.out = append(c.out, c.acc[it.s:it.e]...)
		c.out = append(c.out, '"')
		if it.kind == blockText {
			c.out = append(c.out, `,"logprobs":[]`...)
		}
		c.rDone()
		c.rPart("response.content_part.done", k, true)
	case blockTool:
		t := &c.tools[it.tool]
		if blankArgs(t.args) {
			// A call without arguments: "{}", as OpenAI streams it (the
			// SDKs JSON.parse a finished call's arguments).
			c.emitToolArgs(it.tool, emptyArgs)
		}
		c.rEvent("response.function_call_arguments.done")
		c.rItemRef(k)
		c.out = append(c.out, `,"name":"`...)
		c.out = append(c.out, t.name...)
		c.out = append(c.out, `","arguments":"`...)
		c.out = append(c.out, t.args...)
		c.out = append(c.out, '"')
		c.rDone()
	}
	c.rEvent("response.output_item.done")
	c.out = append(c.out, `,"output_index":`...)
	c.out = appendInt(c.out, int64(k))
	c.out = append(c.out, `,"item":`...)
	c.rItem(k, status)
	c.rDone()
	c.cur = blockNone
}

func (c *StreamConverter) rEnd() {
	status, reason := responseStatus(c.finish)
	c.rCloseAs(status) // the item being written when the limit cut is incomplete
	name := "response.completed"
	if status == "incomplete" {
		name = "response.incomplete"
	}
	c.rEvent(name)
	c.out = append(c.out, `,"response":`...)
	c.out = appendResponseHead(c.out, c.m, status, reason)
	c.out = append(c.out, `,"output":[`...)
	for k := range c.items {
		if k > 0 {
			c.out = append(c.out, ',')
		}
		c.rItem(k, itemStatus(status, k == len(c.items)-1))
	}
	c.out = append(c.out, ']')
	u := c.usage
	if !u.Seen { // the router's estimates, as the Messages stream reports them
		u.PromptTokens = int64(c.m.PromptTokens)
		u.CompletionTokens = c.outputTokens()
	}
	c.out = appendResponseTail(c.out, c.m, &u, true)
	c.rDone()
}

// rError emits the Responses error event:
// event: error / data: {"type":"error","sequence_number":N,"code":...,"message":...,"param":null}.
func (c *StreamConverter) rError(status int, typ, msg string) {
	c.rEvent("error")
	c.out = append(c.out, `,"code":`...)
	if typ == "" {
		typ = openAIErrorType(status)
	}
	c.out = appendStr(c.out, typ)
	c.out = append(c.out, `,"message":`...)
	c.out = appendStr(c.out, msg)
	c.out = append(c.out, `,"param":null`...)
	c.rDone()
}
