package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

var (
	reloadsOK     = metrics.NewCounter(`infera_config_reloads_total{result="ok"}`)
	reloadsFailed = metrics.NewCounter(`infera_config_reloads_total{result="error"}`)
	appliesOK     = metrics.NewCounter(`infera_config_applies_total{result="ok"}`)
	appliesFailed = metrics.NewCounter(`infera_config_applies_total{result="error"}`)
)

// Store holds the current Config behind an atomic pointer, with a version
// that grows by one on every change.
//
// The request path calls Load once per request. Every change, whether a
// file reload (Reload, Watch), an admin API write (Apply) or a replica
// catching up with shared storage (Replace), builds a new Config and swaps
// the pointer under one lock, then runs the OnChange hooks.
//
// When the store has a path, Apply writes the new config back to the file
// atomically (temp file, fsync, rename, fsync of the directory), so a
// restart keeps it and the file stays the single source of truth. A hand
// edit of the file that has not been reloaded yet is picked up first, which
// bumps the version: the API write then carries a stale version and gets a
// *VersionConflict, so a hand edit is never overwritten silently.
type Store struct {
	path string
	cur  atomic.Pointer[Config]
	ver  atomic.Uint64

	mu sync.Mutex // serializes every change
	// lastSum is the digest of the file bytes the current config came
	// from or was written as, and lastCfg a config with their settings
	// (read from them, or written as them; the one serving when it has
	// them, so that no other is kept): the bytes themselves, kept to tell
	// a hand edit, were as large as the config (an import of 50,000 users
	// kept 11 MB of them besides the config).
	lastSum  fileSum
	lastCfg  *Config
	badData  []byte    // file bytes that did not parse, already reported (nil: none)
	badErr   error     // why badData was refused
	lastStat fileStamp // the file as the poll last saw it
	onChange []func(old, cur *Config)
	// sink, when set, receives configs read from the file instead of a local
	// swap (shared storage: the change comes back through Replace).
	sink func(c *Config, refsOnly bool) error
	// storing counts the reloads whose config the sink is storing (its
	// bytes are lastSum's already, but do not serve yet); refsRefused is a
	// rotation (the references read again) the sink could not store.
	storing     int
	refsRefused bool
	// check, when set, is what a config must pass beyond Validate (SetCheck).
	check func(c *Config) error
	// codec seals the literal secrets Apply writes to the file and opens
	// them when it is read (OpenWith); nil writes them in clear.
	codec SecretCodec
}

// VersionConflict is returned by Apply when the caller's version is not
// the current one: someone else changed the config in between.
type VersionConflict struct {
	Want, Have uint64
	// Reason says what happened (for example a hand edit of the file).
	Reason string
}

func (e *VersionConflict) Error() string {
	if e.Want == e.Have && e.Reason != "" {
		return fmt.Sprintf("config version %d cannot be written: %s", e.Have, e.Reason) // not a newer version: the file
	}
	msg := fmt.Sprintf("config changed since version %d (now %d): reload and retry", e.Want, e.Have)
	if e.Reason != "" {
		msg += "; " + e.Reason
	}
	return msg
}

// NewStore returns a store serving c (Default() when nil) at version 1.
// path may be empty: then Reload is a no-op and Apply writes no file.
func NewStore(path string, c *Config) *Store {
	if c == nil {
		c = Default()
	}
	s := &Store{path: path}
	s.cur.Store(c)
	s.ver.Store(1)
	return s
}

// Open reads the config file at path (when non-empty) and returns a Store.
func Open(path string) (*Store, error) { return OpenWith(path, nil) }

