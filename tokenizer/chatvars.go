package tokenizer

import (
	"bytes"
	"strings"
	"sync"
	"unsafe"

	"github.com/infera/infera/jinja"
)

// chatVars builds the template variables of one render from pooled jinja
// objects and lists, so that a warm RenderChat allocates nothing. The values
// it builds hold the caller's strings: release clears them before the
// struct goes back to the pool (RenderChat must not retain msgs).
type chatVars struct {
	objs  []*jinja.Object
	nobjs int
	lists []*jinja.List
	nlist int
}

var chatVarsPool = sync.Pool{New: func() any { return new(chatVars) }}

// Limits on what a pooled chatVars keeps after a very large conversation.
const (
	maxPooledChatObjects = 1024
	maxPooledChatLists   = 256
)

func acquireChatVars() *chatVars { return chatVarsPool.Get().(*chatVars) }

func (cv *chatVars) release() {
	for _, o := range cv.objs[:cv.nobjs] {
		o.Reset()
	}
	for _, l := range cv.lists[:cv.nlist] {
		l.Reset()
	}
	cv.nobjs, cv.nlist = 0, 0
	if len(cv.objs) > maxPooledChatObjects {
		cv.objs = nil
	}
	if len(cv.lists) > maxPooledChatLists {
		cv.lists = nil
	}
	chatVarsPool.Put(cv)
}

func (cv *chatVars) object() *jinja.Object {
	if cv.nobjs == len(cv.objs) {
		cv.objs = append(cv.objs, jinja.NewObject(6))
	}
	o := cv.objs[cv.nobjs]
	cv.nobjs++
	return o
}

func (cv *chatVars) list() *jinja.List {
	if cv.nlist == len(cv.lists) {
		cv.lists = append(cv.lists, new(jinja.List))
	}
	l := cv.lists[cv.nlist]
	cv.nlist++
	return l
}

// messages returns msgs as template values: objects with role and content
// always set, name, tool_call_id and tool_calls set only when non-empty,
// an assistant's reasoning as reasoning and reasoning_content when given;
// tool call arguments are decoded (args) as vLLM
// decodes them before rendering.
//
// With parts (the template loops over message contents: vLLM's "openai"
// content format), a content is a list of parts ({"type": "text", "text":
// ...}) as vLLM's chat_utils makes it: a string is one text part, an
// absent or null content none; a tool message's parts that are all text
// are joined by "\n" into a string, as vLLM does for tool results.
func (cv *chatVars) messages(msgs []Message, args *toolsCache, parts bool) (jinja.Value, error) {
	arr := cv.list()
	for i := range msgs {
		v, err := cv.message(&msgs[i], args, parts)
		if err != nil {
			return jinja.Undefined(), err
		}
		arr.Append(v)
	}
	return arr.Value(), nil
}

func (cv *chatVars) message(m *Message, args *toolsCache, parts bool) (jinja.Value, error) {
	o := cv.object()
	o.Set("role", jinja.String(m.Role))
	if parts {
		o.Set("content", cv.contentParts(m))
	} else {
		o.Set("content", jinja.String(m.Content))
	}
	if m.Name != "" {
		o.Set("name", jinja.String(m.Name))
	}
	if m.ToolCallID != "" {
		o.Set("tool_call_id", jinja.String(m.ToolCallID))
	}
	if len(m.ToolCalls) > 0 {
		calls := cv.list()
		for i := range m.ToolCalls {
			tc := &m.ToolCalls[i]
			c := cv.object()
			if tc.ID != "" {
				c.Set("id", jinja.String(tc.ID))
			}
			if tc.Type != "" {
				c.Set("type", jinja.String(tc.Type))
			}
			f := cv.object()
			f.Set("name", jinja.String(tc.Function.Name))
			a, err := args.arguments(tc.Function.Arguments)
			if err != nil {
				return jinja.Undefined(), err
			}
			f.Set("arguments", a)
			c.Set("function", jinja.ObjectValue(f))
			calls.Append(jinja.ObjectValue(c))
		}
		o.Set("tool_calls", calls.Value())
	}
	if m.Role == "assistant" && (m.ReasoningContent != "" || m.HasReasoning) {
		// As vLLM's chat_utils sets them: under the current name and the
		// deprecated one, which Qwen3's template reads.
		r := jinja.String(m.ReasoningContent)
		o.Set("reasoning", r)
		o.Set("reasoning_content", r)
	}
	return jinja.ObjectValue(o), nil
}

