package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/logx"
)

// Result is what the client measured for one request. Durations are from the
// moment the request was sent.
type Result struct {
	// Index is the request's position in the workload.
	Index int `json:"index"`
	// Start is the send time relative to the run start.
	Start time.Duration `json:"start_ns"`
	// TTFT is the time to the first content token (to the whole response for
	// non-streaming requests).
	TTFT time.Duration `json:"ttft_ns"`
	// E2E is the time to the last byte.
	E2E time.Duration `json:"e2e_ns"`
	// ITLSum, ITLMax and ITLCount summarise the gaps between successive
	// content chunks (inter-token latency).
	ITLSum   time.Duration `json:"-"`
	ITLMax   time.Duration `json:"itl_max_ns"`
	ITLCount int           `json:"-"`
	// OutputTokens is usage.completion_tokens, or the number of content
	// chunks when the server sent no usage.
	OutputTokens int `json:"output_tokens"`
	// PromptTokens and CachedTokens come from usage (prompt_tokens,
	// prompt_tokens_details.cached_tokens).
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	// Status is the HTTP status (0 on transport errors).
	Status int    `json:"status"`
	Err    string `json:"err,omitempty"`
	// Worker is X-Infera-Worker (or X-Infera-Engine-Id when talking to an
	// engine directly).
	Worker string `json:"worker,omitempty"`
	// Whole marks an answer read whole (not streamed): its TTFT is its
	// E2E, and it has no TPOT or ITL.
	Whole bool `json:"whole,omitempty"`
}

// OK reports whether the request succeeded.
func (r *Result) OK() bool { return r.Err == "" && r.Status == 200 }