// OpenWith is Open for a store whose file writes seal literal secrets with
// codec (nil: written in clear), and whose reads open them (ParseWith).
func OpenWith(path string, codec SecretCodec) (*Store, error) {
	if path == "" {
		s := NewStore("", nil)
		s.codec = codec
		return s, nil
	}
	// The file's stamp is taken before it is read: an edit that lands in
	// between changes the stamp after the one kept, so the watch reads it.
	var st fileStamp
	if fi, err := os.Stat(path); err == nil {
		st = stampOf(fi)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseWith(data, codec)
	if err != nil {
		return nil, err
	}
	s := NewStore(path, c)
	s.codec = codec
	s.lastSum, s.lastCfg, s.lastStat = sumOf(data), c, st
	return s, nil
}

// Load returns the current snapshot. It never returns nil.
func (s *Store) Load() *Config { return s.cur.Load() }

// Path returns the config file path.
func (s *Store) Path() string { return s.path }

// Version returns the version of the current snapshot.
func (s *Store) Version() uint64 { return s.ver.Load() }

// Current returns the current snapshot and its version as one consistent pair.
func (s *Store) Current() (*Config, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Load(), s.ver.Load()
}

// Set swaps in c (already validated), bumps the version and runs change
// hooks. It writes no file; admin writes go through Apply.
func (s *Store) Set(c *Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.swap(c, s.ver.Load()+1)
}

// Replace swaps in c at the given version (a replica adopting a change made
// elsewhere, or a restored snapshot). It writes no file.
func (s *Store) Replace(c *Config, version uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.swap(c, version)
}

// Lock must be held.
func (s *Store) swap(c *Config, version uint64) {
	old := s.cur.Swap(c)
	s.ver.Store(version)
	if old != nil && slog.Default().Enabled(context.Background(), slog.LevelDebug) {
		// Section names only: a section's values may hold keys.
		slog.Debug("config changed", "version", version, "sections", ChangedSections(old, c))
	}
	for _, f := range s.onChange {
		f(old, c)
	}
}

// OnChange registers f to run after every successful swap (under the store lock).
func (s *Store) OnChange(f func(old, cur *Config)) {
	s.mu.Lock()
	s.onChange = append(s.onChange, f)
	s.mu.Unlock()
}

// SetCheck makes every change read from the file or written through Apply
// pass f as well as Validate before it is swapped in or stored: settings
// that only this process's flags make unusable (a static worker id its
// request transport cannot address), which would otherwise be accepted and
// then skipped. f returns a *FieldError.
func (s *Store) SetCheck(f func(c *Config) error) {
	s.mu.Lock()
	s.check = f
	s.mu.Unlock()
}

// Check runs Validate and the check of SetCheck on c: for a change stored
// elsewhere (Redis) that comes back through Replace, which checks nothing.
func (s *Store) Check(c *Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	check := s.check
	s.mu.Unlock()
	if check != nil {
		return check(c)
	}
	return nil
}

// parseLocked parses file bytes and runs the check. Lock must be held.
func (s *Store) parseLocked(data []byte) (*Config, error) {
	c, err := ParseWith(data, s.codec)
	if err == nil && s.check != nil {
		err = s.check(c)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// SetReloadSink makes file reloads hand the parsed config to f instead of
// swapping it in: with shared storage (Redis) a hand edit of the file
// becomes a write to the storage, and comes back to every replica through
// Replace. refsOnly is true when the file did not change and was read again
// only to resolve its secret references again (ReloadAsked, a rotated key):
// then c is no change of the shared data. nil restores local swaps.
func (s *Store) SetReloadSink(f func(c *Config, refsOnly bool) error) {
	s.mu.Lock()
	s.sink = f
	s.mu.Unlock()
}

// CountApply counts one admin API write in infera_config_applies_total:
// result ok when it made a new version, error when it was refused (an
// invalid value, a stale If-Match, a write the storage refused). The admin
// counts its writes, whatever the storage; Apply counts nothing.
func CountApply(ok bool) {
	if ok {
		appliesOK.Inc()
	} else {
		appliesFailed.Inc()
	}
}

// Apply validates c and swaps it in when ifVersion is the current version
// (ifVersion 0 skips the check), writing it back to the config file first
// when the store has one. It returns the new version.
//
// A file edited by hand since the last reload is reloaded before the
// version check (so the caller's version is stale and it gets a
// *VersionConflict); a hand-edited file that does not parse refuses the
// write, since overwriting it would destroy someone's edit.
func (s *Store) Apply(c *Config, ifVersion uint64) (uint64, error) {
	if err := c.Validate(); err != nil {
		return 0, err
	}
	return s.apply(c, ifVersion, true)
}

// ApplyChecked is Apply of a config that Check accepted and that has not
// changed since: Validate and the check of SetCheck, which depend on
// nothing but c (the check is set once, at start), are not run again. An
// admin import checks its config before its dry run answers and before
// the snapshot taken ahead of it; Apply then ran both again (for 50,000
// users each Validate allocates about 3.5 MB).
func (s *Store) ApplyChecked(c *Config, ifVersion uint64) (uint64, error) {
	return s.apply(c, ifVersion, false)
}

// apply is Apply once c is valid, running the check of SetCheck if check.
func (s *Store) apply(c *Config, ifVersion uint64, check bool) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if check && s.check != nil {
		if err := s.check(c); err != nil {
			return 0, err
		}
	}
	if s.path != "" && s.sink == nil {
		if err := s.pickUpHandEditLocked(); err != nil {
			return 0, &VersionConflict{Want: ifVersion, Have: s.ver.Load(), Reason: err.Error()}
		}
	}
	if have := s.ver.Load(); ifVersion != 0 && ifVersion != have {
		return 0, &VersionConflict{Want: ifVersion, Have: have}
	}
	if s.path != "" && s.sink == nil {
		sum, err := writeFileOf(s.path, c, s.codec)
		if err != nil {
			return 0, fmt.Errorf("cannot write config back to %q (the change was not applied): %w", s.path, err)
		}
		s.lastSum, s.lastCfg, s.badData = sum, c, nil
		if fi, err := os.Stat(s.path); err == nil {
			s.lastStat = stampOf(fi)
		}
	}
	v := s.ver.Load() + 1
	s.swap(c, v)
	return v, nil
}

// pickUpHandEditLocked reloads the file if its bytes differ from the last
// ones seen. Lock must be held.
func (s *Store) pickUpHandEditLocked() error {
	var st fileStamp
	fi, statErr := os.Stat(s.path) // before the read (see Open)
	if statErr == nil {
		st = stampOf(fi)
	}
	if s.fileUnchangedLocked() {
		return nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("cannot read config file %q: %v", s.path, err)
	}
	sum := sumOf(data)
	if sum == s.lastSum {
		return nil
	}
	c, err := s.parseLocked(data)
	if err != nil {
		return fmt.Errorf("the config file %q was edited by hand and does not parse (%v): fix or revert it first", s.path, err)
	}
	same := s.sameSettingsLocked(c) && SameSecrets(c, s.cur.Load())
	s.lastSum, s.badData = sum, nil
	if !same {
		s.lastCfg = c // swapped in below; else lastCfg has c's settings
	}
	if statErr == nil {
		s.lastStat = st
	}
	if same {
		return nil // rewritten, not changed (see sameSettingsLocked)
	}
	s.swap(c, s.ver.Load()+1)
	reloadsOK.Inc()
	slog.Info("config reloaded (hand edit found before an admin write)", "path", s.path, "version", s.ver.Load())
	return nil
}

// MarshalFile renders c as the config file Apply writes: indented JSON
// with every setting spelled out in field order, literal secrets in clear
// (MarshalFileWith seals them; references such as env:NAME stay
// references), ending in a newline.
func MarshalFile(c *Config) ([]byte, error) { return MarshalFileWith(c, nil) }

// MarshalFileWith is MarshalFile with literal secrets sealed by codec,
// each for its entry and address (nil: in clear).
func MarshalFileWith(c *Config, codec SecretCodec) ([]byte, error) {
	data, err := compactOf(c, codec)
	if err != nil {
		return nil, err
	}
	// Indented into a slice of its exact size: json.Indent makes room for
	// twice the compact form, and the store keeps the file's bytes (a
	// file of 11 MB held 25 MB, and writing it made the heap of an import
	// of 50,000 users grow by 47 MB).
	out := appendIndent(make([]byte, 0, indentedLen(data)+1), data)
	return append(out, '\n'), nil
}

// compactOf is the compact encoding of c the config file holds, with
// literal secrets sealed by codec (nil: in clear).
func compactOf(c *Config, codec SecretCodec) ([]byte, error) {
	if codec != nil {
		return EncodeBound(c, codec.Seal)
	}
	return EncodeJSON(c, nil)
}

// writeFileOf writes c to the config file at path as MarshalFileWith
// renders it, atomically (WriteFileAtomic), and returns the sum of the
// bytes written: the file is indented as it is written, so that only the
// compact encoding is held, not the file's bytes too.
func writeFileOf(path string, c *Config, codec SecretCodec) (fileSum, error) {
	data, err := compactOf(c, codec)
	if err != nil {
		return fileSum{}, err
	}
	h := sha256.New()
	n := 0
	err = writeFileAtomic(path, 0o644, func(f io.Writer) error {
		w := indenter{dst: make([]byte, 0, indentChunk+64), out: io.MultiWriter(f, h)}
		w.indent(data)
		w.put('\n')
		w.flush()
		n = w.n
		return w.err
	})
	if err != nil {
		return fileSum{}, err
	}
	if n == 0 {
		return fileSum{}, nil
	}
	sum := fileSum{n: n}
	h.Sum(sum.sum[:0])
	return sum, nil
}

// indentChunk is how many indented bytes an indenter with out holds
// before it writes them.
const indentChunk = 64 << 10

// appendIndent appends valid JSON src, with no white space after its
// value, indented as json.Indent(dst, src, "", "  ") indents it.
func appendIndent(dst, src []byte) []byte {
	w := indenter{dst: dst}
	w.indent(src)
	return w.dst
}

// indentedLen is len(appendIndent(nil, src)).
func indentedLen(src []byte) int {
	w := indenter{count: true}
	w.indent(src)
	return w.n
}

// indenter writes src indented (into dst), or only counts the bytes it
// would write (count: into n), so the size and the bytes come from one
// walk of the JSON. With out, dst is written to out whenever it holds
// indentChunk bytes (and by flush), n counting what was written.
type indenter struct {
	dst   []byte
	n     int
	count bool
	out   io.Writer
	err   error // out's first error
}

func (w *indenter) put(b ...byte) {
	if w.count {
		w.n += len(b)
		return
	}
	w.dst = append(w.dst, b...)
	if w.out != nil && len(w.dst) >= indentChunk {
		w.flush()
	}
}

func (w *indenter) newline(depth int) {
	if w.count {
		w.n += 1 + 2*depth
		return
	}
	w.dst = append(w.dst, '\n')
	for range depth {
		w.dst = append(w.dst, ' ', ' ')
	}
	if w.out != nil && len(w.dst) >= indentChunk {
		w.flush()
	}
}

// flush writes dst to out.
func (w *indenter) flush() {
	if w.err == nil {
		_, w.err = w.out.Write(w.dst)
	}
	w.n += len(w.dst)
	w.dst = w.dst[:0]
}

func (w *indenter) indent(src []byte) {
	depth := 0
	open := false // after '{' or '[': an empty one stays {} or []
	inString, escaped := false, false
	for _, c := range src {
		if !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
			continue // as json.Indent, which takes any valid JSON
		}
		if open && c != '}' && c != ']' {
			open = false
			depth++
			w.newline(depth)
		}
		switch {
		case escaped:
			escaped = false
		case inString:
			escaped = c == '\\'
			inString = c != '"'
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			open = true
		case c == ',':
			w.put(c)
			w.newline(depth)
			continue
		case c == ':':
			w.put(c, ' ')
			continue
		case c == '}' || c == ']':
			if open {
				open = false
			} else {
				depth--
				w.newline(depth)
			}
		}
		w.put(c)
	}
}

var (
	secretType        = reflect.TypeFor[Secret]()
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// EncodeBound is EncodeJSON with each literal secret replaced by what f
// makes of it, knowing the entry and address it belongs to
// (AppendSecretSlots).
func EncodeBound(c *Config, f func(owner, address, key string) (string, error)) ([]byte, error) {
	slots := c.AppendSecretSlots(nil)
	return EncodeJSON(c, func(path, key string) (string, error) {
		for i := range slots {
			if slots[i].Path == path {
				return f(slots[i].Owner, slots[i].Address, key)
			}
		}
		return "", fmt.Errorf("BUG: secret %s is not among AppendSecretSlots", path)
	})
}

// EncodeJSON encodes c as compact JSON, fields in declaration order, as
// encoding/json would except for literal secrets: a Secret holding a key
// (not an env:/file: reference) is written as literal(path, key), where
// path is the setting's JSON path (split_proxy.proxies[1].api_key); nil
// literal writes the key itself. json.Marshal(c) writes "***" instead,
// which Parse refuses, so use EncodeJSON for anything that is parsed back.
func EncodeJSON(c *Config, literal func(path, key string) (string, error)) ([]byte, error) {
	// Sized like the last encoding: a large config is encoded several
	// times per admin write, and growing the buffer copied it each time.
	hint := encodeHintFor(c.Users)
	b, err := encodeValue(make([]byte, 0, hint+hint/8+512), reflect.ValueOf(c).Elem(), "", literal)
	if err != nil {
		return nil, fmt.Errorf("cannot encode config: %w", err)
	}
	if len(c.Users) >= hintUsers {
		encodeSizeHint.Store(&encodedSize{bytes: len(b), users: len(c.Users)})
	}
	return b, nil
}

// encodedSize is the length of an EncodeJSON and the users of its config.
type encodedSize struct{ bytes, users int }

// encodeSizeHint is the encodedSize of the last EncodeJSON of a config of
// at least hintUsers users.
var encodeSizeHint atomic.Pointer[encodedSize]

// hintUsers is how many users a config must have for its encoding to tell
// the size of one user's.
const hintUsers = 100

// encodeHintFor is the size to reserve for encoding a config of users:
// that of the last large one's encoding, scaled by the users (the bulk of
// a large config). Reserving the last size whatever the config made the
// encoding of an empty config after one of 50,000 users hold 9 MB (an
// import's audit entry encodes both, the old one first), and the next
// encoding of the 50,000 grow from the small one's size (reallocated at
// every step: 100 MB allocated by an import's encodings). Before any
// large encoding (a router started on a small config that takes an import
// of many users) it is what the users take written as EncodeJSON writes
// them (usersJSONLen): starting from 512 bytes, the first encoding grew a
// quarter at a time, which allocated about five times what it wrote.
func encodeHintFor(users []User) int {
	h := encodeSizeHint.Load()
	if h == nil {
		if len(users) < hintUsers {
			return 0
		}
		return usersJSONLen(users)
	}
	return int(int64(h.bytes) * int64(len(users)+1) / int64(h.users+1))
}

// usersJSONLen is about the length of users encoded as EncodeJSON encodes
// them (encoding/json's field order and names): at most two bytes a user
// over it when no string needs an escape (user names and key hashes never
// do), short by the escapes otherwise.
func usersJSONLen(users []User) int {
	// {"name":"","keys":[],"template":"","enabled":false}, and a comma
	// between users.
	const fixed = len(`{"name":"","keys":[],"template":"","enabled":false},`)
	n := 2
	for i := range users {
		u := &users[i]
		n += fixed + len(u.Name) + len(u.Template)
		for _, k := range u.Keys {
			n += len(k) + 3
		}
		if len(u.Models) > 0 {
			n += len(`,"models":[]`)
			for _, m := range u.Models {
				n += len(m) + 3
			}
		}
	}
	return n
}

func encodeValue(b []byte, v reflect.Value, path string, literal func(path, key string) (string, error)) ([]byte, error) {
	t := v.Type()
	if plainEncoding && plainType(t) {
		// No secret below: encoding/json writes what the walk below would,
		// without a path string and a Marshal call per setting (a users
		// list of 10,000 took millions of allocations per encoding).
		return appendPlain(b, v)
	}
	if t == secretType {
		s := v.Interface().(Secret)
		out := s.String()
		if out == RedactedSecret {
			out = s.Reveal()
			if literal != nil {
				var err error
				if out, err = literal(path, out); err != nil {
					return nil, err
				}
			}
		}
		return appendJSON(b, out)
	}
	if t.Implements(marshalerType) || reflect.PointerTo(t).Implements(marshalerType) && v.CanAddr() {
		return appendJSON(b, v.Interface())
	}
	switch v.Kind() {
	case reflect.Struct:
		b = append(b, '{')
		first := true
		var err error
		if b, err = encodeFields(b, v, path, literal, &first); err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	case reflect.Slice:
		if v.IsNil() {
			return append(b, "null"...), nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			return appendJSON(b, v.Interface())
		}
		fallthrough
	case reflect.Array:
		b = append(b, '[')
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = encodeValue(b, v.Index(i), fmt.Sprintf("%s[%d]", path, i), literal); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return append(b, "null"...), nil
		}
		return encodeValue(b, v.Elem(), path, literal)
	case reflect.Map:
		if v.IsNil() {
			return append(b, "null"...), nil
		}
		if t.Key().Kind() != reflect.String {
			return appendJSON(b, v.Interface())
		}
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, k.String()); err != nil {
				return nil, err
			}
			b = append(b, ':')
			if b, err = encodeValue(b, v.MapIndex(k), joinPath(path, k.String()), literal); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return appendJSON(b, v.Interface())
}

// encodeFields writes the exported fields of struct v (embedded structs
// without a tag inline) as encoding/json names them.
func encodeFields(b []byte, v reflect.Value, path string, literal func(path, key string) (string, error), first *bool) ([]byte, error) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		fv := v.Field(i)
		if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
			var err error
			if b, err = encodeFields(b, fv, path, literal, first); err != nil {
				return nil, err
			}
			continue
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		if strings.Contains(opts, "omitempty") && isEmptyValue(fv) {
			continue
		}
		if !*first {
			b = append(b, ',')
		}
		*first = false
		var err error
		if b, err = appendJSON(b, name); err != nil {
			return nil, err
		}
		b = append(b, ':')
		if b, err = encodeValue(b, fv, joinPath(path, name), literal); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// plainEncoding lets encodeValue hand plain types to encoding/json (a
// test turns it off to compare with the walk).
var plainEncoding = true

// plainTypes caches plainType.
var plainTypes sync.Map // reflect.Type -> bool

// plainType reports whether encoding/json encodes a value of type t exactly
// as encodeValue's walk does, and a pointer to it as the value: no Secret
// and no JSON or text marshaler anywhere in it, no interface (whose value could hold one), no embedded field, and
// maps keyed by strings.
func plainType(t reflect.Type) bool {
	if p, ok := plainTypes.Load(t); ok {
		return p.(bool)
	}
	p := plainTypeIn(t, map[reflect.Type]bool{})
	plainTypes.Store(t, p)
	return p
}

func plainTypeIn(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == secretType || t.Implements(marshalerType) || reflect.PointerTo(t).Implements(marshalerType) ||
		t.Implements(textMarshalerType) || reflect.PointerTo(t).Implements(textMarshalerType) {
		return false
	}
	if seen[t] {
		return true // a recursive type: decided by its other parts
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return plainTypeIn(t.Elem(), seen)
	case reflect.Map:
		return t.Key().Kind() == reflect.String && plainTypeIn(t.Elem(), seen)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			if sf.Anonymous {
				return false
			}
			if !sf.IsExported() || sf.Tag.Get("json") == "-" {
				continue
			}
			if !plainTypeIn(sf.Type, seen) {
				return false
			}
		}
		return true
	}
	return false
}

func isEmptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Struct:
		return false
	}
	return v.IsZero()
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// appendPlain appends rv, of a plain type, as json.Marshal encodes it,
// without Marshal's copy of the whole encoding. A list is encoded member
// by member, so encoding/json's buffer holds one member, not the whole
// list (its pool is emptied by every GC, and regrowing it for a list of
// 10,000 users cost twice the list per encoding).
//
// encoding/json is handed a pointer to the value where it lies (a list's
// members always, others when addressable): Interface of an addressable
// struct copies it to the heap, which was one allocation of a User per
// user and per encoding. A plain type has no marshaler, on its values
// or its pointers, so the pointer encodes as the value.
func appendPlain(b []byte, rv reflect.Value) ([]byte, error) {
	w := appendWriter{b: b}
	enc := json.NewEncoder(&w)
	if rv.Kind() != reflect.Slice || rv.IsNil() || rv.Type().Elem().Kind() == reflect.Uint8 {
		if err := enc.Encode(inPlace(rv)); err != nil {
			return nil, err
		}
		return w.b[:len(w.b)-1], nil // Encode ends the value with a newline
	}
	w.b = append(w.b, '[')
	for i := range rv.Len() {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		if err := enc.Encode(rv.Index(i).Addr().Interface()); err != nil {
			return nil, err
		}
		w.b = w.b[:len(w.b)-1]
	}
	return append(w.b, ']'), nil
}

