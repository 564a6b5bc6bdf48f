// Package radix is the router's KV cache index: a sharded concurrent radix
// tree keyed by the router's chained block hashes, each node holding the
// sorted set of (worker, dp rank) members that cache its blocks plus a
// bitset of their workers, so that a match costs one AND per 64 workers per
// node. A worker caches a block when any of its dp ranks does.
//
// A fixed power-of-two array of cache-line-padded shards splits the tree by
// the first block of each chain, so one longest-prefix Match takes one read
// lock and never waits for writers of other shards. Inside a shard the tree
// is single-threaded, path compressed (a node holds a run of blocks cached by
// the same members) and sized by fan-out (children in a small slice, a map
// beyond eight). Because block hashes are chained, a hash identifies its
// whole prefix; a per-shard hash table from hash to (node id, offset)
// locates blocks for stores below an existing parent and for removals. That
// table (loc.go) is an extendible hash of small pointer-free open-addressing
// tables: one probe per stored block, growth rehashes one small table at a
// time under the shard lock, and the GC never scans it.
//
// The package knows nothing about events, engines or scheduling: kv feeds
// it, sched reads it. Workers are the small integers fleet.Worker.Idx.
package radix
