package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/lockout"
	"github.com/infera/infera/internal/logx"
)

const maxBodyBytes = 4 << 20

// authLog throttles refused-key lines: a scanner must not flood the log.
var authLog = logx.Throttle{Every: time.Second}

// countRefused counts the writes h refuses (an invalid value, a body that
// does not parse, a stale or missing If-Match, ...) in
// infera_config_applies_total{result="error"}; a dry run is no write.
// change counts the ones that make a new version.
func countRefused(h func(w http.ResponseWriter, r *http.Request) error) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		err := h(w, r)
		if err != nil && !r.URL.Query().Has("dry_run") {
			config.CountApply(false)
		}
		return err
	}
}

// onlyParams refuses a write whose query has a parameter other than
// names, or one of them twice: a misspelt ?dryrun=1 (or ?DRY_RUN=1, or a
// ?dry_run=1 sent to another write) would otherwise be ignored and the
// write applied for real.
func onlyParams(h func(w http.ResponseWriter, r *http.Request) error, names ...string) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		q := r.URL.Query()
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			switch {
			case !slices.Contains(names, k):
				want := "this endpoint takes none"
				if len(names) > 0 {
					want = "want " + strings.Join(names, ", ")
				}
				return &config.FieldError{Path: echoName(k), Msg: fmt.Sprintf("unknown query parameter %s: %s (nothing was changed)", quoteName(k), want)}
			case len(q[k]) > 1:
				return &config.FieldError{Path: k, Msg: fmt.Sprintf("query parameter %s given %d times: give it once (nothing was changed)", quoteName(k), len(q[k]))}
			}
		}
		return h(w, r)
	}
}

// Handler returns the admin API and console handler. Every /api/ path
// needs "Authorization: Bearer <admin key>"; the console's static files do
// not (they hold no data).
func (a *Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	api := func(pattern string, h func(w http.ResponseWriter, r *http.Request) error) {
		if !strings.HasPrefix(pattern, "GET ") {
			params := []string(nil)
			if pattern == "POST /api/backup/import" {
				params = []string{"dry_run"}
			}
			h = onlyParams(h, params...)
			if pattern != "POST /api/backup" {
				h = countRefused(h) // a write of the config, users or templates
			}
		}
		mux.Handle(pattern, a.authed(h))
	}
	api("GET /api/version", a.getVersion)
	api("GET /api/schema", a.getSchema)
	api("GET /api/config", a.getConfig)
	api("PUT /api/config", a.putConfig)
	api("GET /api/config/{section}", a.getSection)
	api("PUT /api/config/{section}", a.writeSection)
	api("PATCH /api/config/{section}", a.writeSection)
	api("GET /api/fleet", a.getFleet)
	api("GET /api/rules", a.getRules)
	api("GET /api/audit", a.getAudit)
	api("GET /api/backup", a.getBackup)
	api("POST /api/backup", a.postBackup)
	api("GET /api/backup/export", a.getExport)
	api("GET /api/backup/snapshots/{name}", a.getSnapshot)
	api("POST /api/backup/import", a.postImport)
	a.userRoutes(api)
	mux.Handle("/api/", a.authed(func(w http.ResponseWriter, r *http.Request) error {
		// An endpoint that exists for other methods: 405 with Allow.
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPatch, http.MethodPost, http.MethodDelete} {
			r2 := r.Clone(r.Context())
			r2.Method = m
			if _, p := mux.Handler(r2); p != "/api/" && p != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			return &httpError{status: http.StatusMethodNotAllowed, msg: echoName(r.Method) + " is not allowed on " + echoPath(r) + " (allowed: " + strings.Join(allow, ", ") + ")"}
		}
		return &httpError{status: http.StatusNotFound, msg: "no such endpoint: " + echoName(r.Method) + " " + echoPath(r)}
	}))
	mux.Handle("/", consoleHandler())
	return securityHeaders(mux)
}