// inPlace is a pointer to rv when it is addressable, else rv's value.
func inPlace(rv reflect.Value) any {
	if rv.CanAddr() {
		return rv.Addr().Interface()
	}
	return rv.Interface()
}

type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func appendJSON(b []byte, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, data...), nil
}

// WriteFileAtomic writes data to path so that readers see either the old
// file or the whole new one, also after a crash: a temporary file in the
// same directory is written and fsynced, renamed over path, and the
// directory is fsynced so the rename itself is durable. An existing file
// keeps its permissions; a new one gets perm. When path is a symlink, the
// file it points to is written (in that file's directory) and the link
// stays, as editors do.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return writeFileAtomic(path, perm, func(f io.Writer) error {
		_, err := f.Write(data)
		return err
	})
}

// writeFileAtomic is WriteFileAtomic of what write writes to the file.
func writeFileAtomic(path string, perm os.FileMode, write func(f io.Writer) error) (err error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			return fmt.Errorf("cannot follow the symlink %q: %w", path, err)
		}
		path = target
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(path); err == nil {
		perm = fi.Mode().Perm()
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, derr := os.Open(dir)
	if derr != nil {
		return nil // renamed; durability of the rename is best effort here
	}
	d.Sync()
	d.Close()
	return nil
}

// Reload re-reads the file. An invalid file is rejected with a logged reason
// and the previous config keeps serving. It returns true when a new config
// was swapped in (or handed to the reload sink). Refused bytes are reported
// once: while the file keeps them, Reload returns false and no error (the
// poll calls it every --config-poll).
func (s *Store) Reload() (bool, error) { return s.reload(false) }

