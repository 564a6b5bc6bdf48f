package protocol

// Usage is the token usage an engine reported.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64 // prompt_tokens_details.cached_tokens
	ReasoningTokens  int64 // completion_tokens_details.reasoning_tokens
	Seen             bool  // a usage object was read
}

// readUsage reads a chat usage object.
func (u *Usage) read(v []byte) {
	if len(v) == 0 || v[0] != '{' {
		return
	}
	u.Seen = true
	fields(v, func(k []byte, s, e int) error {
		switch string(k) {
		case "prompt_tokens":
			u.PromptTokens, _ = intVal(v[s:e])
		case "completion_tokens":
			u.CompletionTokens, _ = intVal(v[s:e])
		case "prompt_tokens_details":
			if d := v[s:e]; d[0] == '{' {
				fields(d, func(k []byte, s, e int) error {
					if string(k) == "cached_tokens" {
						u.CachedTokens, _ = intVal(d[s:e])
					}
					return nil
				})
			}
		case "completion_tokens_details":
			if d := v[s:e]; d[0] == '{' {
				fields(d, func(k []byte, s, e int) error {
					if string(k) == "reasoning_tokens" {
						u.ReasoningTokens, _ = intVal(d[s:e])
					}
					return nil
				})
			}
		}
		return nil
	})
}

// errBadUpstream is the answer when the engine's body cannot be read.
var errBadUpstream = &Error{Status: 502, Type: TypeServer, Message: "the engine answered with an unreadable chat completion"}

// chatResult is the first choice of a chat completion.
type chatResult struct {
	content    []byte // raw string body
	refusal    []byte // raw string body (message.refusal)
	reasoning  []byte // raw string body (reasoning_content or reasoning)
	toolCalls  []byte // the tool_calls array, or nil
	funcCall   []byte // the deprecated function_call object, or nil
	finish     []byte // raw finish_reason string body, nil when null
	stopReason []byte // vLLM's matched stop string (raw body), nil otherwise
	usage      Usage
}

func parseChat(body []byte) (chatResult, error) {
	var r chatResult
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return r, errBadUpstream
	}
	var choices []byte
	end, err := walkObject(body, i, 0, func(k []byte, s, e int) error {
		switch string(k) {
		case "choices":
			choices = body[s:e]
		case "usage":
			r.usage.read(body[s:e])
		}
		return nil
	})
	if err != nil || skipSpace(body, end) != len(body) || choices == nil || choices[0] != '[' {
		return r, errBadUpstream
	}
	first := true
	elems(choices, func(s, e int) error {
		ch := choices[s:e]
		if !first || ch[0] != '{' {
			return nil
		}
		first = false
		fields(ch, func(k []byte, s, e int) error {
			v := ch[s:e]
			switch string(k) {
			case "message":
				if v[0] == '{' {
					r.readMessage(v)
				}
			case "finish_reason":
				r.finish, _ = rawStr(v)
			case "stop_reason", "matched_stop": // vLLM's, SGLang's (a string when a stop string matched)
				if raw, ok := rawStr(v); ok {
					r.stopReason = raw
				}
			}
			return nil
		})
		return nil
	})
	if first { // no choice object: nothing to answer with
		return r, errBadUpstream
	}
	return r, nil
}

func (r *chatResult) readMessage(msg []byte) {
	fields(msg, func(k []byte, s, e int) error {
		v := msg[s:e]
		switch string(k) {
		case "content":
			r.content, _ = rawStr(v)
		case "refusal":
			r.refusal, _ = rawStr(v)
		case "reasoning_content", "reasoning":
			if raw, ok := rawStr(v); ok && len(raw) > 0 {
				r.reasoning = raw
			}
		case "tool_calls":
			if v[0] == '[' {
				r.toolCalls = v
			}
		case "function_call": // the deprecated single call, as an old engine answers it
			if v[0] == '{' {
				r.funcCall = v
			}
		}
		return nil
	})
}

// eachToolCall calls f for each tool call of the answer: its tool_calls,
// or else its deprecated function_call (one call, without an id).
func (r *chatResult) eachToolCall(f func(tc toolCall)) {
	if r.toolCalls != nil || r.funcCall == nil {
		forEachToolCall(r.toolCalls, f)
		return
	}
	var tc toolCall
	readFunction(r.funcCall, &tc)
	f(tc)
}