// httpError is an error with its status.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func (a *Admin) authed(h func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.hostAllowed(r.Host) {
			// A page that re-points its own name at this listener (DNS
			// rebinding) reaches it from the operator's browser as its own
			// origin, key header and all: refused before the key is
			// checked or counted, so it can neither guess nor lock the
			// operator out.
			authLog.Warn("admin request refused: its Host is not one this listener answers for (--admin-allowed-hosts)", "remote", a.remote(r), "path", echoPath(r))
			writeJSON(w, http.StatusMisdirectedRequest, errBody("", "this admin listener does not answer for the request's Host; name it with --admin-allowed-hosts"))
			return
		}
		ip := lockout.Key(a.client(r)) // an IPv6 client counts as its /64
		// Redis's answers about ip's wrong keys sent before (lockout.go).
		a.fails.Await(ip, govern.AnswerWait)
		if wait, locked := a.fails.Locked(ip); locked {
			// Too many wrong keys from this address: the key is not even
			// checked until the window ends (no guessing at any speed).
			authLog.Warn("admin request refused: too many wrong keys from this address", "remote", a.remote(r), "path", echoPath(r))
			w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
			writeJSON(w, http.StatusTooManyRequests, errBody("", "too many wrong admin keys from this address; retry later"))
			return
		}
		tok, ok := bearer(r.Header.Get("Authorization"))
		if !ok || !a.checkKey(tok) {
			if ok && tok != "" {
				// Only a key presented counts as a guess: a request without
				// one (a CORS preflight, a page's no-cors request from
				// another origin) must not lock the operator out.
				a.wrongKey(ip) // here, and in Redis with --state (lockout.go)
			}
			// The presented key is never logged or echoed.
			authLog.Warn("admin request refused: bad or missing key", "remote", a.remote(r), "path", echoPath(r))
			w.Header().Set("WWW-Authenticate", `Bearer realm="infera admin"`)
			writeJSON(w, http.StatusUnauthorized, errBody("", "missing or wrong admin key: send Authorization: Bearer <admin key>"))
			return
		}
		if err := h(w, r); err != nil {
			// A client that left is not the router's failure (the proxy
			// counts such a client, it does not report an error).
			why := ""
			switch {
			case errors.Is(err, errBodyEnded):
				why = "its body ended early (the client closed its connection)"
			case errors.Is(err, errLeftWaiting):
				why = "its client closed the connection while it waited for the import running"
			}
			if why != "" {
				slog.Info("admin request abandoned: "+why+"; nothing was changed", "remote", a.remote(r), "path", echoPath(r))
			}
			a.writeErr(w, err)
		}
	})
}

func bearer(h string) (string, bool) {
	const p = "bearer "
	if len(h) < len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

func (a *Admin) who(r *http.Request) actor {
	return actor{Who: a.o.KeyLabel, Remote: a.remote(r)}
}

// client is the request's client address: the TCP peer's, or when the
// peer is one of --trusted-proxies, the rightmost X-Forwarded-For address
// not itself trusted (internal/realip, as on the data path). Invalid when
// the peer's address is not an IP address.
func (a *Admin) client(r *http.Request) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		// Not host:port (a test's, or a listener of another kind).
		bare, _ := netip.ParseAddr(r.RemoteAddr)
		return bare.Unmap()
	}
	if a.trusted == nil {
		return peer.Addr().Unmap()
	}
	return a.trusted.ClientString(peer.Addr(), r.Header.Values("X-Forwarded-For"))
}

// remote names the client for a log line or the audit log: the peer's
// host:port, or behind a trusted proxy "client (via host:port)".
func (a *Admin) remote(r *http.Request) string {
	if a.trusted == nil {
		return r.RemoteAddr
	}
	c := a.client(r)
	if peer, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || !c.IsValid() || c == peer.Addr().Unmap().WithZone("") {
		return r.RemoteAddr
	}
	return c.String() + " (via " + r.RemoteAddr + ")"
}

func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		if strings.HasPrefix(r.URL.Path, "/api/") {
			hd.Set("Cache-Control", "no-store")
		}
		if r.TransferEncoding != nil || !r.ProtoAtLeast(1, 1) {
			// net/http reads Content-Length with chunked as chunked, and
			// ignores Transfer-Encoding in HTTP/1.0 (the bytes after the head
			// are the next request), dropping the fields it overrode, so
			// neither can be told apart here; and it keeps the connection:
			// RFC 9112 6.1 requires closing it after both (a front proxy
			// that framed the request otherwise reads what follows as another
			// request). The console and curl send a length over HTTP/1.1, so
			// every chunked or HTTP/1.0 request closes its connection.
			hd.Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

type errorJSON struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	// Version is the current version on a 409.
	Version uint64 `json:"version,omitempty"`
}

// errBody is an error answer, bounded (clipPath, maxErrMessage).
func errBody(path, msg string) errorJSON {
	return errorJSON{Error: errorDetail{Path: clipPath(path), Message: clip(msg, maxErrMessage)}}
}

