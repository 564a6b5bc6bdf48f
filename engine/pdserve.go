package engine

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// pdRequest reads a prefill or decode engine's request fields and sets up
// sq for its role. Errors are client errors (400).
func (s *Server) pdRequest(sq *seq, g genRequest, body []byte) (pdFields, error) {
	cfg := &s.pd.cfg
	f, err := parsePDFields(body, cfg.Mode)
	if err != nil {
		return f, err
	}
	switch {
	case cfg.Role == RolePrefill && cfg.Mode == PDSGLang:
		if !f.hasRoom {
			return f, badRequest("prefill engine (sglang): bootstrap_room is required")
		}
		// The prefill engine computes the prompt and the first token only;
		// the decode engine generates the rest.
		sq.req.MaxTokens = 1
		sq.req.HoldKV = true
		sq.doneCh = make(chan struct{})
	case cfg.Role == RolePrefill && cfg.Mode == PDVLLM:
		if f.kv == nil || !f.kv.doRemoteDecode {
			if f.kv != nil && f.kv.doRemotePrefill {
				return f, badRequest("prefill engine (vllm): kv_transfer_params.do_remote_prefill is for decode engines")
			}
			return f, nil // a plain request, served whole, as vLLM serves it
		}
		if g.stream {
			return f, badRequest("prefill engine (vllm): kv_transfer_params.do_remote_decode needs stream false (the kv_transfer_params come back in the response body)")
		}
		sq.req.HoldKV = true
	case cfg.Role == RoleDecode && cfg.Mode == PDSGLang:
		switch {
		case !f.hasRoom:
			return f, badRequest("decode engine (sglang): bootstrap_room is required")
		case !f.hasHost:
			return f, badRequest("decode engine (sglang): bootstrap_host is required")
		}
		if f.port == 0 {
			f.port = cfg.NullBootstrapPort
		}
		sq.req.Transfer = TransferPush
		sq.admitted = make(chan struct{})
	case cfg.Role == RoleDecode && cfg.Mode == PDVLLM:
		kv := f.kv
		switch {
		case kv == nil:
			return f, badRequest("decode engine (vllm): kv_transfer_params is required (the prefill engine's response carries them)")
		case !kv.doRemotePrefill:
			return f, badRequest("decode engine (vllm): kv_transfer_params.do_remote_prefill must be true")
		case kv.engineID == "":
			return f, badRequest("decode engine (vllm): kv_transfer_params.remote_engine_id is required")
		case kv.requestID == "":
			return f, badRequest("decode engine (vllm): kv_transfer_params.remote_request_id is required")
		case kv.host == "":
			return f, badRequest("decode engine (vllm): kv_transfer_params.remote_host is required")
		case kv.port == 0:
			return f, badRequest("decode engine (vllm): kv_transfer_params.remote_port is required")
		case !kv.hasBlockIDs:
			return f, badRequest("decode engine (vllm): kv_transfer_params.remote_block_ids is required")
		}
		sq.req.Transfer = TransferPull
		sq.admitted = make(chan struct{})
	}
	return f, nil
}

// awaitResult is how a wait of a PD handler ended.
type awaitResult uint8

const (
	awaitOK      awaitResult = iota // ok was closed
	awaitFailed                     // fail was closed
	awaitTimeout                    // the timeout passed
	awaitGone                       // the client closed its connection
	awaitStop                       // the engine is stopping
)

// await waits for ok or fail to close, the timeout (none when 0), the
// client to go away (conn nil: not watched) or the engine to stop.
func (s *Server) await(conn net.Conn, ok, fail <-chan struct{}, timeout time.Duration) awaitResult {
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	tick := time.NewTicker(peerCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ok:
			return awaitOK
		case <-fail:
			return awaitFailed
		case <-tc:
			return awaitTimeout
		case <-s.stop:
			return awaitStop
		case <-tick.C:
			if conn != nil && peerClosed(conn) {
				return awaitGone
			}
		}
	}
}

// failPD ends a request whose PD wait did not succeed: nothing more for a
// client that left, 503 when the engine stops, else 500 with err (a
// *transferError).
func (s *Server) failPD(ctx *fasthttp.RequestCtx, res awaitResult, err error) {
	switch res {
	case awaitGone:
		ctx.SetConnectionClose()
	case awaitStop:
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "engine shutting down", "server_error")
	default:
		s.pd.failures.Add(1)
		s.writeError(ctx, fasthttp.StatusInternalServerError, err.Error(), "server_error")
	}
}

