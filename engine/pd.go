package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"
)

// Role is the part of generation an engine serves.
type Role uint8

const (
	// RoleMixed serves whole requests: prefill and decode on one engine.
	RoleMixed Role = iota
	// RolePrefill computes prompts and hands their KV to a decode engine.
	RolePrefill
	// RoleDecode receives a prompt's KV from a prefill engine and generates.
	RoleDecode
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "mixed"
}

// ParseRole parses mixed (or empty), prefill or decode.
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "mixed":
		return RoleMixed, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return RoleMixed, fmt.Errorf("unknown role %q (want mixed, prefill or decode)", s)
}

// PDMode is the KV connector, and so the request fields, a prefill or
// decode engine speaks.
type PDMode uint8

const (
	// PDNone: no disaggregation (the mixed role).
	PDNone PDMode = iota
	// PDSGLang is SGLang's push connector (Mooncake): both engines get the
	// request with bootstrap_host, bootstrap_port and bootstrap_room; the
	// prefill engine writes the KV into the decode engine's blocks.
	PDSGLang
	// PDVLLM is vLLM's pull connector (NixlConnector): the prefill engine
	// answers with kv_transfer_params, the decode engine reads the blocks.
	PDVLLM
)

func (m PDMode) String() string {
	switch m {
	case PDSGLang:
		return "sglang"
	case PDVLLM:
		return "vllm"
	}
	return ""
}

// ParsePDMode parses sglang, vllm or empty (none).
func ParsePDMode(s string) (PDMode, error) {
	switch s {
	case "":
		return PDNone, nil
	case "sglang":
		return PDSGLang, nil
	case "vllm":
		return PDVLLM, nil
	}
	return PDNone, fmt.Errorf("unknown PD mode %q (want sglang or vllm)", s)
}

// Default ports of the real engines' KV servers.
const (
	// DefaultSGLangBootstrapPort is SGLang's --disaggregation-bootstrap-port
	// default.
	DefaultSGLangBootstrapPort = 8998
	// DefaultNixlSideChannelPort is vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default.
	DefaultNixlSideChannelPort = 5600
)

// PDConfig configures a prefill or decode engine. The zero value is the
// mixed role.
type PDConfig struct {
	Role Role
	Mode PDMode
	// Listener serves the prefill role's KV server: SGLang's bootstrap
	// server (the decode engine connects for its bootstrap_room and receives
	// the KV) or vLLM's NIXL side channel (the decode engine reads the
	// blocks named by kv_transfer_params). Required for RolePrefill, unused
	// otherwise; the Server closes it.
	Listener net.Listener
	// AdvertiseHost is the host decode engines reach Listener at (vLLM's
	// remote_host, SGLang's bootstrap_host in BootstrapInfo). Empty means
	// Listener's IP, or 127.0.0.1 when it listens on a wildcard address.
	AdvertiseHost string
	// EngineID is vLLM's remote_engine_id; empty means the Server's ID.
	EngineID string
	// NullBootstrapPort is the port an SGLang decode engine contacts when a
	// request's bootstrap_port is null: SGLang's scheduler substitutes its
	// own --disaggregation-bootstrap-port (default 8998, the default here).
	NullBootstrapPort int
	// WaitingTimeout bounds a decode engine's wait for a request's KV
	// (SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT, default 300s).
	WaitingTimeout time.Duration
	// BootstrapTimeout bounds an SGLang prefill request's wait for its
	// decode engine to connect (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT,
	// default 300s).
	BootstrapTimeout time.Duration
	// AbortRequestTimeout is how long a vLLM prefill engine keeps a finished
	// request's blocks for the decode engine to read before freeing them
	// (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, default 480s).
	AbortRequestTimeout time.Duration
}