// toolCall is one call of a chat tool_calls array.
type toolCall struct {
	id, name, args []byte // raw string bodies; args may be an object (argsObj)
	argsObj        bool
}

func forEachToolCall(calls []byte, f func(tc toolCall)) {
	if calls == nil {
		return
	}
	elems(calls, func(s, e int) error {
		c := calls[s:e]
		if c[0] != '{' {
			return nil
		}
		var tc toolCall
		fields(c, func(k []byte, s, e int) error {
			v := c[s:e]
			switch string(k) {
			case "id":
				tc.id, _ = rawStr(v)
			case "function":
				readFunction(v, &tc)
			}
			return nil
		})
		f(tc)
		return nil
	})
}

// readFunction reads a chat function object ({"name":..,"arguments":..})
// into tc.
func readFunction(v []byte, tc *toolCall) {
	if len(v) == 0 || v[0] != '{' {
		return
	}
	fields(v, func(k []byte, s, e int) error {
		fv := v[s:e]
		switch string(k) {
		case "name":
			tc.name, _ = rawStr(fv)
		case "arguments":
			if raw, ok := rawStr(fv); ok {
				tc.args = raw
			} else if fv[0] == '{' {
				tc.args, tc.argsObj = fv, true
			}
		}
		return nil
	})
}

// anthropicStop maps a chat finish to Anthropic's stop_reason and, for
// stop_sequence, the raw matched sequence.
func anthropicStop(finish, stopReason []byte, tools bool, m *Meta) (string, []byte) {
	switch string(finish) {
	case "length":
		return "max_tokens", nil
	case "tool_calls", "function_call":
		return "tool_use", nil
	case "content_filter":
		return "refusal", nil
	}
	if tools {
		return "tool_use", nil
	}
	if stopReason != nil && len(m.stopEnds) > 0 {
		var buf [256]byte
		dst := buf[:0]
		if len(stopReason) > len(buf) {
			dst = nil // a long sequence: allocated, rare
		}
		if m.isStop(unescape(dst, stopReason)) {
			return "stop_sequence", stopReason
		}
	}
	return "end_turn", nil
}