// TPOT is the mean time per output token after the first (0 when not
// known: one token, or an answer read whole).
func (r *Result) TPOT() time.Duration {
	if r.OutputTokens <= 1 || r.Whole {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}

// Client sends OpenAI requests to one base URL over fasthttp and measures
// them. It is safe for concurrent use.
type Client struct {
	hc   *fasthttp.HostClient
	host string
	// prefix is the base URL's path, before every request's path (a
	// trailing /v1 dropped: the request's path has it).
	prefix string
	// Timeout bounds one request end to end (0: none).
	Timeout time.Duration
	// ITLs, when non-nil, receives every inter-token gap (guarded by mu).
	mu   sync.Mutex
	itls []time.Duration
	keep bool
	// auth is the Authorization header sent with every request (empty:
	// none); see SetAPIKey.
	auth []byte
}

// NewClient returns a client for baseURL (http(s)://host[:port][/path]) allowing
// maxConns concurrent connections. keepITLs records every inter-token gap
// for distribution summaries.
func NewClient(baseURL string, maxConns int, keepITLs bool) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("target %q must be http(s)://host[:port][/path]", logx.RedactURL(baseURL))
	}
	if u.User != nil {
		// Credentials in the URL were never sent, and the URL is printed
		// (progress, table, JSON): the key goes in --api-key.
		return nil, fmt.Errorf("target %q must be http(s)://host[:port][/path] without credentials: give the API key with --api-key", logx.RedactURL(baseURL))
	}
	tls := u.Scheme == "https"
	addr := u.Host
	if u.Port() == "" {
		if tls {
			addr = net.JoinHostPort(u.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	// A base path is put before every request's path; a trailing /v1 is
	// shared with the request's (https://host/v1 and https://host are the
	// same target), as OpenAI clients take base URLs.
	prefix := strings.TrimSuffix(u.EscapedPath(), "/")
	prefix = strings.TrimSuffix(prefix, "/v1")
	if maxConns <= 0 {
		maxConns = 512
	}
	hc := &fasthttp.HostClient{
		Addr:                          addr,
		IsTLS:                         tls,
		MaxConns:                      maxConns,
		StreamResponseBody:            true,
		ReadTimeout:                   0,
		MaxConnWaitTimeout:            30 * time.Second,
		MaxIdleConnDuration:           30 * time.Second,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: true,
		NoDefaultUserAgentHeader:      true,
		ReadBufferSize:                16 << 10,
		WriteBufferSize:               64 << 10,
	}
	return &Client{hc: hc, host: u.Host, prefix: prefix, keep: keepITLs}, nil
}

// SetAPIKey makes every request carry "Authorization: Bearer key" (as
// OpenAI clients send it; an empty key sends none). Set it before use.
func (c *Client) SetAPIKey(key string) {
	c.auth = nil
	if key != "" {
		c.auth = []byte("Bearer " + key)
	}
}

// CloseIdle closes idle connections.
func (c *Client) CloseIdle() { c.hc.CloseIdleConnections() }

// TakeITLs returns and clears the recorded inter-token gaps.
func (c *Client) TakeITLs() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.itls
	c.itls = nil
	return v
}

// sseState is per-goroutine scratch for reading responses.
type sseState struct {
	br   *bufio.Reader
	itls []time.Duration
}

var ssePool = sync.Pool{New: func() any { return &sseState{br: bufio.NewReaderSize(nil, 32<<10)} }}

var (
	hdrWorker = []byte("X-Infera-Worker")
	hdrEngine = []byte("X-Infera-Engine-Id")
)

// Do sends one POST of body to path and fills res (Status, TTFT, E2E, token
// counts, usage, worker). stream tells whether the body asks for SSE.
func (c *Client) Do(path string, body []byte, stream bool, res *Result) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(c.prefix + path)
	req.Header.SetHost(c.host)
	if c.hc.IsTLS {
		u := req.URI() // parsed now: its host is the one sent
		u.SetScheme("https")
		u.SetHost(c.host)
	}
	req.Header.SetContentType("application/json")
	if len(c.auth) > 0 {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, c.auth)
	}
	req.SetBodyRaw(body)

	start := time.Now()
	var err error
	if c.Timeout > 0 {
		err = c.hc.DoTimeout(req, resp, c.Timeout)
	} else {
		err = c.hc.Do(req, resp)
	}
	if err != nil {
		res.Err = err.Error()
		res.E2E = time.Since(start)
		return
	}
	res.Status = resp.StatusCode()
	if v := resp.Header.PeekBytes(hdrWorker); len(v) > 0 {
		res.Worker = string(v)
	} else if v := resp.Header.PeekBytes(hdrEngine); len(v) > 0 {
		res.Worker = string(v)
	}
	st := ssePool.Get().(*sseState)
	defer ssePool.Put(st)
	var r io.Reader
	if bs := resp.BodyStream(); bs != nil {
		r = bs
	} else {
		r = bytes.NewReader(resp.Body())
	}
	if res.Status != 200 {
		_, _ = io.Copy(io.Discard, io.LimitReader(r, 1<<20))
		_ = resp.CloseBodyStream()
		res.E2E = time.Since(start)
		res.Err = "http " + strconv.Itoa(res.Status)
		return
	}
	st.br.Reset(r)
	if stream {
		err = c.readSSE(st, start, res)
	} else {
		err = readJSONBody(st.br, res)
		res.E2E = time.Since(start)
		res.TTFT = res.E2E
		res.Whole = true
	}
	if cerr := resp.CloseBodyStream(); err == nil && cerr != nil {
		err = cerr
	}
	st.br.Reset(nil)
	if err != nil {
		res.Err = err.Error()
	}
}

var (
	dataPrefix  = []byte("data:")
	doneMarker  = []byte("[DONE]")
	keyUsage    = []byte(`"usage":`)
	keyPrompt   = []byte(`"prompt_tokens":`)
	keyCompl    = []byte(`"completion_tokens":`)
	keyCached   = []byte(`"cached_tokens":`)
	keyContent  = []byte(`"content":`)
	keyText     = []byte(`"text":`)
	keyReason   = []byte(`"reasoning_content":`)
	keyReason2  = []byte(`"reasoning":`)
	keyErrorObj = []byte(`"error":`)
	keyChoices  = []byte(`"choices"`)
)

