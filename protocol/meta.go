package protocol

import (
	"math/rand/v2"
	"time"
)

// Meta is what request conversion learns and response conversion needs:
// the client protocol, the model the client named, the stream flag, stop
// sequences, and (Responses) the request settings a Response object echoes.
// It owns copies of everything it keeps, so it outlives the request body.
// Reuse one per request (Reset); a zero Meta is ready to use.
type Meta struct {
	API API
	// Stream is the client's stream flag.
	Stream bool
	// Model is the model the client named (decoded). Answers echo it.
	Model []byte
	// MaxTokens is the client's output limit, -1 when it gave none.
	MaxTokens int64
	// PromptTokens may be set by the caller after tokenizing the converted
	// chat: Anthropic's message_start reports it as input_tokens (the
	// engine's own count arrives with the final message_delta). 0: unknown.
	PromptTokens int
	// ContinueFinal: the converted chat continues its final message (an
	// assistant prefill; the chat asks for continue_final_message), so its
	// prompt ends with that message's content, not a generation prompt
	// (tokenizer.ContinueFinalMessage).
	ContinueFinal bool
	// ID is the answer's id (msg_... or resp_...), Created its Unix time.
	ID      []byte
	Created int64
	// PrevResponseID and Stored are what a Response object echoes as
	// previous_response_id (decoded; empty: null) and store, for an
	// answerer that stores responses (the engine: the request's, store
	// defaulting to true, as vLLM echoes them), set by it after the
	// conversion. The conversion itself stores nothing and refuses a
	// previous_response_id: left alone they echo null and false.
	PrevResponseID []byte
	Stored         bool
	// Background is what a Response object echoes as background: true
	// for a background Response (the engine's, set by it as Stored), false
	// otherwise.
	Background bool

	// stops holds the decoded stop sequences back to back; stopEnds their
	// end offsets.
	stops    []byte
	stopEnds []int
	// echo holds raw JSON values of request settings (Responses), spans
	// indexed by echoField.
	echo      []byte
	echoSpans [nEcho][2]int32
}

// Responses settings echoed in the Response object.
type echoField uint8

const (
	echoInstructions echoField = iota
	echoMaxOutputTokens
	echoMetadata
	echoParallelToolCalls
	echoReasoning
	echoTemperature
	echoText
	echoToolChoice
	echoTools
	echoTopP
	echoUser
	echoTruncation
	nEcho
)

// Reset clears m for another request, keeping its buffers (up to 256 KiB
// each).
func (m *Meta) Reset() {
	// Zeroed in place, then its buffers put back: a composite literal
	// naming them would be built on the stack and copied over m.
	model, id, prev, stops, stopEnds := m.Model[:0], m.ID[:0], reuse(m.PrevResponseID), reuse(m.stops), m.stopEnds[:0]
	echo := reuse(m.echo) // echoed tools can be large
	*m = Meta{}
	m.Model, m.ID, m.PrevResponseID, m.stops, m.stopEnds, m.echo = model, id, prev, stops, stopEnds, echo
	m.MaxTokens = -1
}

func (m *Meta) start(api API, prefix string) {
	m.Reset()
	m.API = api
	m.ID = appendID(m.ID, prefix)
	m.Created = time.Now().Unix()
}

// idSource yields the randomness of ids (tests make it deterministic).
var idSource = rand.Uint64

const idChars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// appendID appends prefix and 24 random base62 characters.
func appendID(dst []byte, prefix string) []byte {
	dst = append(dst, prefix...)
	for k := 0; k < 24; k += 8 {
		x := idSource() // 8 base62 digits use 48 of its bits
		for j := 0; j < 8; j++ {
			dst = append(dst, idChars[x%62])
			x /= 62
		}
	}
	return dst
}

func (m *Meta) addStop(raw []byte) {
	m.stops = unescape(m.stops, raw)
	m.stopEnds = append(m.stopEnds, len(m.stops))
}

// isStop reports whether s (decoded) is one of the request's stop sequences.
func (m *Meta) isStop(s []byte) bool {
	start := 0
	for _, e := range m.stopEnds {
		if string(m.stops[start:e]) == string(s) {
			return true
		}
		start = e
	}
	return false
}

// EchoSize is the bytes m holds copied from the request for the answer to
// echo (a Response's tools, metadata, instructions: up to the body's
// size), for the caller's memory accounting.
func (m *Meta) EchoSize() int { return len(m.echo) }

func (m *Meta) setEcho(f echoField, v []byte) {
	s := len(m.echo)
	m.echo = compactJSON(m.echo, v) // raw newlines would break SSE data lines
	m.echoSpans[f] = [2]int32{int32(s), int32(len(m.echo))}
}

// setEchoObj is setEcho for an object whose keys the API always answers
// with: a key in defs that v lacks is added with its default value
// ({"verbosity":"low"} is echoed as {"verbosity":"low","format":{"type":"text"}}).
func (m *Meta) setEchoObj(f echoField, v []byte, defs ...[2]string) {
	s := len(m.echo)
	m.echo = compactJSON(m.echo, v)
	for _, d := range defs {
		found := false
		fields(v, func(k []byte, _, _ int) error {
			if string(k) == d[0] {
				found = true
			}
			return nil
		})
		if found || len(m.echo) == s || m.echo[len(m.echo)-1] != '}' {
			continue
		}
		m.echo = m.echo[:len(m.echo)-1]
		if m.echo[len(m.echo)-1] != '{' {
			m.echo = append(m.echo, ',')
		}
		m.echo = append(m.echo, '"')
		m.echo = append(m.echo, d[0]...)
		m.echo = append(m.echo, `":`...)
		m.echo = append(m.echo, d[1]...)
		m.echo = append(m.echo, '}')
	}
	m.echoSpans[f] = [2]int32{int32(s), int32(len(m.echo))}
}

// appendEcho appends the echoed raw value of f, or def when the request
// did not set it.
func (m *Meta) appendEcho(dst []byte, f echoField, def string) []byte {
	sp := m.echoSpans[f]
	if sp[1] <= sp[0] {
		return append(dst, def...)
	}
	return append(dst, m.echo[sp[0]:sp[1]]...)
}