func (c *PDConfig) normalize(serverID string) error {
	switch c.Role {
	case RoleMixed:
		if c.Mode != PDNone {
			return fmt.Errorf("PD mode %s needs the prefill or decode role", c.Mode)
		}
		if c.Listener != nil {
			return errors.New("a KV server listener needs the prefill role")
		}
		return nil
	case RolePrefill, RoleDecode:
	default:
		return fmt.Errorf("unknown role %d", c.Role)
	}
	if c.Mode != PDSGLang && c.Mode != PDVLLM {
		return fmt.Errorf("the %s role needs a PD mode (sglang or vllm)", c.Role)
	}
	if c.Role == RolePrefill && c.Listener == nil {
		return errors.New("the prefill role needs a KV server listener (bootstrap server or side channel)")
	}
	if c.Role == RoleDecode && c.Listener != nil {
		return errors.New("a KV server listener needs the prefill role")
	}
	if c.WaitingTimeout == 0 {
		c.WaitingTimeout = 300 * time.Second
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = 300 * time.Second
	}
	if c.AbortRequestTimeout == 0 {
		c.AbortRequestTimeout = 480 * time.Second
	}
	if c.WaitingTimeout < 0 || c.BootstrapTimeout < 0 || c.AbortRequestTimeout < 0 {
		return errors.New("PD timeouts must not be negative")
	}
	if c.EngineID == "" {
		c.EngineID = serverID
	}
	if c.NullBootstrapPort == 0 {
		c.NullBootstrapPort = DefaultSGLangBootstrapPort
	}
	if c.Listener != nil && c.AdvertiseHost == "" {
		c.AdvertiseHost = "127.0.0.1"
		if a, ok := c.Listener.Addr().(*net.TCPAddr); ok && a.IP != nil && !a.IP.IsUnspecified() {
			c.AdvertiseHost = a.IP.String()
		}
	}
	return nil
}

// Paths of the prefill engine's KV server.
const (
	// pathBootstrap: an SGLang decode engine joins a bootstrap_room and
	// receives the room's KV (the answer comes when the transfer is done).
	pathBootstrap = "/kv/bootstrap"
	// pathRead: a vLLM decode engine reads the blocks of a finished prefill.
	pathRead = "/kv/read"
)

// pd is a prefill or decode engine's side of disaggregation: the rendezvous
// of SGLang rooms and the vLLM blocks held for reading (prefill), the KV
// server, and the client decode engines use to get their KV.
type pd struct {
	cfg  PDConfig
	srv  *Server
	port int // of cfg.Listener
	info []byte

	http   *http.Server // the KV server (prefill)
	client *http.Client // reaches prefill engines (decode)

	mu     sync.Mutex
	rooms  map[int64]*room    // SGLang prefill: by bootstrap_room
	held   map[string]*heldKV // vLLM prefill: by remote_request_id
	closed bool

	transfers, failures, timeouts, blocks atomic.Uint64
}

func newPD(s *Server, cfg PDConfig) *pd {
	p := &pd{cfg: cfg, srv: s, rooms: map[int64]*room{}, held: map[string]*heldKV{}}
	if cfg.Listener != nil {
		if a, ok := cfg.Listener.Addr().(*net.TCPAddr); ok {
			p.port = a.Port
		}
		p.info, _ = json.Marshal(BootstrapInfo{Mode: cfg.Mode.String(), Host: cfg.AdvertiseHost, Port: p.port})
		p.http = &http.Server{Handler: http.HandlerFunc(p.serveKV), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10}
		go func() {
			if err := p.http.Serve(cfg.Listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				slog.Error("engine KV server stopped", "err", err)
			}
		}()
	}
	if cfg.Role == RoleDecode {
		p.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	}
	return p
}

// BootstrapInfo is what a prefill engine advertises for routers and decode
// engines: the KV server's address. Its JSON is the worker record's
// "bootstrap" field (infera worker --bootstrap).
type BootstrapInfo struct {
	// Mode is sglang or vllm.
	Mode string `json:"pd_mode"`
	// Host and Port locate the KV server: SGLang's bootstrap_host and
	// bootstrap_port, or vLLM's remote_host and remote_port (the NIXL side
	// channel).
	Host string `json:"bootstrap_host"`
	Port int    `json:"bootstrap_port"`
}

