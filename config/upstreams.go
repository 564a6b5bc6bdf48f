package config

// Sections that send traffic somewhere other than a local engine: split
// proxy, traffic mirroring, global scheduling, smart model selection.

// SplitProxy forwards a share of requests to external upstream APIs.
type SplitProxy struct{}

// Mirror copies sampled requests to a target address.
type Mirror struct{}

// GlobalScheduling forwards requests to other regions when the local fleet
// is saturated.
type GlobalScheduling struct{}

// SmartModelSelection picks an L1/L2/L3 tier model per request.
type SmartModelSelection struct{}

// validateUpstreams validates the four sections and their interplay.
func (c *Config) validateUpstreams() error { return nil }
