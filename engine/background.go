package engine

import (
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/protocol"
)

// Background Responses (native protocols), as vLLM serves them with its
// Responses store on (serving.py: create_responses with "background": true,
// _run_background_request, retrieve_responses, cancel_responses): the
// create is answered at once with the Response stored as "queued" (no
// output, usage null) while the engine generates it; a retrieve answers
// that queued Response until the generation ends (vLLM never stores a
// non-streamed background Response as "in_progress"), then the final one
// ("completed", or "incomplete" when cut by max_output_tokens; "failed"
// when the generation failed). POST /v1/responses/{id}/cancel of one still
// queued aborts its generation (its KV blocks are freed) and stores and
// answers it "cancelled"; its end is then not stored; a cancel of a
// Response that is not running is refused as vLLM refuses it, 400 "Cannot
// cancel a synchronous response.". A background request that is not
// stored is refused (vLLM's validate_background), and, unlike vLLM, one
// that asks to stream (the simulated engine has no event store to replay
// from).

// startBackground answers a background Responses request (m its converted
// meta, chat the chat request it became) with its queued Response and
// generates it apart from the request: m and chat belong to the generation
// from here on.
func (s *Server) startBackground(ctx *fasthttp.RequestCtx, chat []byte, m *protocol.Meta) {
	m.Background = true
	queued := protocol.AppendResponseShell(nil, m, "queued")
	stop := s.resp.addBackground(m.ID, queued, protocol.AppendResponseShell(nil, m, "cancelled"))
	go s.runBackground(chat, m, stop)
	ctx.SetContentType("application/json")
	ctx.SetBody(queued)
}

// runBackground generates a background Response (as a non-streamed chat
// request of no connection: only stop, or the engine's shutdown, aborts
// it) and stores its end.
func (s *Server) runBackground(chat []byte, m *protocol.Meta, stop <-chan struct{}) {
	var g fasthttp.RequestCtx
	g.Request.Header.SetMethod(fasthttp.MethodPost)
	g.Request.SetBody(chat)
	s.handleGenerate(&g, true, nil, stop)
	var final []byte
	if g.Response.StatusCode() < 400 {
		var err error
		if final, err = protocol.ChatToResponses(nil, g.Response.Body(), m); err != nil {
			final = nil
		}
	}
	if final == nil {
		final = protocol.AppendResponseShell(nil, m, "failed")
	}
	s.resp.finish(m.ID, final)
}