// contentParts returns m's content as vLLM's chat_utils hands it to a
// template in the "openai" content format (cv.messages).
func (cv *chatVars) contentParts(m *Message) jinja.Value {
	if m.Role == "tool" {
		if !m.ContentArray {
			return jinja.String(m.Content) // "" when absent: no parts, joined
		}
		allText := true
		for i := range m.Parts {
			allText = allText && m.Parts[i].Type == "text"
		}
		if allText {
			return jinja.String(joinPartTexts(m))
		}
	}
	l := cv.list()
	switch {
	case m.ContentArray:
		for i := range m.Parts {
			p := cv.object()
			p.Set("type", jinja.String(m.Parts[i].Type))
			if k := partTextKey(m.Parts[i].Type); k != "" {
				if m.Parts[i].NullText {
					p.Set(k, jinja.Null())
				} else {
					p.Set(k, jinja.String(m.Parts[i].Text))
				}
			}
			l.Append(jinja.ObjectValue(p))
		}
	case !m.NoContent:
		p := cv.object()
		p.Set("type", jinja.String("text"))
		p.Set("text", jinja.String(m.Content))
		l.Append(jinja.ObjectValue(p))
	}
	return l.Value()
}

// partTextKey is the key under which a part of type typ carries its Text
// ("" for a media part): a tool_reference part names its tool.
func partTextKey(typ string) string {
	switch typ {
	case "text":
		return "text"
	case "tool_reference":
		return "name"
	}
	return ""
}

// joinPartTexts returns the texts of m's parts joined by "\n", empty ones
// included (vLLM's tool-message join): Content when none is empty.
func joinPartTexts(m *Message) string {
	for i := range m.Parts {
		if m.Parts[i].Text == "" {
			texts := make([]string, len(m.Parts))
			for j := range m.Parts {
				texts[j] = m.Parts[j].Text
			}
			return strings.Join(texts, "\n")
		}
	}
	return m.Content
}

// toolsCache keeps the parsed form of recently seen tools arrays: clients
// of one application send the same tool definitions with every request, and
// parsing them is most of what a render with tools would allocate. Parsed
// values are immutable (templates only assign to namespaces), so renders
// share them. Bounded: a full cache is cleared.
type toolsCache struct {
	mu      sync.RWMutex
	m       map[string]jinja.Value
	bytes   int // sum of the cached keys' lengths
	entries int // bound on the entries; 0: toolsCacheEntries
}

const (
	toolsCacheEntries = 64
	// argsCacheEntries bounds the decoded tool call arguments kept: an
	// agent's conversation holds many calls, all sent again every turn.
	argsCacheEntries = 1024
	toolsCacheBytes  = 4 << 20   // of JSON text cached, all entries together
	toolsCacheMaxLen = 256 << 10 // larger tools arrays are parsed every time
	// MaxToolValues bounds the values (scalars and containers) of a tools
	// array the renderer parses: each costs about 500 bytes and 1 us, so a
	// tools array of 120,000 tiny values cost 61 MB and 120 ms per render
	// (varied, so never cached). Past it the render stops with a limit
	// error (jinja.IsLimit). Real tool schemas hold some tens of values a
	// tool.
	MaxToolValues = 16384
)

// parse returns the value of the JSON tools array (undefined for blank
// input), passed through dump (when not nil) before it is cached.
func (c *toolsCache) parse(tools []byte, dump func(jinja.Value) jinja.Value) (jinja.Value, error) {
	if len(bytes.TrimSpace(tools)) == 0 {
		return jinja.Undefined(), nil
	}
	c.mu.RLock()
	v, ok := c.m[string(tools)]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	v, err := jinja.FromJSONMax(tools, MaxToolValues)
	if err != nil {
		return jinja.Undefined(), err
	}
	if dump != nil {
		v = dump(v)
	}
	c.store(unsafe.String(unsafe.SliceData(tools), len(tools)), v)
	return v, nil
}