func (a *Admin) writeErr(w http.ResponseWriter, err error) {
	var fe *config.FieldError
	var he *httpError
	var ce *errConflict
	var ue *errUnavailable
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ce):
		cur, ver := a.store.Current()
		w.Header().Set("ETag", a.etag(cur, ver))
		b := errBody("", ce.msg)
		b.Error.Version = ce.have
		writeJSON(w, http.StatusConflict, b)
	case errors.As(err, &fe):
		writeJSON(w, http.StatusBadRequest, errBody(fe.Path, fe.Msg))
	case errors.As(err, &he):
		writeJSON(w, he.status, errBody("", he.msg))
	case errors.As(err, &mbe):
		writeJSON(w, http.StatusRequestEntityTooLarge, errBody("", fmt.Sprintf("body larger than %d bytes", mbe.Limit)))
	case errors.As(err, &ue):
		writeJSON(w, http.StatusServiceUnavailable, errBody("", ue.Error()))
	default:
		slog.Error("admin request failed", "err", err)
		writeJSON(w, http.StatusInternalServerError, errBody("", err.Error()))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":{"message":"cannot encode the answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

func writeRaw(w http.ResponseWriter, status int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

// readBody reads a bounded request body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	return b, bodyErr(w, err)
}

// errBodyEnded answers a request whose body ended before the length it
// announced (or before its last chunk): its client closed (or reset) the
// connection half way. That is the client leaving, not the router
// failing: it was a 500 and an ERROR line ("admin request failed
// err=\"unexpected EOF\""); it is a 400 (to a client that is most likely
// gone) and an INFO line (authed).
var errBodyEnded = &httpError{status: http.StatusBadRequest, msg: "the request body ended early: the connection closed before the length it announced arrived; nothing was changed"}

// bodyErr is a body's read error as the client is answered: a body that
// did not arrive before the listener's read deadline is a 408 that says
// so (it was a 500 carrying "read tcp ...: i/o timeout", or no answer at
// all: the write deadline, from the same instant, had passed too), with a
// few seconds to write it. A connection Close cut is the shutdown's 503,
// not a failure to log; a body its client cut is errBodyEnded.
func bodyErr(w http.ResponseWriter, err error) error {
	if errors.Is(err, net.ErrClosed) {
		return errClosed // Close cut the connection past its grace
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return errBodyEnded
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(5 * time.Second))
		return &httpError{status: http.StatusRequestTimeout, msg: fmt.Sprintf(
			"the body did not arrive in time (the admin listener reads a body for at most %s, an import's for %s with at most %s without a byte): nothing was changed; send it again over a faster link", readTimeout, transferTimeout, importIdleTimeout)}
	}
	return err
}

// readImportBody is readBody for an import, whose body has until end (the
// transferTimeout, longTransfer) but is cut once no byte of it arrived for
// importIdleTimeout (idleBody). A body of announced length is read by
// readAnnounced, whose buffer grows as the bytes arrive; one of unknown
// length (chunked) by io.ReadAll.
// A body announced larger than limit is refused before it is read.
func readImportBody(w http.ResponseWriter, r *http.Request, limit int64, end time.Time) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	body := &idleBody{r: http.MaxBytesReader(w, r.Body, limit), rc: http.NewResponseController(w), end: end}
	body.extend()
	var b []byte
	var err error
	if r.ContentLength <= 0 {
		b, err = io.ReadAll(body)
	} else {
		b, err = readAnnounced(body, int(r.ContentLength))
	}
	if err == nil {
		// Past the body's end the server reads the connection in the
		// background (to see the client go), under this deadline: the
		// import's work must not cancel its own request importIdleTimeout
		// after the last byte.
		body.rc.SetReadDeadline(end)
	}
	return b, bodyErr(w, err)
}

// firstBodyBuffer is the most readAnnounced reserves before a body's
// bytes arrive.
const firstBodyBuffer = 1 << 20

