package protocol

// Anthropic Messages streaming, as documented ("Streaming Messages") and
// parsed by @anthropic-ai/sdk's MessageStream: every event has an event:
// line naming its type, and data whose "type" repeats it.
//
//	message_start                 (message with empty content, usage)
//	content_block_start index=0   (text, thinking or tool_use)
//	ping
//	content_block_delta index=0   (text_delta, thinking_delta, input_json_delta) ...
//	content_block_stop  index=0
//	... more blocks, indexes 1, 2, ...
//	message_delta                 (stop_reason, stop_sequence, cumulative usage)
//	message_stop

func (c *StreamConverter) aStart() {
	m := c.m
	c.event("message_start")
	c.out = append(c.out, `{"type":"message_start","message":{"id":"`...)
	c.out = append(c.out, m.ID...)
	c.out = append(c.out, `","type":"message","role":"assistant","model":`...)
	c.out = appendBytesStr(c.out, m.Model)
	c.out = append(c.out, `,"content":[],"stop_reason":null,"stop_sequence":null`+anthropicMessageNulls+`,"usage":`...)
	c.out = appendAnthropicUsage(c.out, &Usage{PromptTokens: int64(m.PromptTokens)}, true)
	c.out = append(c.out, "}}"...)
	c.endEvent()
}

// aOpen closes the open block and starts a new one; the caller writes the
// content_block object and calls aOpened.
func (c *StreamConverter) aOpen() int {
	c.aClose()
	idx := c.nBlocks
	c.nBlocks++
	c.event("content_block_start")
	c.out = append(c.out, `{"type":"content_block_start","index":`...)
	c.out = appendInt(c.out, int64(idx))
	c.out = append(c.out, `,"content_block":`...)
	return idx
}

func (c *StreamConverter) aOpened() {
	c.out = append(c.out, '}')
	c.endEvent()
	if !c.pingSent {
		c.pingSent = true
		c.event("ping")
		c.out = append(c.out, `{"type":"ping"}`...)
		c.endEvent()
	}
}

func (c *StreamConverter) aClose() {
	if c.cur == blockNone {
		return
	}
	c.event("content_block_stop")
	c.out = append(c.out, `{"type":"content_block_stop","index":`...)
	c.out = appendInt(c.out, int64(c.nBlocks-1))
	c.out = append(c.out, '}')
	c.endEvent()
	c.cur = blockNone
}

func (c *StreamConverter) aDelta(idx int) {
	c.event("content_block_delta")
	c.out = append(c.out, `{"type":"content_block_delta","index":`...)
	c.out = appendInt(c.out, int64(idx))
	c.out = append(c.out, `,"delta":{"type":"`...)
}

func (c *StreamConverter) aText(raw []byte) {
	if c.cur != blockText {
		c.aOpen()
		c.out = append(c.out, `{"type":"text","text":"","citations":null}`...)
		c.aOpened()
		c.cur = blockText
	}
	c.aDelta(c.nBlocks - 1)
	c.out = append(c.out, `text_delta","text":"`...)
	c.out = append(c.out, raw...)
	c.out = append(c.out, `"}}`...)
	c.endEvent()
}

func (c *StreamConverter) aThinking(raw []byte) {
	if c.cur != blockThinking {
		c.aOpen()
		c.out = append(c.out, `{"type":"thinking","thinking":"","signature":""}`...)
		c.aOpened()
		c.cur = blockThinking
	}
	c.aDelta(c.nBlocks - 1)
	c.out = append(c.out, `thinking_delta","thinking":"`...)
	c.out = append(c.out, raw...)
	c.out = append(c.out, `"}}`...)
	c.endEvent()
}

func (c *StreamConverter) aOpenTool(i int) {
	t := &c.tools[i]
	t.block = c.aOpen()
	c.out = append(c.out, `{"type":"tool_use","id":"`...)
	c.out = append(c.out, t.id...)
	c.out = append(c.out, `","name":"`...)
	c.out = append(c.out, t.name...)
	c.out = append(c.out, `","input":{},"caller":{"type":"direct"}}`...)
	c.aOpened()
	c.cur = blockTool
}

// aToolArgs emits an arguments fragment as input_json_delta, for the open
// tool block (a call that opened while another streamed is held and sent
// whole at the end: onToolCalls). Only what keeps the arguments a JSON
// object's prefix is sent (jsonPrefix): the SDKs parse partial_json as it
// streams and throw on anything else, losing the stream; arguments that
// are not JSON are {} in a whole answer too.
func (c *StreamConverter) aToolArgs(i int, raw []byte) {
	t := &c.tools[i]
	if raw = raw[:t.prefix.feed(raw)]; len(raw) == 0 {
		return
	}
	c.aDelta(t.block)
	c.out = append(c.out, `input_json_delta","partial_json":"`...)
	c.out = append(c.out, raw...)
	c.out = append(c.out, `"}}`...)
	c.endEvent()
}

func (c *StreamConverter) aEnd() {
	c.aClose()
	reason, seq := anthropicStop(c.finish, c.stopReason, c.nTools > 0, c.m)
	if c.refused && reason == "end_turn" {
		reason = "refusal"
	}
	c.event("message_delta")
	c.out = append(c.out, `{"type":"message_delta","delta":{"stop_reason":"`...)
	c.out = append(c.out, reason...)
	c.out = append(c.out, `","stop_sequence":`...)
	if seq != nil {
		c.out = append(c.out, '"')
		c.out = append(c.out, seq...)
		c.out = append(c.out, '"')
	} else {
		c.out = append(c.out, "null"...)
	}
	// The SDKs type these as required and nullable in the delta too, and
	// @anthropic-ai/sdk's finalMessage copies stop_details from it.
	c.out = append(c.out, `,"stop_details":`...)
	if reason == "refusal" {
		c.out = append(c.out, anthropicRefusalDetails...)
	} else {
		c.out = append(c.out, "null"...)
	}
	c.out = append(c.out, `,"container":null},"usage":`...)
	u := c.usage
	if !u.Seen {
		u.PromptTokens = int64(c.m.PromptTokens)
		u.CompletionTokens = c.outputTokens()
	}
	c.out = appendAnthropicUsage(c.out, &u, false)
	c.out = append(c.out, '}')
	c.endEvent()
	c.event("message_stop")
	c.out = append(c.out, `{"type":"message_stop"}`...)
	c.endEvent()
}

// aError emits Anthropic's error event:
// event: error / data: {"type":"error","error":{"type":...,"message":...}}.
func (c *StreamConverter) aError(status int, msg string) {
	c.event("error")
	c.out = AppendError(c.out, Anthropic, status, "", "", msg)
	c.endEvent()
}