// appendAnthropicUsage appends Anthropic's usage object: a Message's
// (Usage, full) or a message_delta's (MessageDeltaUsage). input_tokens
// excludes cache reads (Anthropic counts them apart). The fields the
// official SDKs type as nullable, which the API always sends, are sent:
// no cache writes, the rest null (nothing to tell).
func appendAnthropicUsage(dst []byte, u *Usage, full bool) []byte {
	in := u.PromptTokens - u.CachedTokens
	if in < 0 {
		in = 0
	}
	dst = append(dst, `{"input_tokens":`...)
	dst = appendInt(dst, in)
	dst = append(dst, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":`...)
	dst = appendInt(dst, u.CachedTokens)
	dst = append(dst, `,"output_tokens":`...)
	dst = appendInt(dst, u.CompletionTokens)
	if full {
		return append(dst, anthropicUsageRest...)
	}
	return append(dst, anthropicDeltaUsageRest...)
}

// The usage fields after output_tokens, and a Message's fields the SDKs
// type as nullable (before its usage).
const (
	anthropicUsageRest = `,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},` +
		`"inference_geo":null,"output_tokens_details":null,"server_tool_use":null,"service_tier":null,"speed":null}`
	anthropicDeltaUsageRest = `,"output_tokens_details":null,"server_tool_use":null}`
	anthropicMessageNulls   = `,"stop_details":null,"container":null,"diagnostics":null`
	// anthropicRefusalDetails is a refusal's stop_details: an engine names
	// no category.
	anthropicRefusalDetails = `{"type":"refusal","category":null,"explanation":null}`
)

// ChatToAnthropic converts a chat completion body (an engine's 200 answer)
// to an Anthropic Message appended to dst.
func ChatToAnthropic(dst, body []byte, m *Meta) ([]byte, error) {
	r, err := parseChat(body)
	if err != nil {
		return dst, err
	}
	dst = append(dst, `{"id":"`...)
	dst = append(dst, m.ID...)
	dst = append(dst, `","type":"message","role":"assistant","model":`...)
	dst = appendBytesStr(dst, m.Model)
	dst = append(dst, `,"content":[`...)
	n := 0
	sep := func() {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
	}
	if len(r.reasoning) > 0 {
		sep()
		dst = append(dst, `{"type":"thinking","thinking":"`...)
		dst = append(dst, r.reasoning...)
		dst = append(dst, `","signature":""}`...)
	}
	if len(r.content) > 0 || len(r.refusal) > 0 {
		// Messages has no refusal block: a refusal is text, with
		// stop_reason refusal.
		sep()
		dst = append(dst, `{"type":"text","text":"`...)
		dst = append(dst, r.content...)
		if len(r.content) > 0 && len(r.refusal) > 0 {
			dst = append(dst, `\n`...)
		}
		dst = append(dst, r.refusal...)
		dst = append(dst, `","citations":null}`...)
	}
	tools := false
	r.eachToolCall(func(tc toolCall) {
		tools = true
		sep()
		dst = append(dst, `{"type":"tool_use","id":"`...)
		if len(tc.id) > 0 {
			dst = append(dst, tc.id...)
		} else {
			dst = appendID(dst, "toolu_")
		}
		dst = append(dst, `","name":"`...)
		dst = append(dst, tc.name...)
		dst = append(dst, `","input":`...)
		dst = appendArgsObject(dst, tc)
		dst = append(dst, `,"caller":{"type":"direct"}}`...)
	})
	reason, seq := anthropicStop(r.finish, r.stopReason, tools, m)
	if len(r.refusal) > 0 && reason == "end_turn" {
		reason = "refusal"
	}
	dst = append(dst, `],"stop_reason":"`...)
	dst = append(dst, reason...)
	dst = append(dst, `","stop_sequence":`...)
	if seq != nil {
		dst = append(dst, '"')
		dst = append(dst, seq...)
		dst = append(dst, '"')
	} else {
		dst = append(dst, "null"...)
	}
	if reason == "refusal" {
		dst = append(dst, `,"stop_details":`+anthropicRefusalDetails...)
		dst = append(dst, anthropicMessageNulls[len(`,"stop_details":null`):]...)
	} else {
		dst = append(dst, anthropicMessageNulls...)
	}
	dst = append(dst, `,"usage":`...)
	dst = appendAnthropicUsage(dst, &r.usage, true)
	return append(dst, '}'), nil
}

// appendArgsObject appends a tool call's arguments as a JSON object: the
// decoded arguments string when it holds an object, {} when the model
// produced something else.
func appendArgsObject(dst []byte, tc toolCall) []byte {
	if tc.argsObj {
		return append(dst, tc.args...)
	}
	mark := len(dst)
	dst = unescape(dst, tc.args)
	obj := dst[mark:]
	i := skipSpace(obj, 0)
	if i < len(obj) && obj[i] == '{' {
		if end, err := skipValue(obj, i, 0); err == nil && skipSpace(obj, end) == len(obj) {
			return dst
		}
	}
	return append(dst[:mark], "{}"...)
}

// ChatToResponses converts a chat completion body to an OpenAI Response
// object appended to dst.
func ChatToResponses(dst, body []byte, m *Meta) ([]byte, error) {
	r, err := parseChat(body)
	if err != nil {
		return dst, err
	}
	status, reason := responseStatus(r.finish)
	dst = appendResponseHead(dst, m, status, reason)
	dst = append(dst, `,"output":[`...)
	// The last item is the one an output limit cut (incomplete).
	items := 0
	if len(r.reasoning) > 0 {
		items++
	}
	if len(r.content) > 0 || len(r.refusal) > 0 {
		items++
	}
	r.eachToolCall(func(toolCall) { items++ })
	n := 0
	if len(r.reasoning) > 0 {
		n++
		dst = appendReasoningItem(dst, nil, r.reasoning, itemStatus(status, n == items))
	}
	if len(r.content) > 0 || len(r.refusal) > 0 {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		if len(r.refusal) > 0 {
			dst = appendRefusalMessage(dst, r.content, r.refusal, itemStatus(status, n == items))
		} else {
			dst = appendMessageItem(dst, nil, r.content, itemStatus(status, n == items))
		}
	}
	r.eachToolCall(func(tc toolCall) {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		args := tc.args
		if !tc.argsObj && blankArgs(args) {
			args = emptyArgs // as OpenAI sends a call without arguments: the SDKs JSON.parse them
		}
		dst = appendFunctionCallItem(dst, nil, tc.id, tc.name, args, tc.argsObj, itemStatus(status, n == items))
	})
	dst = append(dst, ']')
	dst = appendResponseTail(dst, m, &r.usage, true)
	return dst, nil
}

// AppendResponseShell appends a Response object with the given status, no
// output and no usage: what vLLM stores and answers for a background
// Response until it ends ("queued") and once it is cancelled
// ("cancelled"), ResponsesResponse.from_request with output [] and usage
// None.
func AppendResponseShell(dst []byte, m *Meta, status string) []byte {
	dst = appendResponseHead(dst, m, status, "")
	dst = append(dst, `,"output":[]`...)
	return appendResponseTail(dst, m, nil, false)
}

// itemStatus is the status of an output item of a Response with the given
// status: the last item of an incomplete Response is the one cut
// (incomplete, as OpenAI reports it), the others are completed.
func itemStatus(status string, last bool) string {
	if last && status == "incomplete" {
		return "incomplete"
	}
	return "completed"
}

// responseStatus maps a chat finish_reason to a Response status and its
// incomplete reason.
func responseStatus(finish []byte) (status, reason string) {
	switch string(finish) {
	case "length":
		return "incomplete", "max_output_tokens"
	case "content_filter":
		return "incomplete", "content_filter"
	}
	return "completed", ""
}

// appendResponseHead appends a Response object up to (not including) its
// output field.
func appendResponseHead(dst []byte, m *Meta, status, incompleteReason string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, m.ID...)
	dst = append(dst, `","object":"response","created_at":`...)
	dst = appendInt(dst, m.Created)
	dst = append(dst, `,"status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","background":`...)
	if m.Background {
		dst = append(dst, "true"...)
	} else {
		dst = append(dst, "false"...)
	}
	dst = append(dst, `,"error":null,"incomplete_details":`...)
	if incompleteReason != "" {
		dst = append(dst, `{"reason":"`...)
		dst = append(dst, incompleteReason...)
		dst = append(dst, `"}`...)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"instructions":`...)
	dst = m.appendEcho(dst, echoInstructions, "null")
	dst = append(dst, `,"max_output_tokens":`...)
	dst = m.appendEcho(dst, echoMaxOutputTokens, "null")
	dst = append(dst, `,"model":`...)
	dst = appendBytesStr(dst, m.Model)
	return dst
}

// appendResponseTail appends the fields after output and closes the
// object; usage is written when withUsage.
func appendResponseTail(dst []byte, m *Meta, u *Usage, withUsage bool) []byte {
	dst = append(dst, `,"parallel_tool_calls":`...)
	dst = m.appendEcho(dst, echoParallelToolCalls, "true")
	dst = append(dst, `,"previous_response_id":`...)
	if len(m.PrevResponseID) > 0 {
		dst = appendBytesStr(dst, m.PrevResponseID)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"reasoning":`...)
	dst = m.appendEcho(dst, echoReasoning, `{"effort":null,"summary":null}`)
	dst = append(dst, `,"store":`...)
	if m.Stored {
		dst = append(dst, "true"...)
	} else {
		dst = append(dst, "false"...)
	}
	dst = append(dst, `,"temperature":`...)
	dst = m.appendEcho(dst, echoTemperature, "1")
	dst = append(dst, `,"text":`...)
	dst = m.appendEcho(dst, echoText, `{"format":{"type":"text"}}`)
	dst = append(dst, `,"tool_choice":`...)
	dst = m.appendEcho(dst, echoToolChoice, `"auto"`)
	dst = append(dst, `,"tools":`...)
	dst = m.appendEcho(dst, echoTools, "[]")
	dst = append(dst, `,"top_p":`...)
	dst = m.appendEcho(dst, echoTopP, "1")
	dst = append(dst, `,"truncation":`...)
	dst = m.appendEcho(dst, echoTruncation, `"disabled"`)
	dst = append(dst, `,"usage":`...)
	if withUsage {
		dst = appendResponsesUsage(dst, u)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"user":`...)
	dst = m.appendEcho(dst, echoUser, "null")
	dst = append(dst, `,"metadata":`...)
	dst = m.appendEcho(dst, echoMetadata, "{}")
	return append(dst, '}')
}

func appendResponsesUsage(dst []byte, u *Usage) []byte {
	dst = append(dst, `{"input_tokens":`...)
	dst = appendInt(dst, u.PromptTokens)
	dst = append(dst, `,"input_tokens_details":{"cached_tokens":`...)
	dst = appendInt(dst, u.CachedTokens)
	dst = append(dst, `},"output_tokens":`...)
	dst = appendInt(dst, u.CompletionTokens)
	dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":`...)
	dst = appendInt(dst, u.ReasoningTokens)
	dst = append(dst, `},"total_tokens":`...)
	dst = appendInt(dst, u.PromptTokens+u.CompletionTokens)
	return append(dst, '}')
}

// appendReasoningItem appends a reasoning output item holding text (raw
// string body) as reasoning_text content. id nil: a fresh id.
func appendReasoningItem(dst, id, text []byte, status string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = appendItemID(dst, id, "rs_")
	dst = append(dst, `","type":"reasoning","summary":[],"content":[`...)
	if text != nil {
		dst = append(dst, `{"type":"reasoning_text","text":"`...)
		dst = append(dst, text...)
		dst = append(dst, `"}`...)
	}
	dst = append(dst, `],"status":"`...)
	dst = append(dst, status...)
	return append(dst, `"}`...)
}

// appendMessageItem appends an assistant message output item with one
// output_text part (none when text is nil).
func appendMessageItem(dst, id, text []byte, status string) []byte {
	dst = appendMessageHead(dst, id, status)
	if text != nil {
		dst = appendOutputText(dst, text)
	}
	return append(dst, "]}"...)
}

// appendRefusalItem appends an assistant message output item with one
// refusal part (none when text is nil).
func appendRefusalItem(dst, id, text []byte, status string) []byte {
	dst = appendMessageHead(dst, id, status)
	if text != nil {
		dst = appendRefusalPart(dst, text)
	}
	return append(dst, "]}"...)
}

// appendRefusalMessage appends an assistant message item holding the
// answer's text (when any) and its refusal, as OpenAI's output parts.
func appendRefusalMessage(dst, text, refusal []byte, status string) []byte {
	dst = appendMessageHead(dst, nil, status)
	if len(text) > 0 {
		dst = appendOutputText(dst, text)
		dst = append(dst, ',')
	}
	dst = appendRefusalPart(dst, refusal)
	return append(dst, "]}"...)
}

// appendMessageHead opens an assistant message output item, up to its
// content array.
func appendMessageHead(dst, id []byte, status string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = appendItemID(dst, id, "msg_")
	dst = append(dst, `","type":"message","status":"`...)
	dst = append(dst, status...)
	return append(dst, `","role":"assistant","content":[`...)
}

func appendRefusalPart(dst, text []byte) []byte {
	dst = append(dst, `{"type":"refusal","refusal":"`...)
	dst = append(dst, text...)
	return append(dst, `"}`...)
}

func appendOutputText(dst, text []byte) []byte {
	dst = append(dst, `{"type":"output_text","text":"`...)
	dst = append(dst, text...)
	return append(dst, `","annotations":[],"logprobs":[]}`...)
}

// appendFunctionCallItem appends a function_call output item; callID empty
// gets a fresh call id.
// emptyArgs is the arguments of a call that takes none, as OpenAI sends
// them (a JSON string's content).
var emptyArgs = []byte("{}")

// blankArgs reports whether a call's arguments string is empty or white
// space: an engine calling a function without arguments may send "".
func blankArgs(args []byte) bool {
	for _, c := range args {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

func appendFunctionCallItem(dst, id, callID, name, args []byte, argsObj bool, status string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = appendItemID(dst, id, "fc_")
	dst = append(dst, `","type":"function_call","call_id":"`...)
	if len(callID) > 0 {
		dst = append(dst, callID...)
	} else {
		dst = appendID(dst, "call_")
	}
	dst = append(dst, `","name":"`...)
	dst = append(dst, name...)
	dst = append(dst, `","arguments":"`...)
	if argsObj { // engines send a string; tolerate an object
		dst = appendJSONAsString(dst, args)
	} else {
		dst = append(dst, args...)
	}
	dst = append(dst, `","status":"`...)
	dst = append(dst, status...)
	return append(dst, `"}`...)
}

func appendItemID(dst, id []byte, prefix string) []byte {
	if id != nil {
		return append(dst, id...)
	}
	return appendID(dst, prefix)
}