// readAnnounced reads r to its end, n bytes announced. One buffer of n
// bytes made before the first byte (as it was) let a client that
// announced 64 MiB and sent nothing make the router hold 64 MiB; io.ReadAll
// grows from 512 bytes by doubling and a quarter at a time, allocating
// about three times the body. The buffer here starts at
// min(n, firstBodyBuffer) and doubles as it fills, straight to n (and one
// byte, to see the end) once the doubled size would reach n/4, that is
// once an eighth of n has arrived. A body of up to 1 MiB is one buffer of
// its size; a larger one allocates less than 1.5 times its size (the 4.9
// MB export of 20,000 users: 1 MiB, then its size, 1.2x; the 12.3 MB one
// of 50,000: 1, 2 MiB, then its size, 1.25x: stopping at a quarter, 4 MiB
// more, took TestAGovernedImportKeepsLessThanTwiceItsBody above its 6x);
// what a client makes the router reserve is 1 MiB or at most about 8
// times what it sent. Bytes beyond n (not from net/http, which ends the
// body at its Content-Length) grow it by doubling.
func readAnnounced(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, 0, min(n, firstBodyBuffer)+1)
	for {
		if len(b) == cap(b) {
			size := 2 * len(b)
			if 4*size >= n {
				size = max(size, n+1)
			}
			b = append(make([]byte, 0, size), b...)
		}
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// idleBody is an import's body that moves the connection's read deadline
// to importIdleTimeout from now (never past end) each time bytes arrive:
// a client that stops sending is cut then, one that keeps sending has
// until end.
type idleBody struct {
	r   io.Reader
	rc  *http.ResponseController
	end time.Time
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.extend()
	}
	return n, err
}

// extend sets the read deadline importIdleTimeout from now, or at end.
func (b *idleBody) extend() {
	d := time.Now().Add(importIdleTimeout)
	if d.After(b.end) {
		d = b.end
	}
	b.rc.SetReadDeadline(d) // not supported by a test's recorder: no bound there
}

// decodeAny decodes one JSON value keeping numbers exact.
func decodeAny(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &config.FieldError{Msg: "cannot parse the body as JSON: " + err.Error()}
	}
	if !atEnd(dec) {
		return nil, &config.FieldError{Msg: "unexpected data after the JSON value"}
	}
	return v, nil
}

// atEnd reports whether dec has nothing but white space left. (Decoder.More
// is false before a stray '}' or ']', so it cannot tell.)
func atEnd(dec *json.Decoder) bool {
	_, err := dec.Token()
	return err == io.EOF
}

// ifMatch checks the request's If-Match against the current version and
// returns the version the write is based on (0: no precondition, only with
// required false). A stale ETag is a conflict; a missing one on a required
// write is 428.
func (a *Admin) ifMatch(r *http.Request, required bool) (uint64, error) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" {
		if required {
			return 0, &httpError{status: http.StatusPreconditionRequired, msg: "send If-Match with the ETag of your last GET (or If-Match: * to overwrite whatever is current)"}
		}
		return 0, nil
	}
	if h == "*" {
		return 0, nil
	}
	cur, ver := a.store.Current()
	etag := a.etag(cur, ver) // once: it encodes the whole config, and a header may list thousands of tags
	weak := false
	for _, t := range strings.Split(h, ",") {
		t = strings.TrimSpace(t)
		if strings.HasPrefix(t, "W/") {
			// If-Match compares strongly (RFC 9110 13.1.1): a weak tag
			// never matches. The ETags given out here are all strong.
			weak = true
			continue
		}
		if t == etag {
			return ver, nil
		}
	}
	if weak {
		return 0, &httpError{status: http.StatusPreconditionFailed, msg: "If-Match compares strong ETags only (RFC 9110 13.1.1): send the ETag exactly as GET returned it, without W/"}
	}
	want := uint64(0)
	if v, _, ok := strings.Cut(strings.Trim(strings.TrimSpace(h), `"`), "-"); ok {
		want, _ = strconv.ParseUint(v, 10, 64)
	}
	msg := fmt.Sprintf("the config changed since your version (now %d): reload and apply your change again", ver)
	if want == ver {
		msg = fmt.Sprintf("your ETag is for a different config with the same version number %d (a restart in between?): reload and apply your change again", ver)
	}
	return 0, &errConflict{have: ver, msg: msg}
}

// setVersionHeaders sets the ETag and X-Config-Version of config c at
// version v, and returns the ETag for an answer that also gives it in its
// body: computing it encodes the whole config.
func (a *Admin) setVersionHeaders(w http.ResponseWriter, c *config.Config, v uint64) string {
	etag := a.etag(c, v)
	w.Header().Set("ETag", etag)
	w.Header().Set("X-Config-Version", strconv.FormatUint(v, 10))
	return etag
}

