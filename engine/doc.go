// Package engine is `infera engine`: a simulated, OpenAI-compatible LLM
// inference engine that behaves like vLLM/SGLang in time, not in text, so the
// router can be tested and benchmarked on a small CPU-only box.
//
// It owns three clock-free pieces, usable by a discrete-event simulator with
// virtual time and no goroutines, and the HTTP server that drives them with
// the real clock:
//
//   - TimeModel: pure functions giving the duration of a step.
//     PrefillTime(u, p) = PrefillBase + u*PrefillPerToken + p*PrefillPerSeq
//     for p sequences with u uncached prompt tokens; DecodeStepTime(b) =
//     DecodeBase + b*DecodePerSeq for b decoding sequences; a step that does
//     both costs the sum. All durations are multiplied by Slow (fault) and
//     divided by Speedup. Defaults resemble an 8B model in bf16 on one H100:
//     8 ms + 80 µs/token (+0.25 ms/seq) prefill, 12 ms + 0.15 ms/seq decode.
//   - KVCache: a paged cache of a fixed number of blocks with prefix caching.
//     Full prompt blocks are identified by a chained xxh3 hash (HashBlocks),
//     shared between sequences with reference counts, kept after use and
//     evicted least-recently-freed first. Stores, evictions and clears go to a
//     KVEventSink in order.
//   - Core: continuous batching. FIFO queue, at most MaxBatch running
//     sequences, admission while KV blocks for prompt+max_tokens are
//     available (reserved up front, so there is no preemption) and the step's
//     prefill token budget allows. A newly admitted sequence pays prefill of
//     its uncached tokens (the longest cached prefix of full blocks is free,
//     capped so the last prompt token is always computed) and gets its first
//     token at the end of that step; every later step gives each running
//     sequence one token. See Core for how to drive it from a simulator.
//
// The Server (fasthttp) serves /v1/chat/completions and /v1/completions
// (stream and non-stream, exactly max_tokens deterministic filler tokens,
// usage with cached_tokens), /v1/models, /health, /metrics (Prometheus text),
// /admin/stats (JSON), /admin/fault (GET/POST fault injection) and
// /admin/clear-cache. Answer shaping (answer.go, off by default): with
// --reasoning, chat requests that ask to reason get half their tokens as
// reasoning_content; with --tool-calls, chat requests that offer tools are
// answered with a tool call. With --native-protocols the engine also serves
// /v1/messages, /v1/messages/count_tokens and /v1/responses (native.go),
// converted in-engine with the protocol package as vLLM serves them, with
// its Responses store on: stored Responses (respstore.go) and background
// ones (background.go), retrieved and cancelled by id.
// One scheduler goroutine steps the Core; handlers submit
// and wait for their tokens. A streamed response is a body stream that
// fasthttp pulls from; a failed write (client gone) aborts the sequence and
// frees its blocks.
//
// Prefill-decode disaggregation (pd.go, pdparse.go, pdserve.go): with
// --role prefill|decode and --pd-mode sglang|vllm an engine plays one half
// of a pair and speaks the real engines' request fields: SGLang's
// bootstrap_host/bootstrap_port/bootstrap_room (push: both engines get the
// request; the prefill engine's KV server hands the room's KV to the decode
// engine that joined it) or vLLM's kv_transfer_params (pull: the prefill
// engine answers with them, the decode engine reads the blocks from its
// side channel). The transfer runs over loopback HTTP and takes
// TimeModel.TransferTime; the Core reserves a decode request's blocks before
// it (Transfer, TransferDone) and keeps a prefill's blocks until it is over
// (HoldKV, Release). docs/pd.md is the reference.
//
// The engine knows nothing of the router, discovery or transports; KV event
// publishing is behind KVEventSink (kvevents.go); the Publisher (publisher.go,
// kvwire.go, and zmq.go, the package's only cgo file) emits vLLM's ZMQ wire
// format. It imports nothing of the router.
package engine
