package protocol

import (
	"strconv"
	"unsafe"

	"github.com/infera/infera/internal/jsonscan"
)

// API names a client-facing protocol.
type API uint8

const (
	// Chat is OpenAI chat completions (/v1/chat/completions), the protocol
	// engines speak and every conversion targets.
	Chat API = iota
	// Anthropic is the Anthropic Messages API (/v1/messages).
	Anthropic
	// Responses is the OpenAI Responses API (/v1/responses).
	Responses
)

func (a API) String() string {
	switch a {
	case Anthropic:
		return "anthropic"
	case Responses:
		return "responses"
	}
	return "chat"
}

// OpenAI error types (the "type" of an OpenAI error object). Error.Type
// holds one of these; AppendError maps them to Anthropic's vocabulary.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
	TypeTimeout        = "timeout_error"
)

// Error is a conversion error: what the client sent cannot be converted.
// The proxy answers it with Status in the client protocol's error shape
// (AppendError). Messages never quote request bytes beyond a field name or
// a short type name the client chose.
type Error struct {
	Status  int    // HTTP status, 400 unless said otherwise
	Type    string // OpenAI error type (TypeInvalidRequest, ...)
	Param   string // the offending request field, "" when none
	Message string
	// Code is a machine-readable code clients act on ("" for none):
	// Anthropic's error.details.error_code, OpenAI's error.code.
	Code string
}

func (e *Error) Error() string { return e.Message }

func badRequest(param, msg string) *Error {
	return &Error{Status: 400, Type: TypeInvalidRequest, Param: param, Message: msg}
}

var (
	errMalformedBody = badRequest("", "malformed JSON in request body")
	errNotObject     = badRequest("", "request body must be a JSON object")
)

// jsonErr turns a walker error into the request error; Errors pass through.
func jsonErr(err error) *Error {
	if e, ok := err.(*Error); ok {
		return e
	}
	return errMalformedBody
}