// sections returns the JSON names of config.Config's fields, in order.
func sections() []string {
	t := reflect.TypeFor[config.Config]()
	var out []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

func isSection(name string) bool {
	for _, s := range sections() {
		if s == name {
			return true
		}
	}
	return false
}

// Version is the answer of GET /api/version.
type Version struct {
	Version uint64 `json:"version"`
	ETag    string `json:"etag"`
	// Storage is file, memory or redis.
	Storage    string `json:"storage"`
	ConfigPath string `json:"config_path,omitempty"`
	// Snapshots is true with --persist-snapshot-dir (and no Redis).
	Snapshots bool      `json:"snapshots"`
	Started   time.Time `json:"started"`
	KeyLabel  string    `json:"key_label"`
}

func (a *Admin) getVersion(w http.ResponseWriter, r *http.Request) error {
	c, v := a.store.Current()
	etag := a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, Version{Version: v, ETag: etag, Storage: a.st.kind(), ConfigPath: a.store.Path(),
		Snapshots: a.snaps != nil, Started: a.started, KeyLabel: a.o.KeyLabel})
	return nil
}

func (a *Admin) getConfig(w http.ResponseWriter, r *http.Request) error {
	c, v := a.store.Current()
	data, err := a.seal.encodeRedacted(c)
	if err != nil {
		return err
	}
	a.setVersionHeaders(w, c, v)
	writeRaw(w, http.StatusOK, data)
	return nil
}

func (a *Admin) putConfig(w http.ResponseWriter, r *http.Request) error {
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		return err
	}
	in, err := decodeDoc(body)
	if err != nil {
		return err
	}
	if err := config.RepeatedKey(body, ""); err != nil { // the map kept one copy
		return err
	}
	c, v, err := a.change(a.who(r), "PUT config", base, func(doc map[string]any) error {
		clear(doc)
		for k, val := range in {
			doc[k] = val
		}
		return nil
	})
	if err != nil {
		return err
	}
	data, err := a.seal.encodeRedacted(c)
	if err != nil {
		return err
	}
	a.setVersionHeaders(w, c, v)
	writeRaw(w, http.StatusOK, data)
	return nil
}

// sectionOf returns section name of c's redacted encoding.
func (s *sealer) sectionOf(c *config.Config, name string) (json.RawMessage, error) {
	data, err := s.encodeRedacted(c)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return m[name], nil
}

func (a *Admin) getSection(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("section")
	if !isSection(name) {
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no config section %s (sections: %s)", quoteName(name), strings.Join(sections(), ", "))}
	}
	c, v := a.store.Current()
	sec, err := a.seal.sectionOf(c, name)
	if err != nil {
		return err
	}
	a.setVersionHeaders(w, c, v)
	writeRaw(w, http.StatusOK, sec)
	return nil
}