func (c *Client) readSSE(st *sseState, start time.Time, res *Result) error {
	st.itls = st.itls[:0]
	var last time.Time
	chunks := 0
	gotUsage, done := false, false
	for {
		line, err := st.br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer: skip the rest of it.
			for err == bufio.ErrBufferFull {
				_, err = st.br.ReadSlice('\n')
			}
			continue
		}
		if len(line) > 0 && bytes.HasPrefix(line, dataPrefix) {
			data := bytes.TrimSpace(line[len(dataPrefix):])
			if bytes.Equal(data, doneMarker) {
				done = true
				break
			}
			now := time.Now()
			if hasContent(data) {
				if chunks == 0 {
					res.TTFT = now.Sub(start)
				} else {
					gap := now.Sub(last)
					st.itls = append(st.itls, gap)
					res.ITLSum += gap
					res.ITLCount++
					if gap > res.ITLMax {
						res.ITLMax = gap
					}
				}
				last = now
				chunks++
			}
			if parseUsage(data, res) {
				gotUsage = true
			} else if bytes.Contains(data, keyErrorObj) {
				// An error event: before any token the request failed; after,
				// the stream was cut (a gateway ends it cleanly this way).
				res.E2E = time.Since(start)
				if chunks == 0 {
					return fmt.Errorf("error event: %.200s", data)
				}
				return fmt.Errorf("stream ended by an error event after %d chunks: %.200s", chunks, data)
			}
		}
		if err != nil {
			if err == io.EOF {
				break
			}
			res.E2E = time.Since(start)
			return fmt.Errorf("cannot read stream: %w", err)
		}
	}
	res.E2E = time.Since(start)
	if !gotUsage {
		res.OutputTokens = chunks
	}
	if !done {
		// The stream was cut: an OpenAI stream ends with data: [DONE],
		// after its finish_reason and usage.
		return fmt.Errorf("stream ended without data: [DONE] after %d chunks", chunks)
	}
	if chunks == 0 {
		return errors.New("stream ended without content")
	}
	if c.keep && len(st.itls) > 0 {
		c.mu.Lock()
		c.itls = append(c.itls, st.itls...)
		c.mu.Unlock()
	}
	return nil
}

// hasContent reports whether an SSE chunk carries generated text: a non-empty
// "content" (chat) or "text" (completions) string, or a reasoning model's
// "reasoning_content" (vLLM, SGLang) or "reasoning" (newer vLLM): reasoning
// tokens are output tokens, timed like the answer's.
func hasContent(data []byte) bool {
	for _, k := range [...][]byte{keyContent, keyText, keyReason, keyReason2} {
		for b := data; ; {
			i := bytes.Index(b, k)
			if i < 0 {
				break
			}
			b = skipSpace(b[i+len(k):])
			if len(b) > 1 && b[0] == '"' && b[1] != '"' {
				return true
			}
		}
	}
	return false
}

// skipSpace drops the JSON whitespace that may follow a key's colon.
func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// parseUsage fills token counts from a chunk holding a non-null usage object.
func parseUsage(data []byte, res *Result) bool {
	i := bytes.Index(data, keyUsage)
	if i < 0 {
		return false
	}
	u := skipSpace(data[i+len(keyUsage):])
	if len(u) == 0 || u[0] != '{' {
		return false // "usage":null
	}
	ok := false
	if v, found := intAfter(u, keyPrompt); found {
		res.PromptTokens, ok = v, true
	}
	if v, found := intAfter(u, keyCompl); found {
		res.OutputTokens, ok = v, true
	}
	if v, found := intAfter(u, keyCached); found {
		res.CachedTokens = v
	}
	return ok
}

func intAfter(b, key []byte) (int, bool) {
	i := bytes.Index(b, key)
	if i < 0 {
		return 0, false
	}
	b = skipSpace(b[i+len(key):])
	n, digits := 0, 0
	for _, ch := range b {
		if ch < '0' || ch > '9' || digits > 12 {
			break
		}
		n = n*10 + int(ch-'0')
		digits++
	}
	return n, digits > 0
}

// readJSONBody reads a non-streaming response and its usage.
func readJSONBody(br *bufio.Reader, res *Result) error {
	body, err := io.ReadAll(io.LimitReader(br, 64<<20))
	if err != nil {
		return fmt.Errorf("cannot read response: %w", err)
	}
	if !bytes.Contains(body, keyChoices) {
		// Not an answer: an error object sent with status 200 (as the
		// stream's error event is), or a page that is not JSON at all. It
		// counted as a success with one output token.
		return fmt.Errorf("answer without choices: %.200s", body)
	}
	if !parseUsage(body, res) {
		res.OutputTokens = 1
	}
	return nil
}
