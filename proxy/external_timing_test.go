package proxy

import (
	"testing"

	"github.com/infera/infera/config"
)

// BenchmarkProxySplitExternal is BenchmarkProxyNonStream with the request
// sent to a split proxy's external upstream instead of a fleet worker: the
// plan, the standalone worker's lease, the external header block, the same
// transport.
func BenchmarkProxySplitExternal(b *testing.B) {
	ext := startUpstream(b, okHandler)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true, ModelRules: []string{"none"}},
		config.Proxy{Name: "ext", Address: ext.url + "/v1", APIKey: config.NewSecret("sk-1"), ModelRules: []string{"m"}},
	)
	r := startRouterWith(b, nil, cfg, nil, deadURL(b))
	benchNonStream(b, r.url)
}

// BenchmarkProxySplitLocal is the split proxy's local entry: the plan, then
// the local path as without the split proxy.
func BenchmarkProxySplitLocal(b *testing.B) {
	up := startUpstream(b, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "ext", Address: deadURL(b), Failover: true},
	)
	r := startRouterWith(b, nil, cfg, nil, up.url)
	benchNonStream(b, r.url)
}