// writeSection is PUT (replace the section: omitted settings take their
// defaults) and PATCH (JSON merge patch, RFC 7386: only the settings given
// change; null removes a setting, which restores its default).
func (a *Admin) writeSection(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("section")
	if !isSection(name) {
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no config section %s (sections: %s)", quoteName(name), strings.Join(sections(), ", "))}
	}
	if why := a.startupFixed(); why != "" && slices.Contains(startupSections, name) {
		return startupErr(name, why) // even one that would change nothing: the section cannot be edited here
	}
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		return err
	}
	in, err := decodeAny(body)
	if err != nil {
		return err
	}
	if err := config.RepeatedKey(body, name); err != nil { // the map kept one copy
		return err
	}
	c, v, err := a.change(a.who(r), r.Method+" "+name, base, func(doc map[string]any) error {
		if r.Method == http.MethodPatch {
			doc[name] = mergePatch(doc[name], in)
		} else {
			doc[name] = in
		}
		if doc[name] == nil {
			delete(doc, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sec, err := a.seal.sectionOf(c, name)
	if err != nil {
		return err
	}
	a.setVersionHeaders(w, c, v)
	writeRaw(w, http.StatusOK, sec)
	return nil
}

// mergePatch applies an RFC 7386 JSON merge patch.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	// A patch key is matched against the target's own keys alone, through
	// their case folds: the patch's keys differ from each other in any case
	// (RepeatedKey refused the body otherwise), and comparing each with
	// every key, the ones the patch had added included, made a patch of n
	// unknown settings cost n*n/2 comparisons under the admin lock (350,000
	// of them, 4 MB: over half an hour).
	var own map[string]string // fold -> the target's key; built at the first key t lacks
	for k, v := range p {
		if _, ok := t[k]; !ok {
			// Settings are matched ignoring case, as a PUT and the config
			// file match them: a patch key in another case is that setting
			// (kept beside it, the two read as one setting given twice).
			if own == nil {
				own = make(map[string]string, len(t))
				for tk := range t {
					own[foldKey(tk)] = tk
				}
			}
			if tk, ok := own[foldKey(k)]; ok {
				k = tk
			}
		}
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}

// foldKey is s with each rune replaced by the least rune of its case
// folding orbit (unicode.SimpleFold): two strings have the same foldKey
// exactly when strings.EqualFold says they are equal.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		b.WriteRune(m)
	}
	return b.String()
}

func (a *Admin) getFleet(w http.ResponseWriter, r *http.Request) error {
	ws := a.fleetView().Workers()
	if ws == nil {
		ws = []WorkerInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": ws, "time": time.Now().UTC()})
	return nil
}

func (a *Admin) getRules(w http.ResponseWriter, r *http.Request) error {
	rs := a.fleetView().RuleHits()
	if rs == nil {
		rs = []RuleHit{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": rs, "time": time.Now().UTC()})
	return nil
}

func (a *Admin) getAudit(w http.ResponseWriter, r *http.Request) error {
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return &httpError{status: http.StatusBadRequest, msg: "limit: want a positive number"}
		}
		limit = n
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": a.audit.list(limit)})
	return nil
}

// Backup is the answer of GET /api/backup.
type Backup struct {
	// Mode is snapshots (--persist-snapshot-dir), redis, or off.
	Mode      string         `json:"mode"`
	Dir       string         `json:"dir,omitempty"`
	Settings  config.Backup  `json:"settings"`
	Snapshots []SnapshotInfo `json:"snapshots"`
}

func (a *Admin) getBackup(w http.ResponseWriter, r *http.Request) error {
	b := Backup{Mode: "off", Settings: a.o.Backup(a.store.Load()), Snapshots: []SnapshotInfo{}}
	switch {
	case a.st.kind() == "redis":
		b.Mode = "redis"
	case a.snaps != nil:
		b.Mode, b.Dir = "snapshots", a.snaps.dir
		list, err := a.snaps.list()
		if err != nil {
			return err
		}
		b.Snapshots = append(b.Snapshots, list...)
	}
	writeJSON(w, http.StatusOK, b)
	return nil
}

func (a *Admin) postBackup(w http.ResponseWriter, r *http.Request) error {
	if a.snaps == nil {
		return &httpError{status: http.StatusConflict, msg: "no snapshot directory (start with --persist-snapshot-dir; with --state redis, Redis keeps the data): use Export to download a snapshot"}
	}
	info, err := a.snapshot(kindManual)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, info)
	return nil
}

func (a *Admin) getExport(w http.ResponseWriter, r *http.Request) error {
	longTransfer(w, false) // up to 64 MiB too
	c, v := a.store.Current()
	now := time.Now().UTC()
	data, err := a.seal.encodeSnapshot(c, v, kindExport, now)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Disposition", `attachment; filename="infera-snapshot-`+now.Format(snapshotTimeLayout)+`.json"`)
	a.setVersionHeaders(w, c, v)
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
	return nil
}

func (a *Admin) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if a.snaps == nil || !snapshotName.MatchString(name) {
		return &httpError{status: http.StatusNotFound, msg: "no such snapshot"}
	}
	path := a.snaps.dir + "/" + name
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
		return &httpError{status: http.StatusNotFound, msg: "no such snapshot"}
	}
	longTransfer(w, false)
	http.ServeFile(w, r, path)
	return nil
}

