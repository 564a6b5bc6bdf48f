package classify

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cmd is `infera classify`: the reference classifier server of smart model
// selection. Point smart_model_selection.classifier_url at
// http://<host>:<port>/v1/classify.
type Cmd struct {
	Host     string        `help:"Listen address." default:"127.0.0.1" env:"INFERA_CLASSIFY_HOST"`
	Port     int           `help:"Listen port." default:"8090" env:"INFERA_CLASSIFY_PORT"`
	APIKey   string        `name:"api-key" help:"If set, callers must send 'Authorization: Bearer <key>' (smart_model_selection.classifier_api_key)." env:"INFERA_CLASSIFY_API_KEY"`
	L2Bytes  int           `name:"l2-bytes" help:"Texts at least this long (bytes) are at least L2." default:"1500" env:"INFERA_CLASSIFY_L2_BYTES"`
	L3Bytes  int           `name:"l3-bytes" help:"Texts at least this long (bytes) are L3." default:"6000" env:"INFERA_CLASSIFY_L3_BYTES"`
	Keywords []string      `help:"Words or phrases marking a demanding request (case-insensitive; one makes L2, two make L3). Empty uses the built-in list." env:"INFERA_CLASSIFY_KEYWORDS" sep:","`
	Delay    time.Duration `help:"Wait this long before answering (to exercise the router's classifier timeout)." default:"0s" env:"INFERA_CLASSIFY_DELAY"`
}

// Heuristic returns the heuristic the flags describe.
func (c *Cmd) Heuristic() (Heuristic, error) {
	if c.L2Bytes < 0 || c.L3Bytes < c.L2Bytes {
		return Heuristic{}, fmt.Errorf("want 0 <= --l2-bytes <= --l3-bytes, got %d and %d", c.L2Bytes, c.L3Bytes)
	}
	if c.Delay < 0 {
		return Heuristic{}, errors.New("--delay must be >= 0")
	}
	h := Heuristic{L2Bytes: c.L2Bytes, L3Bytes: c.L3Bytes}
	for _, k := range c.Keywords {
		// A keyword given twice (in any case) is still one keyword: two
		// distinct ones make L3.
		if k = strings.TrimSpace(k); k != "" && !slices.ContainsFunc(h.Keywords, func(o string) bool { return strings.EqualFold(o, k) }) {
			h.Keywords = append(h.Keywords, k)
		}
	}
	if len(h.Keywords) == 0 {
		h.Keywords = DefaultKeywords
	}
	return h, nil
}

// Run serves until SIGINT or SIGTERM.
func (c *Cmd) Run() error {
	h, err := c.Heuristic()
	if err != nil {
		return err
	}
	addr := net.JoinHostPort(c.Host, strconv.Itoa(c.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	srv := NewServer(h, c.APIKey, c.Delay)
	slog.Info("infera classify listening", "addr", ln.Addr().String(), "path", ClassifyPath,
		"l2_bytes", h.L2Bytes, "l3_bytes", h.L3Bytes, "keywords", len(h.Keywords), "auth", c.APIKey != "")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case err := <-errc:
		return err
	case s := <-sig:
		slog.Info("infera classify stopping", "signal", s.String())
	}
	return srv.Close()
}

// ClassifyPath is where the reference server answers.
const ClassifyPath = "/v1/classify"

// maxRequestBytes bounds a classification request (the router cuts texts
// to max_text_bytes, at most 16 MiB).
const maxRequestBytes = 17 << 20

// NewServer returns the reference classifier as an *http.Server (call
// Serve with a listener): POST ClassifyPath answers {"tier":...} by h,
// GET /health answers 200. apiKey, when set, is required as a bearer
// token; delay is waited before each answer.
func NewServer(h Heuristic, apiKey string, delay time.Duration) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	want := []byte("Bearer " + apiKey)
	mux.HandleFunc(ClassifyPath, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			writeErr(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		if apiKey != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeErr(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		var in struct {
			Model     string `json:"model"`
			Text      string `json:"text"`
			TextBytes int    `json:"text_bytes"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes))
		if err := dec.Decode(&in); err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				writeErr(w, http.StatusRequestEntityTooLarge, "request body too large")
				return
			}
			writeErr(w, http.StatusBadRequest, `want a JSON object {"model":string,"text":string,"text_bytes":int}`)
			return
		}
		if _, err := dec.Token(); err != io.EOF { // More is false before a stray '}'
			if errors.As(err, new(*http.MaxBytesError)) {
				writeErr(w, http.StatusRequestEntityTooLarge, "request body too large")
				return
			}
			writeErr(w, http.StatusBadRequest, "unexpected data after the JSON object")
			return
		}
		tier := h.Classify(in.Text, in.TextBytes)
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "{\"tier\":%q}\n", tier.String())
	})
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
	}
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg}})
	w.Write(append(b, '\n'))
}