// AnthropicErrorType is Anthropic's error type for an HTTP status.
func AnthropicErrorType(status int) string {
	switch status {
	case 400, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 402:
		return "billing_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 409:
		return "conflict_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	case 504:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// AppendError appends an error body in api's shape:
//
//	Anthropic: {"type":"error","error":{"type":"invalid_request_error","message":"..."}}
//	Responses, Chat: {"error":{"message":"...","type":"...","param":...,"code":...}}
//
// typ is an OpenAI error type; for Anthropic the type follows from status.
// The HTTP status of the answer is status.
func AppendError(dst []byte, api API, status int, typ, param, msg string) []byte {
	if api == Anthropic {
		dst = append(dst, `{"type":"error","error":{"type":"`...)
		dst = append(dst, AnthropicErrorType(status)...)
		dst = append(dst, `","message":`...)
		dst = appendStr(dst, msg)
		return append(dst, "}}"...)
	}
	if typ == "" {
		typ = openAIErrorType(status)
	}
	dst = append(dst, `{"error":{"message":`...)
	dst = appendStr(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = appendStr(dst, typ)
	dst = append(dst, `,"param":`...)
	dst = appendNullable(dst, param)
	dst = append(dst, `,"code":null}}`...)
	return dst
}

// Append appends e in api's error shape (see AppendError), with its Code
// when it has one.
func (e *Error) Append(dst []byte, api API) []byte {
	b := AppendError(dst, api, e.Status, e.Type, e.Param, e.Message)
	if e.Code == "" {
		return b
	}
	if api == Anthropic { // ...,"message":"..."}} → ...,"details":{"error_code":"..."}}}
		b = append(b[:len(b)-2], `,"details":{"error_code":`...)
		b = appendStr(b, e.Code)
		return append(b, "}}}"...)
	}
	b = b[:len(b)-len(`"code":null}}`)] // ...,"code":null}} → ...,"code":"..."}}
	b = append(b, `"code":`...)
	b = appendStr(b, e.Code)
	return append(b, "}}"...)
}

// errThreadUnsupported refuses an Anthropic message thread (the request's
// thread field): the gateway holds no conversation, and a continued
// thread carries only its new messages. The SDKs (toolRunner, thread())
// take this code for "send the whole conversation without thread".
var errThreadUnsupported = &Error{Status: 400, Type: TypeInvalidRequest, Param: "thread", Code: "thread_unsupported_request",
	Message: "message threads are not supported here: send the whole conversation without thread"}

func appendNullable(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return appendStr(dst, s)
}

func openAIErrorType(status int) string {
	switch {
	case status == 401:
		return TypeAuthentication
	case status == 403:
		return TypePermission
	case status == 404:
		return TypeNotFound
	case status == 429:
		return TypeRateLimit
	case status == 503:
		return TypeUnavailable
	case status == 504:
		return TypeTimeout
	case status >= 500:
		return TypeServer
	}
	return TypeInvalidRequest
}

// ConvertError appends the client-protocol error body for an engine's error
// answer (status >= 400, body as the engine sent it). It reads the message,
// type and param of an OpenAI-shaped error ({"error":{...}}, or vLLM's flat
// {"object":"error","message":...}); a body it cannot read becomes a
// generic "upstream answered HTTP <status>". For Chat and Responses a
// readable OpenAI error is re-encoded as is (same shape on both).
func ConvertError(dst []byte, api API, status int, body []byte) []byte {
	var msg, typ, param []byte
	read := func(obj []byte) {
		fields(obj, func(k []byte, vs, ve int) error {
			v := obj[vs:ve]
			switch string(k) {
			case "message":
				if raw, ok := rawStr(v); ok {
					msg = raw
				}
			case "type":
				if raw, ok := rawStr(v); ok {
					typ = raw
				}
			case "param":
				if raw, ok := rawStr(v); ok {
					param = raw
				}
			}
			return nil
		})
	}
	i := skipSpace(body, 0)
	if end, err := skipValue(body, i, 0); err == nil && skipSpace(body, end) == len(body) && body[i] == '{' {
		obj := body[i:end]
		flat := false
		fields(obj, func(k []byte, vs, ve int) error {
			switch string(k) {
			case "error":
				if obj[vs] == '{' {
					read(obj[vs:ve])
				} else if raw, ok := rawStr(obj[vs:ve]); ok && msg == nil {
					msg = raw // {"error":"text"}
				}
			case "object":
				flat = strIs(obj[vs:ve], "error")
			case "detail": // FastAPI's {"detail": "..."}
				if raw, ok := rawStr(obj[vs:ve]); ok && msg == nil {
					msg = raw
				}
			}
			return nil
		})
		if flat {
			read(obj)
		}
	}
	if msg == nil {
		msg = append(make([]byte, 0, 32), "upstream answered HTTP "...)
		msg = strconv.AppendInt(msg, int64(status), 10)
		typ = nil
	}
	if api == Anthropic {
		dst = append(dst, `{"type":"error","error":{"type":"`...)
		dst = append(dst, AnthropicErrorType(status)...)
		dst = append(dst, `","message":"`...)
		dst = append(dst, msg...) // a validated raw string body, or plain ASCII
		return append(dst, `"}}`...)
	}
	dst = append(dst, `{"error":{"message":"`...)
	dst = append(dst, msg...)
	dst = append(dst, `","type":`...)
	if typ != nil {
		dst = append(dst, '"')
		dst = append(dst, typ...)
		dst = append(dst, '"')
	} else {
		dst = appendStr(dst, openAIErrorType(status))
	}
	dst = append(dst, `,"param":`...)
	if param != nil {
		dst = append(dst, '"')
		dst = append(dst, param...)
		dst = append(dst, '"')
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, `,"code":null}}`...)
}

// bytesString views b as a string without copying; b must not change while
// the string is in use.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// AppendResponseNotFound appends vLLM's answer to a Responses id it does
// not hold (serving_responses.py, _make_not_found_error), for a follow-up's
// previous_response_id and for a retrieve or cancel of the id alike.
func AppendResponseNotFound(dst, id []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = jsonscan.AppendString(dst, "Response with id '"+string(id)+"' not found.")
	return append(dst, `,"type":"invalid_request_error","param":"response_id","code":404}}`...)
}