// ReloadAsked is Reload for an operator's request (SIGHUP): a file whose
// bytes were already refused is refused again, logged, counted and
// returned, so the answer (systemd's STATUS=) says the file is not the
// config serving.
func (s *Store) ReloadAsked() (bool, error) { return s.reload(true) }

// Refused returns why the file was refused when it still holds the bytes
// a reload refused (they were reported once; the config serving is not the
// file's), else nil.
func (s *Store) Refused() error {
	if s.path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.badData == nil {
		return nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return err
	}
	if bytes.Equal(data, s.badData) {
		return s.badErr
	}
	return nil
}

// FileServes reports whether the config file holds what serves: it can
// be read, its bytes are those last read or written and not ones a reload
// refused (a refused rotation of a secret file keeps its bytes refused
// until a reload asked for takes the key; a change the reload sink could
// not store is not the last read until a poll stores it). True without a
// file.
func (s *Store) FileServes() bool {
	if s.path == "" {
		return true
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.storing > 0 || s.refsRefused || s.badData != nil && bytes.Equal(data, s.badData) {
		return false
	}
	return sumOf(data) == s.lastSum
}

func (s *Store) reload(asked bool) (bool, error) {
	if s.path == "" {
		return false, nil
	}
	s.mu.Lock()
	if !asked && s.fileUnchangedLocked() {
		// As below for bytes read whole and found unchanged.
		s.badData, s.badErr = nil, nil
		s.mu.Unlock()
		return false, nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		s.mu.Unlock()
		reloadsFailed.Inc()
		slog.Error("config reload rejected; keeping previous config", "path", s.path, "err", err)
		return false, err
	}
	sum := sumOf(data)
	unchanged := sum == s.lastSum
	if unchanged && !(asked && hasSecretRefs(data)) {
		// A broken edit reverted: the same broken bytes again later are a
		// new edit, to be reported and counted again.
		s.badData, s.badErr = nil, nil
		s.mu.Unlock()
		return false, nil // unchanged (a reload asked for resolves env: and file: references again: a rotated key)
	}
	if s.badData != nil && bytes.Equal(data, s.badData) && !(asked && hasSecretRefs(data)) {
		// (A reload asked for reads the references again: the key file
		// a refused rotation named may be fixed now. Their refusal was
		// answered again and again, with the key file fixed, until the
		// config file itself changed.)
		err := s.badErr
		s.mu.Unlock()
		if !asked {
			return false, nil // the broken bytes already reported
		}
		reloadsFailed.Inc()
		slog.Error("config reload rejected; keeping previous config", "path", s.path, "err", err)
		return false, err
	}
	c, err := s.parseLocked(data)
	if err != nil {
		// lastSum stays the good file's: an admin write must still see
		// this hand edit as unapplied and refuse to overwrite it.
		s.badData, s.badErr = data, err
		s.mu.Unlock()
		reloadsFailed.Inc()
		slog.Error("config reload rejected; keeping previous config", "path", s.path, "err", err)
		return false, err
	}
	if !unchanged && s.sameSettingsLocked(c) {
		// Rewritten with the same settings (re-indented, keys reordered,
		// written again by a deployment tool, sealed keys replaced by the
		// same keys in clear): no edit. Only its references may resolve to
		// other keys, as at a SIGHUP. (It made a version with no change,
		// turning every ETag an operator held stale, and with --state
		// redis it overwrote every change made through the API since the
		// file was written, on every replica.)
		unchanged = true
	}
	s.lastSum, s.badData, s.refsRefused = sum, nil, false
	if !unchanged {
		s.lastCfg = c // else lastCfg has c's settings; c is kept if it serves (below)
	}
	if unchanged && s.sink == nil && SameSecrets(c, s.cur.Load()) {
		// Read again only for its references, and none resolves to
		// another key: no new version (it made every ETag an operator
		// held stale at each log rotation's SIGHUP).
		s.mu.Unlock()
		return false, nil
	}
	if sink := s.sink; sink != nil {
		// The sink writes to shared storage and comes back through Replace,
		// which takes the lock.
		s.storing++
		s.mu.Unlock()
		err := sink(c, unchanged)
		s.mu.Lock()
		s.storing--
		s.refsRefused = err != nil && unchanged
		if err != nil && !unchanged {
			// Try again on the next poll (or SIGHUP).
			s.lastSum, s.lastCfg, s.lastStat = fileSum{}, nil, fileStamp{size: -1}
		}
		s.mu.Unlock()
		if err != nil {
			reloadsFailed.Inc()
			if unchanged {
				// Nothing of the file is to be stored: the next poll must not
				// take it for a change.
				slog.Error("secret references of the config file not read again; keeping the previous config", "path", s.path, "err", err)
				return false, err
			}
			slog.Error("config file changed but cannot be stored; keeping previous config", "path", s.path, "err", err)
			return false, err
		}
		reloadsOK.Inc()
		if unchanged {
			slog.Info("secret references of the config file read again", "path", s.path)
		} else {
			slog.Info("config file changed; stored", "path", s.path)
		}
		return true, nil
	}
	s.lastCfg = c
	s.swap(c, s.ver.Load()+1)
	s.mu.Unlock()
	reloadsOK.Inc()
	slog.Info("config reloaded", "path", s.path, "version", s.ver.Load())
	return true, nil
}

// Watch reloads whenever the file's size, modification time, change time
// or inode changes (polled every interval), until stop is closed. SIGHUP
// is the caller's (gateway.Run calls ReloadAsked): handled here too, each
// signal would reload, log and count twice.
func (s *Store) Watch(interval time.Duration, stop <-chan struct{}) {
	if s.path == "" {
		return
	}
	var tick <-chan time.Time // interval <= 0: reload on SIGHUP only
	missing := false
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-stop:
			return
		case <-tick:
			fi, err := os.Stat(s.path)
			if err != nil {
				if !missing { // once per disappearance; the config serving stays
					missing = true
					reloadsFailed.Inc()
					slog.Warn("config file unreadable; keeping the config serving", "path", s.path, "err", err)
				}
				continue
			}
			if missing {
				missing = false
				slog.Info("config file readable again", "path", s.path)
			}
			s.mu.Lock()
			st := stampOf(fi)
			changed := !st.equal(s.lastStat)
			s.lastStat = st
			s.mu.Unlock()
			if changed {
				s.Reload()
			}
		}
	}
}

