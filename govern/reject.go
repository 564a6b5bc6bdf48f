package govern

import "unicode/utf8"

// Code names the limit that refused a request. Its String is the `code` of
// the OpenAI-shaped error body and the `rule` label of the hit metrics.
type Code uint8

// Codes. The quota codes are laid out period by period (see quotaCode).
const (
	CodeNone Code = iota
	CodeInvalidKey
	CodeUserDisabled
	CodeOutsidePeriod
	CodeQuotaRequests5h
	CodeQuotaRequestsDay
	CodeQuotaRequestsWeek
	CodeQuotaRequestsMonth
	CodeQuotaTokens5h
	CodeQuotaTokensDay
	CodeQuotaTokensWeek
	CodeQuotaTokensMonth
	CodeRPM
	CodeTPM
	CodeConcurrencyUser
	CodeConcurrencyOverall
	CodeConcurrencyPrefill
	CodeConcurrencyDecode
	CodeStateUnavailable
	CodeModelNotAllowed
	numCodes
)

var codeNames = [numCodes]string{
	CodeNone:               "",
	CodeInvalidKey:         "invalid_api_key",
	CodeUserDisabled:       "user_disabled",
	CodeOutsidePeriod:      "outside_allowed_period",
	CodeQuotaRequests5h:    "quota_requests_5h",
	CodeQuotaRequestsDay:   "quota_requests_day",
	CodeQuotaRequestsWeek:  "quota_requests_week",
	CodeQuotaRequestsMonth: "quota_requests_month",
	CodeQuotaTokens5h:      "quota_tokens_5h",
	CodeQuotaTokensDay:     "quota_tokens_day",
	CodeQuotaTokensWeek:    "quota_tokens_week",
	CodeQuotaTokensMonth:   "quota_tokens_month",
	CodeRPM:                "rate_limit_rpm",
	CodeTPM:                "rate_limit_tpm",
	CodeConcurrencyUser:    "concurrency_user",
	CodeConcurrencyOverall: "concurrency_overall",
	CodeConcurrencyPrefill: "concurrency_prefill",
	CodeConcurrencyDecode:  "concurrency_decode",
	CodeStateUnavailable:   "state_unavailable",
	CodeModelNotAllowed:    "model_not_allowed",
}

func (c Code) String() string {
	if c < numCodes {
		return codeNames[c]
	}
	return "unknown"
}

func quotaRequestsCode(p period) Code { return CodeQuotaRequests5h + Code(p) }
func quotaTokensCode(p period) Code   { return CodeQuotaTokens5h + Code(p) }

// Status is the HTTP status a rejection with this code answers.
func (c Code) Status() int {
	switch c {
	case CodeInvalidKey:
		return 401
	case CodeUserDisabled, CodeOutsidePeriod, CodeModelNotAllowed:
		return 403
	case CodeStateUnavailable:
		return 503
	}
	return 429
}

// Type is the OpenAI error type of the code.
func (c Code) Type() string {
	switch c {
	case CodeInvalidKey:
		return "authentication_error"
	case CodeUserDisabled, CodeOutsidePeriod, CodeModelNotAllowed:
		return "permission_error"
	case CodeStateUnavailable:
		return "service_unavailable"
	}
	return "rate_limit_error"
}

// Rejection is a refused request: the proxy answers Status with an
// OpenAI-shaped error {"error":{"message":Message,"type":Type(),
// "param":null,"code":Code.String()}} and, when RetryAfter > 0, a
// Retry-After: RetryAfter header. Message never contains a key.
type Rejection struct {
	Code    Code
	Status  int
	Message string
	// RetryAfter is whole seconds until the limit may pass again (rounded
	// up); 0 when no time is known (concurrency, unknown key).
	RetryAfter int
	// RetryAfterMS is the same time in milliseconds (rounded up).
	RetryAfterMS int64
	// Limits is the user's rate limits when the refusal is the user's
	// (zero for a shared rejection, a seat's refusal or a dry run).
	Limits Limits
}

func (r *Rejection) Error() string { return r.Code.String() + ": " + r.Message }

// Type is the OpenAI error type.
func (r *Rejection) Type() string { return r.Code.Type() }

// AppendBody appends the OpenAI-shaped error body to dst.
func (r *Rejection) AppendBody(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, r.Message)
	dst = append(dst, `,"type":"`...)
	dst = append(dst, r.Type()...)
	dst = append(dst, `","param":null,"code":"`...)
	dst = append(dst, r.Code.String()...)
	dst = append(dst, `"}}`...)
	return dst
}

var codeMessages = [numCodes]string{
	CodeInvalidKey:         "invalid or missing API key",
	CodeUserDisabled:       "this API key's user is disabled",
	CodeQuotaRequests5h:    "request quota of the 5-hour window exhausted",
	CodeQuotaRequestsDay:   "daily request quota exhausted",
	CodeQuotaRequestsWeek:  "weekly request quota exhausted",
	CodeQuotaRequestsMonth: "monthly request quota exhausted",
	CodeQuotaTokens5h:      "token quota of the 5-hour window exhausted",
	CodeQuotaTokensDay:     "daily token quota exhausted",
	CodeQuotaTokensWeek:    "weekly token quota exhausted",
	CodeQuotaTokensMonth:   "monthly token quota exhausted",
	CodeRPM:                "requests per minute limit reached",
	CodeTPM:                "tokens per minute limit reached",
	CodeConcurrencyUser:    "too many concurrent requests for this user",
	CodeConcurrencyOverall: "the engines' concurrency limit is reached",
	CodeConcurrencyPrefill: "the engines' prefill concurrency limit is reached",
	CodeConcurrencyDecode:  "the engines' decode concurrency limit is reached",
	CodeStateUnavailable:   "the rate limiting state store is unavailable",
	CodeModelNotAllowed:    "this API key's user may no longer call this model",
}

// Static rejections without a retry time, shared (never mutate them).
var (
	rejInvalidKey   = &Rejection{Code: CodeInvalidKey, Status: 401, Message: codeMessages[CodeInvalidKey]}
	rejUserDisabled = &Rejection{Code: CodeUserDisabled, Status: 403, Message: codeMessages[CodeUserDisabled]}
	rejModelGone    = &Rejection{Code: CodeModelNotAllowed, Status: 403, Message: codeMessages[CodeModelNotAllowed]}
	rejUserGone     = &Rejection{Code: CodeInvalidKey, Status: 401, Message: "this API key's user was removed"}
)

func reject(c Code, retryNanos int64, queued bool) *Rejection {
	msg := codeMessages[c]
	if queued {
		msg += " (queue full or timed out)"
	}
	return &Rejection{Code: c, Status: c.Status(), Message: msg, RetryAfter: retrySeconds(retryNanos), RetryAfterMS: retryMillis(retryNanos)}
}

func retryMillis(ns int64) int64 {
	if ns <= 0 {
		return 0
	}
	return (ns + 1e6 - 1) / 1e6
}

func retrySeconds(ns int64) int {
	if ns <= 0 {
		return 0
	}
	s := (ns + 1e9 - 1) / 1e9
	if s > 1<<31-1 {
		s = 1<<31 - 1
	}
	return int(s)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}