// store caches v as the value of key (copied: callers' keys may live in
// reused memory), unless key is over toolsCacheMaxLen.
func (c *toolsCache) store(key string, v jinja.Value) {
	if len(key) > toolsCacheMaxLen {
		return
	}
	n := c.entries
	if n == 0 {
		n = toolsCacheEntries
	}
	c.mu.Lock()
	if _, dup := c.m[key]; !dup {
		if c.m == nil || len(c.m) >= n || c.bytes+len(key) > toolsCacheBytes {
			c.m, c.bytes = make(map[string]jinja.Value, n), 0
		}
		c.m[strings.Clone(key)] = v
		c.bytes += len(key)
	}
	c.mu.Unlock()
}

// emptyArguments is the arguments of a tool call whose arguments are not
// JSON: an empty object, as vLLM renders them. Values are immutable.
var emptyArguments = jinja.ObjectValue(jinja.NewObject(0))

// arguments returns a tool call's arguments (the JSON text the client sent,
// decoded from its string) as vLLM hands them to the chat template: its
// chat_utils decodes every assistant tool call's arguments string with
// json.loads (an empty object when that fails) before rendering, because
// templates expect a mapping, so Qwen3's template writes them with tojson
// (`{"city": "Paris"}`) and not as the client's text (`{"city":"Paris"}`);
// SGLang decodes them too. The decoded values are cached as tools are: an
// agent's conversation sends the same calls with every turn. Past
// MaxToolValues values the render stops with a limit error.
func (c *toolsCache) arguments(s string) (jinja.Value, error) {
	c.mu.RLock()
	v, ok := c.m[s]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	v, err := jinja.FromJSONMax(unsafe.Slice(unsafe.StringData(s), len(s)), MaxToolValues)
	if err != nil {
		if jinja.IsLimit(err) {
			return jinja.Undefined(), err
		}
		v = emptyArguments
	}
	c.store(s, v)
	return v, nil
}

// dumpTools returns the tools array v as vLLM hands it to the template: each
// tool validated into its ChatCompletionToolsParam and dumped again
// (pydantic's model_dump): "type" ("function" when absent) and "function"
// first, then the tool's other keys; in the function its name, description
// and parameters first, null when absent, then its other keys, each in
// their order. A tool of another shape is left as it is (vLLM refuses it).
func dumpTools(v jinja.Value) jinja.Value {
	if v.Kind() != jinja.KindArray {
		return v
	}
	items := v.Items()
	out := make([]jinja.Value, len(items))
	for i, t := range items {
		out[i] = dumpTool(t)
	}
	return jinja.Array(out...)
}

func dumpTool(t jinja.Value) jinja.Value {
	if t.Kind() != jinja.KindObject {
		return t
	}
	to := t.Object()
	fn, ok := to.Get("function")
	if !ok || fn.Kind() != jinja.KindObject {
		return t
	}
	fo := fn.Object()
	nf := jinja.NewObject(fo.Len() + 2)
	for _, k := range [...]string{"name", "description", "parameters"} {
		v, ok := fo.Get(k)
		if !ok {
			v = jinja.Null()
		}
		nf.Set(k, v)
	}
	copyOthers(nf, fo)
	nt := jinja.NewObject(to.Len() + 1)
	typ, ok := to.Get("type")
	if !ok {
		typ = jinja.String("function")
	}
	nt.Set("type", typ)
	nt.Set("function", jinja.ObjectValue(nf))
	copyOthers(nt, to)
	return jinja.ObjectValue(nt)
}

// copyOthers sets in dst each key of src that dst does not hold yet, in
// src's order.
func copyOthers(dst, src *jinja.Object) {
	for _, k := range src.Keys() {
		if _, ok := dst.Get(k); !ok {
			v, _ := src.Get(k)
			dst.Set(k, v)
		}
	}
}