// Backup is the "Data backup" section: how often the management data
// (this whole config, users and quota templates included, API keys only as
// hashes) is snapshotted into --persist-snapshot-dir, and how many
// snapshots are kept. Changes take effect after the next backup cycle.
// Not used with --state redis (Redis keeps its own persistence).
type Backup struct {
	// IntervalSeconds between two automatic snapshots. A snapshot is written
	// only when the data changed since the newest one. Default 300.
	IntervalSeconds float64 `json:"interval_s"`
	// Keep is how many automatic snapshots are kept (older ones are
	// deleted); manual ones (Export-side "snapshot now", pre-import) are
	// rotated separately with the same count. Default 20.
	Keep int `json:"keep"`
}

// DefaultBackup returns the documented defaults of the backup section.
func DefaultBackup() Backup { return Backup{IntervalSeconds: 300, Keep: 20} }

// MaxBackupKeep bounds backup.keep.
const MaxBackupKeep = 10000

// Validate reports an invalid backup setting as a *FieldError.
func (b *Backup) Validate() error {
	if err := seconds("backup.interval_s", b.IntervalSeconds, true); err != nil {
		return err
	}
	if b.IntervalSeconds < 1 {
		return fieldErr("backup.interval_s", "must be at least 1 s")
	}
	if b.Keep < 1 || b.Keep > MaxBackupKeep {
		return fieldErr("backup.keep", "%d: want 1..%d", b.Keep, MaxBackupKeep)
	}
	return nil
}