// postImport restores an uploaded snapshot: it is checked whole (format,
// checksum, every setting) before anything changes; with a snapshot
// directory the current data is first saved as a manual snapshot. With
// --state redis this is "Import to Redis": every replica takes it.
// ?dry_run=1 only validates and lists what would change, with the ETag of
// the config it compared against (for If-Match on the import).
//
// Imports (dry runs too) run one at a time, the body read included: one
// holds up to about 3 times its body live, and with the collector's target
// lowered to GOGC=25 while it runs (lowerGC) grows the heap by about 3.5
// times it (TestAnImportHoldsAFewTimesItsBodyLive,
// TestImportMemoryIsASmallMultipleOfTheBody, BenchmarkImportMemory50000Users),
// and maxSnapshotBytes bounds the body. One waiting for another gives up
// when its client does; one whose body stops arriving is cut after
// importIdleTimeout, so a silent client holds the others up no longer.
func (a *Admin) postImport(w http.ResponseWriter, r *http.Request) error {
	end := longTransfer(w, true) // up to 64 MiB: 60 s cut it below 1.1 MB/s
	release, err := a.takeImportSlot(r)
	if err != nil {
		return err
	}
	defer release()
	if r.ContentLength < 0 || r.ContentLength >= lowGCBodyBytes {
		defer lowerGC()()
	}
	base, err := a.ifMatch(r, false)
	if err != nil {
		return err
	}
	body, err := readImportBody(w, r, maxSnapshotBytes, end)
	if err != nil {
		return err
	}
	in, f, err := decodeSnapshot(body)
	if err == nil {
		err = unknownEnvelopeKey(body)
	}
	if err != nil {
		return err
	}
	// A hand edit of the file the poll has not seen is what the import
	// must be compared with; one that does not parse refuses it (as every
	// write) before the dry run calls it valid or the snapshot is taken.
	if err := a.syncFile(); err != nil {
		return err
	}
	cur, curVer := a.store.Current()
	if a.startupFixed() != "" {
		// Without a config file, or with Redis, the startup sections
		// cannot change (see startupFixed): the import keeps this
		// router's, as a restore keeps the file's.
		cd, err := encodeClear(cur)
		if err != nil {
			return err
		}
		in = withSectionsOf(in, cd, startupSections)
	}
	next, err := a.seal.parseConfig(in, cur)
	if err == nil {
		// What this router's flags make unusable (a worker id --workers
		// also gives, static workers under etcd discovery) is refused here,
		// as the write will refuse it: before the dry run calls the file
		// valid, and before the snapshot taken ahead of the import.
		err = a.store.Check(next)
	}
	if err == nil {
		err = keysCapErr(cur, next)
	}
	if err != nil {
		var fe *config.FieldError
		if errors.As(err, &fe) {
			fe.Path = join("config", fe.Path)
		}
		return err
	}
	dry, err := flagParam(r, "dry_run")
	if err != nil {
		return err
	}
	if dry {
		// The ETag names the config the changes were listed against: an
		// import sent with it applies only if nothing changed meanwhile.
		a.setVersionHeaders(w, cur, curVer)
		// As in the audit log: the first maxAuditChanges changes, and
		// how many more.
		changes, more := diffUpTo(a.seal, cur, next, maxAuditChanges)
		writeJSON(w, http.StatusOK, map[string]any{"valid": true, "snapshot_version": f.Version, "changes": changes, "more": more})
		return nil
	}
	// The current data is saved as a manual snapshot right before the
	// commit that replaces it (changeChecked's before), and the import
	// commits only over the data the snapshot holds: taken ahead of the
	// change, a write landing in between (an import without If-Match
	// applies over it) was replaced without any snapshot holding it. The
	// snapshot is written outside the admin lock (other writes do not
	// wait for its fsync); a write that lands meanwhile makes the import
	// go again on the new data with a new snapshot (or refuses it, with
	// If-Match), and the snapshot no import followed is deleted
	// (preImportSnapshot). An import that changes nothing takes no
	// snapshot (changeChecked commits nothing): a copy of the current
	// data would rotate out a distinct manual snapshot (the operator's
	// own) for nothing.
	var snap *preImportSnapshot
	var before func(cur *config.Config, ver uint64) error
	if a.snaps != nil {
		before = func(cur *config.Config, ver uint64) error {
			if snap.of(cur, ver) {
				return nil
			}
			snap.drop(droppedOvertaken)
			snap = nil
			p, err := a.takePreImportSnapshot(cur, ver)
			if err != nil {
				return fmt.Errorf("cannot save the current data before the import (nothing changed): %w", err)
			}
			snap = p
			return nil
		}
	}
	// Import the config checked above while its base is current; when
	// another change landed since (an import without If-Match), the
	// exact document checked above (sealed secrets opened) over it.
	var nd map[string]any
	c, v, err := a.changeChecked(a.who(r), "import", base, next, curVer, func(doc map[string]any) error {
		if nd == nil {
			var err error
			if nd, err = clearDocOf(next); err != nil {
				return err
			}
		}
		clear(doc)
		for k, val := range nd {
			doc[k] = val
		}
		return nil
	}, before)
	var unavailable *errUnavailable
	if err == nil || errors.As(err, &unavailable) && unavailable.maybeApplied {
		// Imported over the snapshot's data, or maybe (a storage that
		// did not answer in time may still apply it).
		snap.keep()
	} else {
		// Nothing was imported over it: with If-Match, another write
		// landed while it was written; or Close began meanwhile; or the
		// import, made again over such a write, was refused.
		var conflict *errConflict
		switch {
		case errors.Is(err, errClosed):
			snap.drop(droppedShutdown)
		case errors.As(err, &conflict):
			snap.drop(droppedOvertaken)
		default:
			snap.drop(droppedRefused)
		}
	}
	if err != nil {
		var fe *config.FieldError
		if errors.As(err, &fe) {
			// A change landed since the check above: the path is still
			// the snapshot's.
			fe.Path = join("config", fe.Path)
		}
		return err
	}
	// Its audit entry is recorded before the next import starts.
	a.audit.drain()
	etag := a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, map[string]any{"version": v, "etag": etag, "storage": a.st.kind()})
	return nil
}