func (p *pd) close() {
	p.mu.Lock()
	p.closed = true
	for id, h := range p.held {
		h.timer.Stop()
		delete(p.held, id)
	}
	rooms := make([]*room, 0, len(p.rooms))
	for _, r := range p.rooms {
		rooms = append(rooms, r)
	}
	p.mu.Unlock()
	for _, r := range rooms {
		r.finish(errEngineStopping)
	}
	if p.http != nil {
		_ = p.http.Close()
	}
	if p.client != nil {
		p.client.CloseIdleConnections()
	}
}

var errEngineStopping = errors.New("engine shutting down")

// transferError is a failed KV transfer: the request fails with 500, as
// SGLang and vLLM fail it (SGLang's prepare_abort with
// INTERNAL_SERVER_ERROR, vLLM's kv_load_failure_policy "fail").
type transferError struct{ msg string }

func (e *transferError) Error() string { return "KV transfer failed: " + e.msg }

func transferErrorf(format string, args ...any) error {
	return &transferError{msg: fmt.Sprintf(format, args...)}
}

// promptHash identifies a prompt's tokens, so both ends of a transfer can
// check they hold the same prompt (a router that sends the two legs
// different bodies would otherwise "transfer" the wrong KV).
func promptHash(tokens []uint32) uint64 {
	var h xxh3.Hasher
	var b [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:], t)
		_, _ = h.Write(b[:])
	}
	return h.Sum64()
}

// room is one SGLang bootstrap_room on the prefill engine: the prefill
// request and the decode engine's connection meet here, in either order.
type room struct {
	id int64

	// Guarded by pd.mu.
	hasPrefill, hasDecode bool

	// Set by the prefill request before close(prefillIn) / close(computed).
	promptHash   uint64
	promptTokens int
	blocks       int

	decodeIn chan struct{} // the decode engine connected
	computed chan struct{} // the prefill computed the KV (blocks is set)
	done     chan struct{} // the transfer ended; err says how
	err      error
	once     sync.Once
}

func (r *room) finish(err error) {
	r.once.Do(func() {
		r.err = err
		close(r.done)
	})
}

// join registers the prefill (prefill true) or the decode side of a room.
func (p *pd) join(id int64, prefill bool) (*room, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errEngineStopping
	}
	r := p.rooms[id]
	if r == nil {
		r = &room{id: id, decodeIn: make(chan struct{}), computed: make(chan struct{}), done: make(chan struct{})}
		p.rooms[id] = r
	}
	if prefill {
		if r.hasPrefill {
			return nil, fmt.Errorf("bootstrap_room %d is already in use by another prefill request", id)
		}
		r.hasPrefill = true
		return r, nil
	}
	if r.hasDecode {
		return nil, fmt.Errorf("bootstrap_room %d already has a decode engine", id)
	}
	r.hasDecode = true
	close(r.decodeIn)
	return r, nil
}

// leave ends one side's use of a room; the room is forgotten when it is
// finished (a later request with the same id starts afresh).
func (p *pd) leave(r *room, err error) {
	r.finish(err)
	p.mu.Lock()
	if p.rooms[r.id] == r {
		delete(p.rooms, r.id)
	}
	p.mu.Unlock()
}

// heldKV is a finished vLLM prefill whose blocks wait for the decode
// engine's read.
type heldKV struct {
	sq           *seq
	ids          []int
	promptHash   uint64
	promptTokens int
	timer        *time.Timer
}

// hold keeps h's blocks until a read takes them or AbortRequestTimeout
// frees them.
func (p *pd) hold(reqID string, h *heldKV) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.held[reqID] = h
	h.timer = time.AfterFunc(p.cfg.AbortRequestTimeout, func() {
		if p.take(reqID) == h {
			p.srv.abort(h.sq) // releases the blocks
			slog.Debug("engine freed unread prefill blocks", "request", reqID)
		}
	})
	return true
}

// take removes and returns the held request reqID, or nil.
func (p *pd) take(reqID string) *heldKV {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.held[reqID]
	if h != nil {
		delete(p.held, reqID)
		h.timer.Stop()
	}
	return h
}

func (p *pd) counts() (rooms, held int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.rooms), len(p.held)
}

