package proxy

import (
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
)

// selectModel applies smart model selection to a parsed request: when it
// applies to the request's model (classify.Applies), the classifier's tier
// (or the fallback tier, on any failure or after timeout_ms) names the
// model the request is routed and forwarded as. It runs before model
// routing and the split proxy, so the tier's model may be served locally or
// by an external upstream. The tier is returned in X-Infera-Tier with the
// decision header on, on every answer (answered), an error too; classify
// counts it
// (infera_smart_selection_total{tier,source}). It reports whether the
// classifier was asked.
func (s *Server) selectModel(cfg *config.Config, rs *reqState) bool {
	sm := &cfg.SmartModelSelection
	r := &rs.sreq
	if !classify.Applies(sm, r.Model) {
		return false
	}
	res := s.classifier.Classify(sm, r.Model, rs.parsed.text)
	rs.ext.tier, rs.ext.tierHeader, rs.ext.tierFallback = res.Tier, cfg.Debug.DecisionHeader, res.Fallback()
	if res.Model == "" {
		return true
	}
	rs.ext.model = res.Model
	rs.ext.modelBuf = append(rs.ext.modelBuf[:0], res.Model...)
	r.Model = rs.ext.modelBuf
	return true
}