// takeImportSlot waits for the import slot (a.importing) and returns the
// function that gives it back. A wait ends without it, errLeftWaiting,
// once r's client closed its connection (untilClientLeaves): a client
// that sent its import and left no longer has it run, for nobody, ahead
// of the imports still waiting. The wait is one blocking select: the
// runtime queues the goroutines blocked sending on a channel first in,
// first out, so the slot goes to the waiting imports in their order of
// arrival, which a loop waking to check the client would lose
// (TestQueuedImportsRunInTheirOrderOfArrival).
func (a *Admin) takeImportSlot(r *http.Request) (release func(), err error) {
	release = func() { <-a.importing }
	select {
	case a.importing <- struct{}{}:
		return release, nil
	default:
	}
	ctx, stop := untilClientLeaves(r)
	defer stop()
	select {
	case a.importing <- struct{}{}:
		if context.Cause(ctx) == errLeftWaiting { // both at once: the client left all the same
			release()
			return nil, errLeftWaiting
		}
		return release, nil
	case <-ctx.Done():
		// Either way the client is gone (net/http ends r's context when
		// it sees the connection close).
		return nil, errLeftWaiting
	}
}

// flagParam reads a boolean query parameter: absent is false; present
// with no value, 1, true, yes or on is true; 0, false, no or off is false;
// anything else is refused, so a misspelt dry run never writes.
func flagParam(r *http.Request, name string) (bool, error) {
	q := r.URL.Query()
	if !q.Has(name) {
		return false, nil
	}
	switch v := strings.ToLower(q.Get(name)); v {
	case "", "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	default:
		return false, &config.FieldError{Path: name, Msg: fmt.Sprintf("%s: want true or false (1 or 0)", quoteName(v))}
	}
}

// decodeStrictInto decodes a JSON object into v, refusing unknown fields.
func decodeStrictInto(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			// The name bounded (a body may be one 1 MiB field name), and
			// never the value: it may be a key sent in the wrong field.
			key, _ := strconv.Unquote(f)
			path := config.UnknownFieldPath(data, v, key)
			if path == "" {
				path = key
			}
			return &config.FieldError{Path: path, Msg: "unknown field " + quoteName(key)}
		}
		return &config.FieldError{Msg: "cannot parse the body: " + err.Error()}
	}
	if !atEnd(dec) {
		return &config.FieldError{Msg: "unexpected data after the JSON object"}
	}
	return nil
}

// Wrong admin keys are limited per client address (internal/lockout):
// after maxAuthFailures within authWindow (counted from the first), the
// address gets 429 for authWindow, whatever key it sends.
const (
	maxAuthFailures = 10
	authWindow      = time.Minute
	maxAuthTracked  = lockout.DefaultTracked // addresses tracked one by one
)

func newAuthFailures() *lockout.Guard {
	return lockout.New(lockout.Options{Max: maxAuthFailures, Window: authWindow, Tracked: maxAuthTracked})
}

// hostAllowed reports whether an API request naming host (Host, with or
// without a port) is answered: an IP address, localhost and its
// subdomains, this machine's name, or one of Options.AllowedHosts (a
// leading dot allows the name and its subdomains, "*" any name). A request
// without Host (HTTP/1.0) comes from no browser and is answered.
func (a *Admin) hostAllowed(host string) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if net.ParseIP(host) != nil {
		return true
	}
	host = strings.ToLower(host)
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || host == a.hostname {
		return true
	}
	for _, h := range a.o.AllowedHosts {
		h = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), "."))
		switch {
		case h == "*" || h == host:
			return true
		case strings.HasPrefix(h, ".") && (host == h[1:] || strings.HasSuffix(host, h)):
			return true
		}
	}
	return false
}
