// Package classify is smart model selection's classifier: the HTTP contract
// between the router and a classification service, the client the request
// path calls (Client.Classify: a tier per request, a fallback tier on any
// failure, bounded by a timeout, skipped while the classifier's breaker is
// open: breaker.go), and a reference classifier server (Cmd,
// mounted as `infera classify`: a heuristic on prompt length and keywords)
// so that the feature works out of the box and in tests.
//
// The contract (docs/upstreams.md has the reference):
//
//	POST <smart_model_selection.classifier_url>
//	Content-Type: application/json
//	Authorization: Bearer <classifier_api_key>      (when configured)
//
//	{"model": "<the request's model>", "text": "<conversation text>", "text_bytes": <full length>}
//
//	200 {"tier": "L1" | "L2" | "L3"}                 (other fields ignored)
//
// text is the request's prompt text (a completion prompt, or the chat
// messages' text contents joined with '\n'), cut to its last
// max_text_bytes bytes at a UTF-8 boundary; text_bytes is the length before
// the cut. Any other answer (a status other than 200, a body that is not
// such an object, an unknown tier), a network error or the timeout gives
// the fallback tier.
//
// The package knows nothing of the proxy: it gets the model and the text,
// and returns a tier and the tier's model.
package classify
