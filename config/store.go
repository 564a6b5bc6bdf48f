package config

import (
	"bytes"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

var (
	reloadsOK     = metrics.NewCounter(`infera_config_reloads_total{result="ok"}`)
	reloadsFailed = metrics.NewCounter(`infera_config_reloads_total{result="error"}`)
)

// Store holds the current Config behind an atomic pointer.
//
// The request path calls Load once per request. Reload builds a new Config
// from the file and swaps it in only when it is valid.
type Store struct {
	path string
	cur  atomic.Pointer[Config]

	mu       sync.Mutex // serializes reloads
	lastData []byte
	lastMod  time.Time
	lastSize int64
	onChange []func(old, cur *Config)
}

// NewStore returns a store serving c (Default() when nil).
// path may be empty: then Reload is a no-op.
func NewStore(path string, c *Config) *Store {
	if c == nil {
		c = Default()
	}
	s := &Store{path: path}
	s.cur.Store(c)
	return s
}

// Open reads the config file at path (when non-empty) and returns a Store.
func Open(path string) (*Store, error) {
	if path == "" {
		return NewStore("", nil), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, err
	}
	s := NewStore(path, c)
	s.lastData = data
	if fi, err := os.Stat(path); err == nil {
		s.lastMod, s.lastSize = fi.ModTime(), fi.Size()
	}
	return s, nil
}

// Load returns the current snapshot. It never returns nil.
func (s *Store) Load() *Config { return s.cur.Load() }

// Path returns the config file path.
func (s *Store) Path() string { return s.path }

// Set swaps in c (already validated) and runs change hooks.
func (s *Store) Set(c *Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.swap(c)
}

func (s *Store) swap(c *Config) {
	old := s.cur.Swap(c)
	for _, f := range s.onChange {
		f(old, c)
	}
}

// OnChange registers f to run after every successful swap (under the reload lock).
func (s *Store) OnChange(f func(old, cur *Config)) {
	s.mu.Lock()
	s.onChange = append(s.onChange, f)
	s.mu.Unlock()
}

// Reload re-reads the file. An invalid file is rejected with a logged reason
// and the previous config keeps serving. It returns true when a new config
// was swapped in.
func (s *Store) Reload() (bool, error) {
	if s.path == "" {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path)
	if err != nil {
		reloadsFailed.Inc()
		slog.Error("config reload rejected; keeping previous config", "path", s.path, "err", err)
		return false, err
	}
	if bytes.Equal(data, s.lastData) {
		return false, nil
	}
	s.lastData = data
	c, err := Parse(data)
	if err != nil {
		reloadsFailed.Inc()
		slog.Error("config reload rejected; keeping previous config", "path", s.path, "err", err)
		return false, err
	}
	s.swap(c)
	reloadsOK.Inc()
	slog.Info("config reloaded", "path", s.path)
	return true, nil
}

// Watch reloads on SIGHUP and whenever the file's mtime or size changes
// (polled every interval), until stop is closed.
func (s *Store) Watch(interval time.Duration, stop <-chan struct{}) {
	if s.path == "" {
		return
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time // interval <= 0: reload on SIGHUP only
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-stop:
			return
		case <-hup:
			s.Reload()
		case <-tick:
			fi, err := os.Stat(s.path)
			if err != nil {
				continue
			}
			s.mu.Lock()
			changed := !fi.ModTime().Equal(s.lastMod) || fi.Size() != s.lastSize
			s.lastMod, s.lastSize = fi.ModTime(), fi.Size()
			s.mu.Unlock()
			if changed {
				s.Reload()
			}
		}
	}
}
