// Package mirror is traffic mirroring: it copies a sampled share of live
// requests to a target address (config.Mirror) for canary validation and
// performance comparison, without ever slowing or failing the real request.
//
// The request path calls Mirror.Offer with the config snapshot it already
// holds, the request's path and body, and its stream flag. Offer decides
// sampling with one random draw (no allocation when the request is not
// sampled); a sampled request's path and body are copied once into a
// pooled job and put on a bounded queue, or dropped and counted when the
// queue is full. A pool of sender goroutines (grown by Offer when jobs
// wait, up to mirror.concurrency) takes the queued jobs, at most
// mirror.concurrency in flight; a job older than mirror.timeout_ms
// (queueing included) is dropped, and a request in flight at that point is
// cancelled (its connection closed).
//
// The mirrored request is built from nothing the client sent but the path
// and the body: its headers come from a fixed list (Content-Type, Accept,
// User-Agent, X-Infera-Mirror, and Authorization carrying mirror.auth_token
// when set), so no client credential, cookie, session or other identifying
// header can reach the target. A non-empty mirror.target_model replaces the
// body's top-level "model" value. Requests go out over HTTP/1.1 through one
// fasthttp.HostClient per target address (client.go; redirects are never
// followed, no proxy is used). The answer, streamed or not, is read to its
// end in pooled buffers, and its usage is taken by a byte scan (usage.go);
// with mirror.log_recording each mirrored request gives one structured log
// line (status, latency, time to first event, token counts from the
// answer's usage) to compare the target with production.
//
// The package knows nothing of the proxy or the scheduler.
package mirror
