package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/infera/infera/engine"
)

// PDFlags add a prefill-decode disaggregated fleet to `bench simulate` and
// `bench compare`: with --pd P:D each policy also runs on P prefill and D
// decode engines, side by side with the mixed fleet of --engines P+D
// engines on the same workload.
type PDFlags struct {
	PD                   string        `name:"pd" help:"Also run a PD fleet of P prefill and D decode engines (P:D, e.g. 2:6) against the mixed fleet of --engines (which must be P+D)." default:"" env:"INFERA_BENCH_PD"`
	PDMode               string        `name:"pd-mode" help:"KV connector of the PD fleet: sglang (push) or vllm (pull)." default:"sglang" enum:"sglang,vllm" env:"INFERA_BENCH_PD_MODE"`
	PDDecodePolicy       string        `name:"pd-decode-policy" help:"pd.decode_policy of the PD fleet's router." default:"least-requests" enum:"least-requests,least-tokens,round-robin" env:"INFERA_BENCH_PD_DECODE_POLICY"`
	PDIndependentPairing bool          `name:"pd-independent-pairing" help:"pd.sglang_independent_pairing of the PD fleet's router (sglang)." default:"false" env:"INFERA_BENCH_PD_INDEPENDENT_PAIRING"`
	PDTransferBase       time.Duration `name:"pd-transfer-base" help:"Fixed latency of one KV transfer (the engines' --transfer-base)." default:"1ms" env:"INFERA_BENCH_PD_TRANSFER_BASE"`
	PDTransferPerBlock   time.Duration `name:"pd-transfer-per-block" help:"KV transfer time per block (the engines' --transfer-per-block)." default:"40us" env:"INFERA_BENCH_PD_TRANSFER_PER_BLOCK"`
}

// pdFleet parses --pd; ok is false when it is off.
func (f *PDFlags) pdFleet(engines int) (p, d int, ok bool, err error) {
	if f.PD == "" {
		return 0, 0, false, nil
	}
	ps, ds, found := strings.Cut(f.PD, ":")
	p, err1 := strconv.Atoi(ps)
	d, err2 := strconv.Atoi(ds)
	if !found || err1 != nil || err2 != nil || p < 1 || d < 1 {
		return 0, 0, false, fmt.Errorf("--pd %q: want P:D with at least one prefill and one decode engine, e.g. 2:6", f.PD)
	}
	if p+d != engines {
		return 0, 0, false, fmt.Errorf("--pd %s is compared with the mixed fleet of the same size: set --engines %d (it is %d)", f.PD, p+d, engines)
	}
	if f.PDTransferBase < 0 || f.PDTransferPerBlock < 0 {
		return 0, 0, false, fmt.Errorf("--pd-transfer-base and --pd-transfer-per-block must not be negative")
	}
	return p, d, true, nil
}

// Check validates the flags against the mixed fleet's size (call it before
// any run, so a typo fails at once).
func (f *PDFlags) Check(engines int) error {
	_, _, _, err := f.pdFleet(engines)
	return err
}

// checkCompare is Check for bench compare, which also refuses what only
// comparePD would find, after the whole mixed-fleet comparison had run.
func (f *PDFlags) checkCompare(engines int, engineURLs []string) error {
	p, _, ok, err := f.pdFleet(engines)
	switch {
	case err != nil || !ok:
		return err
	case len(engineURLs) > 0:
		return errPDEngineURLs
	case p > 250:
		return errPDTooManyPrefill
	}
	return nil
}

var (
	errPDEngineURLs     = fmt.Errorf("--pd starts its own engines: it cannot be used with --engine-urls")
	errPDTooManyPrefill = fmt.Errorf("--pd: at most 250 prefill engines (one loopback address each)")
)

// pdName names a PD run in the summaries.
func (f *PDFlags) pdName(p, d int, policy string) string {
	return fmt.Sprintf("pd %dP%dD %s %s", p, d, f.PDMode, policy)
}

// simulatePD appends, for each policy, the PD fleet's summary after the
// mixed fleet's (the summaries of sums, in policy order). kvOverlapWeight
// and kvLoadBound are SimConfig's (mapped from the flags), so the prefill
// leg's kv-aware router is the mixed fleet's.
func (f *PDFlags) simulatePD(log io.Writer, sums []Summary, reqs []TraceRequest, policies []string, engines int,
	core engine.CoreConfig, model string, lc LoadConfig, slo SLO, kvOverlapWeight, kvLoadBound float64) ([]Summary, error) {
	p, d, ok, err := f.pdFleet(engines)
	if !ok || err != nil {
		return sums, err
	}
	core.Time.TransferBase, core.Time.TransferPerBlock = f.PDTransferBase, f.PDTransferPerBlock
	out := make([]Summary, 0, 2*len(sums))
	for i, pol := range policies {
		r, err := SimulatePD(reqs, PDSimConfig{Prefill: p, Decode: d, Mode: f.PDMode, Core: core, Policy: pol,
			DecodePolicy: f.PDDecodePolicy, IndependentPairing: f.PDIndependentPairing, Model: model, Load: lc,
			KVOverlapWeight: kvOverlapWeight, KVLoadBound: kvLoadBound})
		if err != nil {
			return sums, fmt.Errorf("PD fleet, policy %s: %w", pol, err)
		}
		name := f.pdName(p, d, pol)
		fmt.Fprintf(log, "simulated %s: %d requests, %.1fs virtual in %.2fs real; prefill decisions by layer %v\n",
			name, len(r.Run.Results), r.Virtual.Seconds(), r.Real.Seconds(), r.Layers)
		s := Summarize(name, r.Run.Results, r.Run.ITLs, r.Run.Wall, slo, d)
		s.Layers = r.Layers
		if i < len(sums) {
			out = append(out, sums[i])
		}
		out = append(out, s)
	}
	return out, nil
}