// LLMGateway is the startup configuration the configuration center doc
// names ("llm_gateway": {"persist_snapshot_dir": ...}).
type LLMGateway struct {
	// PersistSnapshotDir is the snapshot directory, used at start when
	// --persist-snapshot-dir is not given; a change takes effect at the
	// next start.
	PersistSnapshotDir string `json:"persist_snapshot_dir"`
}

// StorageMount is one of the platform's storage mounts, as the doc's
// startup configuration describes it ("storage": [{"mount_path", "oss"}]).
// Mounting is the platform's job (ossfs, a volume); infera keeps the entry
// and checks that persist_snapshot_dir lies inside a mount.
type StorageMount struct {
	MountPath string    `json:"mount_path"`
	OSS       *OSSMount `json:"oss,omitempty"`
}

// OSSMount is an object storage bucket path mounted at a StorageMount.
type OSSMount struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
	Type     string `json:"type"`
}

// validateStartup checks llm_gateway and storage: absolute paths, and, when
// mounts are listed, a snapshot directory inside one that is writable.
func (c *Config) validateStartup() error {
	dir := c.LLMGateway.PersistSnapshotDir
	if dir != "" && !filepath.IsAbs(dir) {
		return fieldErr("llm_gateway.persist_snapshot_dir", "%q: want an absolute path", dir)
	}
	inside := false
	for i, m := range c.Storage {
		p := fmt.Sprintf("storage[%d]", i)
		if m.MountPath == "" || !filepath.IsAbs(m.MountPath) {
			return fieldErr(p+".mount_path", "%q: want an absolute path", m.MountPath)
		}
		if dir == "" {
			continue
		}
		rel, err := filepath.Rel(filepath.Clean(m.MountPath), filepath.Clean(dir))
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			if m.OSS != nil && m.OSS.ReadOnly {
				return fieldErr(p+".oss.read_only", "the mount holding llm_gateway.persist_snapshot_dir must be writable")
			}
			inside = true
		}
	}
	if dir != "" && len(c.Storage) > 0 && !inside {
		return fieldErr("llm_gateway.persist_snapshot_dir", "%q is in no storage[].mount_path", dir)
	}
	return nil
}

