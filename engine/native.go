package engine

import (
	"bytes"
	"io"

	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// Native protocols (--native-protocols): POST /v1/messages,
// /v1/messages/count_tokens and /v1/responses served by the engine itself,
// as vLLM serves them: the request is converted to a chat completion,
// generated like one, and the answer (stream included) converted back. A
// router in passthrough mode forwards these paths to engines like this.

// nativeOptions are the conversion options of native endpoints: reasoning
// controls become reasoning_effort, which answer shaping reads, and stream
// is read as vLLM's pydantic models read a bool (lax mode: "stream":1 and
// "stream":"true" stream).
var nativeOptions = func() protocol.Options {
	o := protocol.DefaultOptions()
	o.LaxStream = true
	return o
}()

func (s *Server) handleNative(ctx *fasthttp.RequestCtx, path string) {
	api := protocol.Anthropic
	if path == "/v1/responses" {
		api = protocol.Responses
	}
	m := new(protocol.Meta)
	var (
		chat   []byte
		err    error
		stored bool // a Response the engine keeps
	)
	switch path {
	case "/v1/messages":
		chat, err = protocol.AnthropicToChat(nil, ctx.PostBody(), &nativeOptions, m)
	case "/v1/responses":
		f, ferr := responsesFollowUp(ctx.PostBody())
		if ferr != nil {
			s.nativeError(ctx, api, ferr)
			return
		}
		prev, noStore := f.prev, f.noStore
		chat, err = protocol.ResponsesToChat(nil, f.body, &nativeOptions, m)
		// vLLM validates the request (pydantic) before it looks the
		// previous response up: a request it refuses is a 400 first.
		if err == nil && prev != nil && !s.resp.has(prev) {
			s.badRequests.Add(1)
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			ctx.SetContentType("application/json")
			ctx.SetBody(protocol.AppendResponseNotFound(nil, prev))
			return
		}
		// The Response echoes the request's previous_response_id and
		// store (true unless the request's is a lax false or null), as
		// vLLM's does.
		m.PrevResponseID, m.Stored = append(m.PrevResponseID[:0], prev...), !noStore
		if err == nil && f.background {
			if m.Stream {
				s.nativeError(ctx, api, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Param: "background",
					Message: "background responses cannot be streamed by the simulated engine"})
				return
			}
			s.startBackground(ctx, chat, m) // background.go
			return
		}
		stored = !noStore
		defer func() {
			if err == nil && !noStore && ctx.Response.StatusCode() < 400 {
				// Body() would read a stream whole: its Response is
				// made from the request's meta instead.
				var resp []byte
				if ctx.Response.IsBodyStream() {
					resp = appendStreamedResponse(nil, m)
				} else {
					resp = ctx.Response.Body()
				}
				s.resp.add(m.ID, resp) // respstore.go
			}
		}()
	default:
		s.countTokens(ctx, m)
		return
	}
	if err != nil {
		s.nativeError(ctx, api, err)
		return
	}
	ctx.Request.SetBody(chat)
	nat := &nativeStream{m: m}
	if stored {
		// A stored stream's Response is its last event's, once it ends.
		nat.final = func(resp []byte) { s.resp.update(m.ID, resp) }
	}
	s.handleGenerate(ctx, true, nat, nil)
	if nat.t != nil {
		return // a stream: nativeStream converts it
	}
	status := ctx.Response.StatusCode()
	body := ctx.Response.Body()
	var out []byte
	if status >= 400 {
		out = protocol.ConvertError(nil, api, status, body)
	} else {
		if api == protocol.Anthropic {
			out, err = protocol.ChatToAnthropic(nil, body, m)
		} else {
			out, err = protocol.ChatToResponses(nil, body, m)
		}
		if err != nil {
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
			out = protocol.AppendError(nil, api, 500, protocol.TypeServer, "", err.Error())
		}
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
}

// countTokens answers /v1/messages/count_tokens with the engine's own chat
// template and tokenizer.
func (s *Server) countTokens(ctx *fasthttp.RequestCtx, m *protocol.Meta) {
	s.requests.Add(1)
	chat, err := protocol.AnthropicCountTokensToChat(nil, ctx.PostBody(), &nativeOptions, m)
	if err != nil {
		s.nativeError(ctx, protocol.Anthropic, err)
		return
	}
	if _, ok := s.models[string(m.Model)]; !ok {
		s.badRequests.Add(1)
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBody(protocol.AppendError(nil, protocol.Anthropic, 404, protocol.TypeNotFound, "model", "model: "+string(m.Model)+" is not served"))
		return
	}
	var arena []byte
	msgs, tools, err := protocol.ChatMessages(nil, chat, &arena)
	var text []byte
	if err == nil {
		text, err = s.tok.RenderChat(nil, msgs, tools, !m.ContinueFinal)
		if err == nil && m.ContinueFinal && len(msgs) > 0 {
			text = tokenizer.ContinueFinalMessage(text, tokenizer.FinalContent(s.tok, &msgs[len(msgs)-1])) // a prefill is continued
		}
	}
	if err != nil {
		s.nativeError(ctx, protocol.Anthropic, &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Message: "cannot render the prompt: " + err.Error()})
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(protocol.AppendCountTokens(nil, len(s.tok.Encode(nil, text))))
}

func (s *Server) nativeError(ctx *fasthttp.RequestCtx, api protocol.API, err error) {
	s.badRequests.Add(1)
	e, ok := err.(*protocol.Error)
	if !ok {
		e = &protocol.Error{Status: 400, Type: protocol.TypeInvalidRequest, Message: err.Error()}
	}
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(e.Append(nil, api))
}

// nativeStream converts a chat token stream into the client protocol's
// events as fasthttp reads it.
type nativeStream struct {
	m       *protocol.Meta
	final   func(resp []byte) // gets the last event's "response" object; nil: none wanted
	t       *tokenStream
	c       *protocol.StreamConverter
	in, out []byte
	pending []byte
	eof     bool
}

func (n *nativeStream) Read(p []byte) (int, error) {
	for len(n.pending) == 0 {
		if n.eof {
			return 0, io.EOF
		}
		if n.c == nil {
			n.c = protocol.AcquireStreamConverter(n.m)
			n.in = make([]byte, 16<<10)
		}
		k, err := n.t.Read(n.in)
		n.out = n.c.Feed(n.out[:0], n.in[:k])
		switch {
		case err == io.EOF:
			n.out = n.c.Finish(n.out)
			n.eof = true
		case err != nil:
			return 0, err
		}
		if n.final != nil && n.c.Finished() {
			// The Response's last event came with this output.
			if i := bytes.LastIndex(n.out, keyResponseObj); i >= 0 {
				vs := i + len(keyResponseObj)
				if ve, err := jsonscan.SkipValue(n.out, vs, 64); err == nil {
					n.final(n.out[vs:ve])
				}
			}
			n.final = nil
		}
		n.pending = n.out
	}
	k := copy(p, n.pending)
	n.pending = n.pending[k:]
	return k, nil
}

// CloseWithError implements fasthttp.ReadCloserWithError: the token
// stream ends with the response (a gone client aborts the sequence).
func (n *nativeStream) CloseWithError(err error) error {
	if n.c != nil {
		protocol.ReleaseStreamConverter(n.c)
		n.c = nil
	}
	return n.t.CloseWithError(err)
}
