package proxy

import "github.com/VictoriaMetrics/metrics"

// Bucket upper bounds in seconds: first byte (a cached prefill is
// milliseconds, a long prompt behind a queue is tens of seconds) and whole
// requests (up to long generations).
var (
	latencyBuckets  = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	durationBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800}
)

// Series resolved once; never GetOrCreate on the request path.
var (
	mReqChat       = metrics.NewCounter(`infera_requests_total{endpoint="chat"}`)
	mReqCompletion = metrics.NewCounter(`infera_requests_total{endpoint="completions"}`)
	mReqEmbeddings = metrics.NewCounter(`infera_requests_total{endpoint="embeddings"}`)
	mReqRerank     = metrics.NewCounter(`infera_requests_total{endpoint="rerank"}`)
	mReqScore      = metrics.NewCounter(`infera_requests_total{endpoint="score"}`)
	mResp2xx       = metrics.NewCounter(`infera_responses_total{class="2xx"}`)
	mResp4xx       = metrics.NewCounter(`infera_responses_total{class="4xx"}`)
	mResp5xx       = metrics.NewCounter(`infera_responses_total{class="5xx"}`)
	mRetries       = metrics.NewCounter(`infera_request_retries_total`)
	mUpstreamErr   = metrics.NewCounter(`infera_upstream_errors_total`)
	mTimeouts      = metrics.NewCounter(`infera_upstream_timeouts_total`)
	mMidStreamErr  = metrics.NewCounter(`infera_stream_errors_total{phase="mid_stream"}`)
	mClientGone    = metrics.NewCounter(`infera_stream_client_disconnects_total`)
	mPromptTokens  = metrics.NewCounter(`infera_usage_tokens_total{kind="prompt"}`)
	mOutputTokens  = metrics.NewCounter(`infera_usage_tokens_total{kind="completion"}`)
	mCachedTokens  = metrics.NewCounter(`infera_usage_tokens_total{kind="cached"}`)
	// Prometheus-style (le) buckets, so histogram_quantile works in
	// Prometheus and Grafana.
	mTTFT        = metrics.NewPrometheusHistogramExt(`infera_time_to_first_byte_seconds`, latencyBuckets)
	mDuration    = metrics.NewPrometheusHistogramExt(`infera_request_duration_seconds`, durationBuckets)
	mBadRequests = metrics.NewCounter(`infera_bad_requests_total`)
	// mTokenizeCut counts prompts longer than --router-tokenize-max-bytes.
	mTokenizeCut = metrics.NewCounter(`infera_router_tokenize_cut_total`)
)

func countStatus(code int) {
	switch {
	case code >= 500:
		mResp5xx.Inc()
	case code >= 400:
		mResp4xx.Inc()
	default:
		mResp2xx.Inc()
	}
}

var (
	mUnauthorized      = metrics.NewCounter(`infera_unauthorized_total`)
	mModelNotAllowed   = metrics.NewCounter(`infera_model_not_allowed_total`)
	mBodyBudget        = metrics.NewCounter(`infera_body_budget_rejections_total`)
	mAcceptErrors      = metrics.NewCounter(`infera_accept_errors_total`)
	mConnsRefused      = metrics.NewCounter(`infera_client_connections_refused_total`)
	mLingeringCloses   = metrics.NewCounter(`infera_client_lingering_closes_total`)
	mClientGoneWaiting = metrics.NewCounter(`infera_client_disconnects_waiting_total`)
	mClientErrors      = metrics.NewCounter(`infera_http_client_errors_total`)
	mBodyPanics        = metrics.NewCounter(`infera_response_body_panics_total`)
)
