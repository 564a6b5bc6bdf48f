// Package kvroute is the kv-aware routing cost function: given the
// candidates of a request and the prompt's block hashes, it predicts each
// candidate's time to first token from the KV index (radix.Index, fed by KV
// events) and the workers' live load counters, adds what the choice costs
// the rest of the fleet (a prefix duplicated onto a full cache, load beyond
// a bound), and picks the cheapest (sched.KVScorer). It may learn each
// worker's prefill speed from first tokens (KVAware.ObserveFirstToken). It
// must not know about HTTP, transports, how the index is fed, or anything
// about the workload (no trace formats, no session ids): everything it
// knows comes from the index, the load counters and its own observations.
package kvroute
