// Package bench is `infera bench`: workload generation and replay, the
// client-side load generator, result summaries, policy comparison against
// real processes, a discrete-event fleet simulator and the proxy-overhead
// benchmark.
//
// It owns:
//   - workloads: the Mooncake JSONL trace format (trace.go), deterministic
//     prompt content from block hash ids (prompt.go) and synthetic workload
//     generators (gen.go);
//   - the load generator (load.go, client.go): open-loop (trace timestamps or
//     Poisson) and closed-loop arrivals over a fasthttp client that measures
//     TTFT, inter-token latency, TPOT and E2E from the client side;
//   - summaries (summary.go): percentiles, goodput under an SLO, prefix cache
//     hit rate and load imbalance, as a text table and JSON;
//   - compare mode (compare.go, procs.go, chart.go): N engines and one router
//     per policy as child processes, the same workload against each;
//   - the simulator (sim.go, simkv.go): the engine's clock-free model and the router's
//     own sched code driven by virtual time;
//   - the proxy benchmark (proxybench.go): direct vs infera vs nginx.
//
// It must not know router or engine internals beyond their exported APIs:
// it talks to `infera serve` and `infera engine` over HTTP, and the simulator
// only calls sched.Scheduler.Pick, fleet.Worker load accounting and the
// engine package's exported clock-free types.
package bench