// The KV server's messages. Hashes travel as decimal strings so that no
// JSON reader rounds them.

type bootstrapMsg struct {
	Room         int64  `json:"bootstrap_room"`
	PromptTokens int    `json:"prompt_tokens"`
	PromptHash   string `json:"prompt_hash"`
}

type readMsg struct {
	EngineID     string `json:"remote_engine_id"`
	RequestID    string `json:"remote_request_id"`
	BlockIDs     []int  `json:"remote_block_ids"`
	SkipBlocks   int    `json:"skip_blocks"`
	PromptTokens int    `json:"prompt_tokens"`
	PromptHash   string `json:"prompt_hash"`
}

type transferReply struct {
	Blocks int    `json:"blocks"`
	Error  string `json:"error,omitempty"`
}

func writeReply(w http.ResponseWriter, status int, rep transferReply) {
	b, _ := json.Marshal(rep)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// serveKV is the prefill engine's KV server.
func (p *pd) serveKV(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/health" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(p.info)
	case r.URL.Path == pathBootstrap && p.cfg.Mode == PDSGLang && r.Method == http.MethodPost:
		p.serveBootstrap(w, r)
	case r.URL.Path == pathRead && p.cfg.Mode == PDVLLM && r.Method == http.MethodPost:
		p.serveRead(w, r)
	default:
		writeReply(w, http.StatusNotFound, transferReply{Error: "unknown KV server path for " + p.cfg.Mode.String()})
	}
}

func readJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("cannot read request: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errors.New("malformed request")
	}
	return nil
}

// serveBootstrap: an SGLang decode engine joins a room and waits for the
// prefill to compute the KV; the prefill engine then "writes" it (sleeps the
// transfer time) and answers.
func (p *pd) serveBootstrap(w http.ResponseWriter, req *http.Request) {
	var m bootstrapMsg
	if err := readJSON(req, &m); err != nil || m.Room < 0 {
		writeReply(w, http.StatusBadRequest, transferReply{Error: "malformed bootstrap request"})
		return
	}
	r, err := p.join(m.Room, false)
	if err != nil {
		writeReply(w, http.StatusConflict, transferReply{Error: err.Error()})
		return
	}
	// The decode engine enforces its own waiting timeout by hanging up;
	// BootstrapTimeout bounds this side too.
	deadline := time.NewTimer(p.cfg.BootstrapTimeout)
	defer deadline.Stop()
	select {
	case <-r.computed:
	case <-r.done:
		p.leave(r, r.err)
		writeReply(w, http.StatusInternalServerError, transferReply{Error: r.err.Error()})
		return
	case <-req.Context().Done():
		p.leave(r, transferErrorf("bootstrap_room %d: the decode engine disconnected", m.Room))
		return
	case <-p.srv.stop:
		p.leave(r, errEngineStopping)
		writeReply(w, http.StatusServiceUnavailable, transferReply{Error: errEngineStopping.Error()})
		return
	case <-deadline.C:
		err := transferErrorf("bootstrap_room %d: no prefill request computed the room within %s", m.Room, p.cfg.BootstrapTimeout)
		p.leave(r, err)
		writeReply(w, http.StatusGatewayTimeout, transferReply{Error: err.Error()})
		return
	}
	if strconv.FormatUint(r.promptHash, 10) != m.PromptHash || r.promptTokens != m.PromptTokens {
		err := transferErrorf("bootstrap_room %d: the prefill and decode requests have different prompts (%d and %d tokens)",
			m.Room, r.promptTokens, m.PromptTokens)
		p.leave(r, err)
		writeReply(w, http.StatusConflict, transferReply{Error: err.Error()})
		return
	}
	if err := p.sleepTransfer(req.Context(), r.blocks); err != nil {
		p.leave(r, transferErrorf("bootstrap_room %d: %v", m.Room, err))
		return
	}
	p.blocks.Add(uint64(r.blocks))
	p.transfers.Add(1)
	p.leave(r, nil)
	writeReply(w, http.StatusOK, transferReply{Blocks: r.blocks})
}