// sameSettingsLocked reports whether c, parsed from new bytes of the file,
// has the settings of the bytes the store last read or wrote (secret
// references compared as written, literal secrets by value): the file was
// rewritten, not edited. Lock must be held.
//
// The settings of those bytes are lastCfg's, the config read from them or
// written as them (a config written and read back has the same file:
// TestMarshalFileRoundTrips).
func (s *Store) sameSettingsLocked(c *Config) bool {
	if s.lastCfg == nil {
		return false
	}
	a, err := MarshalFile(c)
	if err != nil {
		return false
	}
	b, err := MarshalFile(s.lastCfg)
	return err == nil && bytes.Equal(a, b)
}

// fileSum identifies the bytes of a config file: their length and SHA-256
// digest. The zero value stands for no bytes read, which an empty file
// matches (as the bytes kept before, nil, were equal to an empty file's).
type fileSum struct {
	n   int
	sum [sha256.Size]byte
}

// fileUnchangedLocked reports whether the config file holds the bytes
// last read or written (lastSum), hashing it as it reads it: every admin
// write asks two or three times, and reading the file whole first held a
// copy of it (15 MB for 50,000 users) beside the write's config only to
// hash it. False when the file cannot be read: the caller reads it again
// and says why. Lock must be held.
func (s *Store) fileUnchangedLocked() bool {
	f, err := os.Open(s.path)
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 64<<10))
	if err != nil {
		return false
	}
	sum := fileSum{n: int(n)}
	if n > 0 {
		h.Sum(sum.sum[:0])
	}
	return sum == s.lastSum
}

func sumOf(data []byte) fileSum {
	if len(data) == 0 {
		return fileSum{}
	}
	return fileSum{n: len(data), sum: sha256.Sum256(data)}
}

// SameSecrets reports whether x and y, configs of the same document, hold
// the same secret values (references resolved) at every secret setting.
func SameSecrets(x, y *Config) bool {
	a, b := x.AppendSecretSlots(nil), y.AppendSecretSlots(nil)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Secret.Reveal() != b[i].Secret.Reveal() {
			return false
		}
	}
	return true
}

// hasSecretRefs reports whether a config file may hold env: or file:
// secret references (a string starting with either).
func hasSecretRefs(data []byte) bool {
	return bytes.Contains(data, []byte(`"env:`)) || bytes.Contains(data, []byte(`"file:`))
}