// prefillSGLang serves an SGLang prefill request: it waits for the decode
// engine of its bootstrap_room to connect (SGLang's bootstrap queue),
// computes the prompt and the first token while holding the blocks, lets
// the KV server transfer the KV to the decode engine, then frees the
// blocks. It returns true when the response (the first token) may be
// written, false when it has answered with an error.
func (s *Server) prefillSGLang(ctx *fasthttp.RequestCtx, sq *seq, f pdFields) bool {
	p := s.pd
	r, err := p.join(f.room, true)
	if err != nil {
		s.badRequests.Add(1)
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
		return false
	}
	r.promptHash, r.promptTokens = promptHash(sq.req.Prompt), len(sq.req.Prompt)
	ended := transferErrorf("bootstrap_room %d: the prefill request ended before the transfer", f.room)
	defer func() { p.leave(r, ended) }()
	conn := ctx.Conn()
	switch res := s.await(conn, r.decodeIn, r.done, p.cfg.BootstrapTimeout); res {
	case awaitOK:
	case awaitFailed:
		s.failPD(ctx, res, r.err)
		return false
	case awaitTimeout:
		p.timeouts.Add(1)
		ended = transferErrorf("bootstrap_room %d: no decode engine connected within %s (KVPoll.Bootstrapping)", f.room, p.cfg.BootstrapTimeout)
		s.failPD(ctx, res, ended)
		return false
	default:
		s.failPD(ctx, res, nil)
		return false
	}
	if err := s.submit(sq); err != nil {
		s.badRequests.Add(1)
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "invalid_request_error")
		return false
	}
	defer s.abort(sq) // frees the held blocks, whatever happens
	if res := s.await(conn, sq.doneCh, r.done, 0); res != awaitOK {
		s.failPD(ctx, res, r.err)
		return false
	}
	s.mu.Lock()
	r.blocks = s.core.cache.BlocksFor(len(sq.req.Prompt))
	s.mu.Unlock()
	close(r.computed)
	if res := s.await(conn, r.done, nil, 0); res != awaitOK {
		s.failPD(ctx, res, nil)
		return false
	}
	if r.err != nil {
		s.failPD(ctx, awaitFailed, r.err)
		return false
	}
	return true
}

// receiveKV is a decode engine's transfer: once the Core reserved sq's
// blocks, it gets the KV from the prefill engine named by the request
// (SGLang: joins the bootstrap_room and receives the push; vLLM: reads the
// blocks of kv_transfer_params), bounded by WaitingTimeout. It returns true
// when the request may decode, false when it has answered with an error.
func (s *Server) receiveKV(ctx *fasthttp.RequestCtx, sq *seq, f pdFields) bool {
	p := s.pd
	conn := ctx.Conn()
	if res := s.await(conn, sq.admitted, nil, 0); res != awaitOK {
		s.abort(sq)
		s.failPD(ctx, res, nil)
		return false
	}
	tctx, cancel := context.WithTimeout(context.Background(), p.cfg.WaitingTimeout)
	defer cancel()
	hash := strconv.FormatUint(promptHash(sq.req.Prompt), 10)
	done := make(chan struct{})
	var (
		ferr   error
		blocks int
	)
	go func() {
		defer close(done)
		if f.kv == nil {
			blocks, ferr = p.fetch(tctx, f.host, f.port, pathBootstrap,
				bootstrapMsg{Room: f.room, PromptTokens: len(sq.req.Prompt), PromptHash: hash},
				"bootstrap_room "+strconv.FormatInt(f.room, 10))
			return
		}
		// Blocks this engine already caches are not read (vLLM's
		// get_num_new_matched_tokens counts only the missing ones).
		skip := sq.req.CachedTokens / s.cfg.Core.BlockSize
		blocks, ferr = p.fetch(tctx, f.kv.host, f.kv.port, pathRead,
			readMsg{EngineID: f.kv.engineID, RequestID: f.kv.requestID, BlockIDs: f.kv.blockIDs, SkipBlocks: skip,
				PromptTokens: len(sq.req.Prompt), PromptHash: hash},
			"reading the prefill's blocks")
	}()
	res := s.await(conn, done, nil, 0)
	if res != awaitOK {
		cancel()
		<-done
		s.abort(sq)
		s.failPD(ctx, res, nil)
		return false
	}
	if ferr != nil {
		s.abort(sq)
		s.failPD(ctx, awaitFailed, ferr)
		return false
	}
	if !s.transferDone(sq) {
		s.failPD(ctx, awaitStop, nil)
		return false
	}
	p.transfers.Add(1)
	p.blocks.Add(uint64(blocks))
	return true
}

// holdForRead keeps a finished vLLM prefill's blocks for the decode
// engine's read and appends kv_transfer_params to its response body (which
// ends with '}'), as NixlConnectorScheduler.request_finished returns them.
// It returns nil, having freed the blocks, when the engine is stopping.
func (s *Server) holdForRead(sq *seq, body []byte, idPrefix string, id uint64) []byte {
	reqID := idPrefix + strconv.FormatUint(id, 16)
	s.mu.Lock()
	ids := s.core.BlockIDs(nil, &sq.req, s.core.cache.BlocksFor(len(sq.req.Prompt)))
	s.mu.Unlock()
	h := &heldKV{sq: sq, ids: ids, promptHash: promptHash(sq.req.Prompt), promptTokens: len(sq.req.Prompt)}
	if !s.pd.hold(reqID, h) {
		s.abort(sq)
		return nil
	}
	p := &s.pd.cfg
	b := append(body[:len(body)-1], `,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[`...)
	for i, x := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	b = append(b, `]],"remote_engine_id":`...)
	b = appendJSONString(b, p.EngineID)
	b = append(b, `,"remote_request_id":"`...)
	b = append(b, reqID...)
	b = append(b, `","remote_host":`...)
	b = appendJSONString(b, p.AdvertiseHost)
	b = append(b, `,"remote_port":`...)
	b = strconv.AppendInt(b, int64(s.pd.port), 10)
	return append(b, `,"tp_size":1}}`...)
}

func appendJSONString(dst []byte, v string) []byte {
	b, _ := json.Marshal(v) // a string always marshals
	return append(dst, b...)
}