// serveRead: a vLLM decode engine reads the blocks of a finished prefill
// (a NIXL READ), which frees them here.
func (p *pd) serveRead(w http.ResponseWriter, req *http.Request) {
	var m readMsg
	if err := readJSON(req, &m); err != nil {
		writeReply(w, http.StatusBadRequest, transferReply{Error: "malformed read request"})
		return
	}
	if m.EngineID != p.cfg.EngineID {
		writeReply(w, http.StatusNotFound, transferReply{Error: "remote_engine_id does not name this engine"})
		return
	}
	h := p.take(m.RequestID)
	if h == nil {
		writeReply(w, http.StatusGone, transferReply{Error: fmt.Sprintf(
			"no KV is held for the remote_request_id: never prefilled here, already read, or freed after %s unread",
			p.cfg.AbortRequestTimeout)})
		return
	}
	defer p.srv.abort(h.sq) // the read frees the blocks, whatever its outcome
	if !intsEqual(h.ids, m.BlockIDs) {
		writeReply(w, http.StatusConflict, transferReply{Error: "remote_block_ids differ from the blocks this engine returned for the request"})
		return
	}
	if strconv.FormatUint(h.promptHash, 10) != m.PromptHash || h.promptTokens != m.PromptTokens {
		writeReply(w, http.StatusConflict, transferReply{Error: fmt.Sprintf(
			"the prefill and decode requests have different prompts (%d and %d tokens)", h.promptTokens, m.PromptTokens)})
		return
	}
	n := len(h.ids) - min(max(m.SkipBlocks, 0), len(h.ids))
	if err := p.sleepTransfer(req.Context(), n); err != nil {
		return
	}
	p.blocks.Add(uint64(n))
	p.transfers.Add(1)
	writeReply(w, http.StatusOK, transferReply{Blocks: n})
}

func intsEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// sleepTransfer spends the simulated transfer time of n blocks.
func (p *pd) sleepTransfer(ctx context.Context, n int) error {
	p.srv.mu.Lock()
	d := p.srv.core.cfg.Time.TransferTime(n)
	p.srv.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errors.New("the decode engine disconnected during the transfer")
	case <-p.srv.stop:
		return errEngineStopping
	}
}

// fetch is the decode side of a transfer: it posts msg to the prefill
// engine's KV server at host:port and returns the number of blocks
// received. It fails with a *transferError.
func (p *pd) fetch(ctx context.Context, host string, port int, path string, msg any, what string) (int, error) {
	body, _ := json.Marshal(msg)
	addr := net.JoinHostPort(trimBrackets(host), strconv.Itoa(port))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return 0, transferErrorf("%s: bad prefill address", what)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			p.timeouts.Add(1)
			return 0, transferErrorf("%s: timed out after %s waiting for the KV from the prefill engine at %s (KVPoll.WaitingForInput)",
				what, p.cfg.WaitingTimeout, addr)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, transferErrorf("%s: cannot reach the prefill engine's KV server at %s: %v", what, addr, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	var rep transferReply
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			p.timeouts.Add(1)
			return 0, transferErrorf("%s: timed out after %s during the transfer from %s", what, p.cfg.WaitingTimeout, addr)
		}
		return 0, transferErrorf("%s: the transfer from %s broke off", what, addr)
	}
	if json.Unmarshal(b, &rep) != nil {
		return 0, transferErrorf("%s: %s answered %d with a malformed reply", what, addr, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		msg := cleanMsg(rep.Error)
		if t, ok := strings.CutPrefix(msg, "KV transfer failed: "); ok {
			msg = t
		}
		return 0, transferErrorf("%s: the prefill engine at %s answered %d: %s", what, addr, resp.StatusCode, msg)
	}
	return rep.Blocks, nil
}

func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

// cleanMsg bounds a peer's error text and keeps only printable ASCII, so
// that whatever the peer sends cannot forge log lines or grow without limit.
func cleanMsg(s string) string {
	const limit = 300
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < limit; i++ {
		if c := s[i]; c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		}
	}
	return b.String()
}
