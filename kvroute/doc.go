// Package kvroute is the kv-aware routing cost function: given the
// candidates of a request and the prompt's block hashes, it predicts what
// serving the request on each candidate costs from the KV index
// (radix.Index, fed by KV events) and the workers' live load, and picks
// one (sched.KVScorer). It must not know about HTTP, transports or how the
// index is fed.
package kvroute
