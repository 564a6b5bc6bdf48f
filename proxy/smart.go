package proxy

import (
	"slices"

	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/sched"
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
//
// A Responses follow-up kept on the local engine holding its previous
// response (pinnedLocal) goes as the tier whose model that engine serves
// (keptTier), without asking the classifier: another tier's model is
// served by other engines, which cannot know the response (404).
func (s *Server) selectModel(cfg *config.Config, rs *reqState) bool {
	sm := &cfg.SmartModelSelection
	r := &rs.sreq
	if !classify.Applies(sm, r.Model) {
		return false
	}
	var res classify.Result
	asked := false
	if t := s.keptTier(sm, r); t != classify.TierUnknown {
		res = classify.Kept(sm, t)
	} else {
		res, asked = s.classifier.Classify(sm, r.Model, rs.parsed.text), true
	}
	rs.ext.tier, rs.ext.tierHeader, rs.ext.tierSource = res.Tier, cfg.Debug.DecisionHeader, res.Source
	if res.Model == "" {
		return asked
	}
	rs.ext.model = res.Model
	rs.ext.modelBuf = append(rs.ext.modelBuf[:0], res.Model...)
	r.Model = rs.ext.modelBuf
	return asked
}

// keptTier is the tier of a Responses follow-up kept on the local engine
// holding its previous response (pinnedLocal): the highest tier whose
// model that engine serves (by its exact name, as the scheduler matches
// it). TierUnknown for any other request, or when the engine serves no
// tier's model: the classifier decides.
func (s *Server) keptTier(sm *config.SmartModelSelection, r *sched.Request) classify.Tier {
	if r.Prefer.ID == "" {
		return classify.TierUnknown
	}
	w := s.sched.Fleet.Get(r.Prefer.ID)
	if w == nil || !r.Prefer.Is(w) { // as pinnedLocal
		return classify.TierUnknown
	}
	for _, t := range [...]classify.Tier{classify.TierL3, classify.TierL2, classify.TierL1} {
		if m := sm.Tiers.Model(t.String()); m != "" && slices.Contains(w.Models, m) {
			return t
		}
	}
	return classify.TierUnknown
}
