package admin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/jsonscan"
)

// Snapshot kinds. Automatic snapshots are taken by the backup loop (and at
// shutdown); manual ones on request and before every import. Each kind is
// rotated separately, keeping backup.keep files.
const (
	kindAuto   = "auto"
	kindManual = "manual"
	kindExport = "export" // a download, never stored
)

const (
	snapshotFormat        = "infera-snapshot"
	snapshotFormatVersion = 1
	// maxSnapshotBytes bounds an imported snapshot. An export takes
	// about 245 bytes a user (one key, a template: 27 MB for 110,000
	// users, which 16 MiB refused); 64 MiB takes about 270,000 such
	// users. An import holds up to about 3 times its body live and grows
	// the heap by about 5 times it with the default GOGC
	// (TestAnImportHoldsAFewTimesItsBodyLive,
	// TestImportMemoryIsASmallMultipleOfTheBody), so about 320 MB at this
	// bound, and imports run one at a time (postImport): 256 MiB let one
	// import grow the heap by several GB.
	maxSnapshotBytes = 64 << 20
)

// snapshotFile is the on-disk and export format: the whole management data
// (the config with users and quota templates; user keys as salted hashes;
// upstream secrets sealed under the admin key) with a checksum.
type snapshotFile struct {
	snapshotHeader
	Config json.RawMessage `json:"config"`
}

// snapshotHeader is a snapshot file but its config.
type snapshotHeader struct {
	Format        string    `json:"format"`
	FormatVersion int       `json:"format_version"`
	CreatedAt     time.Time `json:"created_at"`
	Kind          string    `json:"kind"`
	// Version is the config version the snapshot was taken at.
	Version uint64 `json:"version"`
	// SHA256 is the hex digest of Config's bytes exactly as stored.
	SHA256 string `json:"sha256"`
}

// snapshotRead is a snapshot file decoded without its config, which
// decodeSnapshot finds in the file's bytes (configSpan): a copy of it
// (json.RawMessage) was one more body's worth of an import's peak.
type snapshotRead struct {
	snapshotHeader
	Config skipped `json:"config"`
}

// skipped is a JSON value decoded into nothing.
type skipped struct{}

func (*skipped) UnmarshalJSON([]byte) error { return nil }

// SnapshotInfo describes a stored snapshot.
type SnapshotInfo struct {
	Name    string    `json:"name"`
	Kind    string    `json:"kind"`
	Time    time.Time `json:"time"`
	Size    int64     `json:"size"`
	Version uint64    `json:"version,omitempty"`

	// seq is the snapshot's place among those named in its millisecond
	// (the name's -N, 0 without one): see snapshotNewer.
	seq int
}

// snapshotNewer reports whether x was written after y: a later time, or
// in the same millisecond a greater seq. write names the snapshots of one
// millisecond with one counter across both kinds (no suffix, then -1, -2,
// ...), so this is the order of writing; comparing the names as strings
// put "-manual.json", the first, after "-manual-1.json", and "-10" before
// "-9", and listing, rotation and the restore of the newest took the
// wrong one. Two names of one seq (two kinds in a millisecond, written
// before the counter was shared) are told apart by name.
func snapshotNewer(x, y SnapshotInfo) bool {
	if !x.Time.Equal(y.Time) {
		return x.Time.After(y.Time)
	}
	if x.seq != y.seq {
		return x.seq > y.seq
	}
	return x.Name > y.Name
}

// parseSnapshotName returns the kind, time and seq a snapshot's file name
// holds (ok false: not a snapshot's name).
func parseSnapshotName(name string) (kind string, t time.Time, seq int, ok bool) {
	m := snapshotName.FindStringSubmatch(name)
	if m == nil {
		return "", time.Time{}, 0, false
	}
	t, err := time.Parse(snapshotTimeLayout, m[1])
	if err != nil {
		return "", time.Time{}, 0, false
	}
	if m[3] != "" {
		if seq, err = strconv.Atoi(m[3][1:]); err != nil || seq < 1 {
			return "", time.Time{}, 0, false
		}
	}
	return m[2], t, seq, true
}

var snapshotName = regexp.MustCompile(`^snapshot-(\d{8}T\d{6}\.\d{3}Z)-(auto|manual)(-\d+)?\.json$`)

const snapshotTimeLayout = "20060102T150405.000Z"

// snapshots is the --persist-snapshot-dir directory.
type snapshots struct {
	dir  string
	seal *sealer

	// now is the clock snapshots are named and stamped by (tests stop
	// it to write many in one millisecond); nil: time.Now.
	now func() time.Time
	// writeFile stores a snapshot's bytes (tests slow it down); nil:
	// config.WriteFileAtomic (temp file, fsync, rename, fsync of the
	// directory).
	writeFile func(path string, data []byte, perm os.FileMode) error

	mu      sync.Mutex
	lastSum [32]byte // clear encoding of the newest snapshot's config
}

func newSnapshots(dir string, seal *sealer) (*snapshots, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create snapshot directory %q: %w", dir, err)
	}
	return &snapshots{dir: dir, seal: seal}, nil
}

// list returns the stored snapshots, newest first.
func (s *snapshots) list() ([]SnapshotInfo, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("cannot list snapshot directory %q: %w", s.dir, err)
	}
	var out []SnapshotInfo
	for _, e := range ents {
		kind, t, seq, ok := parseSnapshotName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info := SnapshotInfo{Name: e.Name(), Kind: kind, Time: t, seq: seq}
		if fi, err := e.Info(); err == nil {
			info.Size = fi.Size()
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return snapshotNewer(out[i], out[j]) })
	return out, nil
}

// encode builds a snapshot file of c.
func (s *sealer) encodeSnapshot(c *config.Config, version uint64, kind string, now time.Time) ([]byte, error) {
	body, err := s.encodeSealed(c)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	f := snapshotFile{snapshotHeader: snapshotHeader{
		Format: snapshotFormat, FormatVersion: snapshotFormatVersion,
		CreatedAt: now.UTC(), Kind: kind, Version: version,
		SHA256: hex.EncodeToString(sum[:]),
	}, Config: body}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// decodeSnapshot checks a snapshot file and returns its config document
// (secrets still sealed: a slice of data, which must not change while it
// is used) and header. It changes nothing.
func decodeSnapshot(data []byte) ([]byte, *snapshotHeader, error) {
	// A UTF-8 byte order mark (an editor's, on Windows) is ignored, as RFC
	// 8259 8.1 allows and as the console's browser drops it reading the
	// file: the same export imported there and not here.
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	if len(data) == 0 {
		return nil, nil, &config.FieldError{Msg: "the snapshot is empty"}
	}
	var f snapshotRead
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, nil, &config.FieldError{Msg: "not a snapshot: cannot parse JSON (" + err.Error() + ")"}
	}
	if f.Format != snapshotFormat {
		return nil, nil, &config.FieldError{Path: "format", Msg: fmt.Sprintf("want %q: this is not an infera snapshot (export one from the console or GET /api/backup/export)", snapshotFormat)}
	}
	if f.FormatVersion != snapshotFormatVersion {
		return nil, nil, &config.FieldError{Path: "format_version", Msg: fmt.Sprintf("%d: this build reads version %d", f.FormatVersion, snapshotFormatVersion)}
	}
	cfg := configSpan(data)
	if len(cfg) == 0 {
		return nil, nil, &config.FieldError{Path: "config", Msg: "is missing"}
	}
	if f.SHA256 != "" {
		// The digest is over the compact form: indentation (MarshalIndent
		// of the file, an editor) does not matter, any other change does.
		sum := compactSHA256(cfg)
		if hex.EncodeToString(sum[:]) != strings.ToLower(f.SHA256) {
			if !json.Valid(cfg) {
				return nil, nil, &config.FieldError{Path: "config", Msg: "is not valid JSON"}
			}
			return nil, nil, &config.FieldError{Path: "sha256", Msg: "does not match the config: the file is damaged or was edited (remove sha256 to import an edited file on purpose)"}
		}
	}
	cfg = validUTF8(cfg)
	if err := checkObject(cfg); err != nil {
		var fe *config.FieldError
		if errors.As(err, &fe) {
			fe.Path = join("config", fe.Path)
		}
		return nil, nil, err
	}
	// The decoding kept one copy of a repeated key (an edited export): in
	// the config (at config.<path>), and in the file's own keys, where a
	// second "config" was imported and the first silently ignored.
	if err := config.RepeatedKey(data, ""); err != nil {
		return nil, nil, err
	}
	return cfg, &f.snapshotHeader, nil
}

// envelopeKeys are a snapshot file's own keys (snapshotFile's JSON names).
var envelopeKeys = [][]byte{[]byte("format"), []byte("format_version"), []byte("created_at"),
	[]byte("kind"), []byte("version"), []byte("sha256"), []byte("config")}

// unknownEnvelopeKey refuses an imported snapshot file (one that
// decodeSnapshot read) holding a key of its own that is none of
// envelopeKeys in any case, as encoding/json matches them: it was
// ignored, and a misspelt "sha256" imported the file unchecked. Stored
// snapshots, which this program wrote, are not held to it.
func unknownEnvelopeKey(data []byte) error {
	data = validUTF8(bytes.TrimPrefix(data, []byte("\ufeff")))
	_, err := jsonscan.WalkObjectInline(data, 0, walkLevels, func(key []byte, vs int) (int, error) {
		for _, k := range envelopeKeys {
			if bytes.EqualFold(key, k) {
				return -1, nil
			}
		}
		name := string(key)
		if len(name) > 64 { // the caller's text, told back bounded
			name = strings.ToValidUTF8(name[:64], "") + "..."
		}
		return 0, &config.FieldError{Path: name, Msg: fmt.Sprintf("unknown key %q of a snapshot file: want format, format_version, created_at, kind, version, sha256 and config (nothing was changed; a misspelt sha256 left the checksum unchecked)", name)}
	})
	return err
}

// configSpan is the value of the file's config key in a snapshot file
// that decoded (the last copy, which encoding/json keeps), nil if none.
func configSpan(data []byte) []byte {
	if !utf8.Valid(data) {
		// jsonscan refuses what encoding/json reads as U+FFFD: the copy.
		var f snapshotFile
		json.Unmarshal(data, &f)
		return f.Config
	}
	var cfg []byte
	jsonscan.WalkObject(data, 0, walkLevels, func(key []byte, vs, ve int) error {
		if t, ok := config.FieldType(snapshotReadType, string(key)); ok && t == skippedType {
			cfg = data[vs:ve]
		}
		return nil
	})
	return cfg
}

var (
	snapshotReadType = reflect.TypeFor[snapshotRead]()
	skippedType      = reflect.TypeFor[skipped]()
)

// withSectionsOf returns the config document data (a JSON object) with
// its top-level sections names (matched as encoding/json matches a key to
// a field, without regard to case) replaced by those of the config
// document from, or left out where from has none. data is not changed.
func withSectionsOf(data, from []byte, names []string) []byte {
	isName := func(key []byte) bool {
		for _, n := range names {
			if strings.EqualFold(string(key), n) {
				return true
			}
		}
		return false
	}
	out := make([]byte, 0, len(data)+64)
	out = append(out, '{')
	member := func(raw []byte, v []byte) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, raw...)
		out = append(out, '"', ':')
		out = append(out, v...)
	}
	// Both are objects that decoded: the walks cannot fail.
	for _, src := range []struct {
		doc   []byte
		names bool
	}{{data, false}, {from, true}} {
		jsonscan.WalkMembers(src.doc, 0, func(raw []byte, vs int) (int, error) {
			ve, err := jsonscan.SkipValue(src.doc, vs, walkLevels)
			if err == nil && isName(jsonscan.Key(raw)) == src.names {
				member(raw, src.doc[vs:ve])
			}
			return ve, err
		})
	}
	return append(out, '}')
}

// compactSHA256 is the SHA-256 of json.Compact(data) for valid JSON data,
// without a compact copy of it: the white space outside strings is left
// out as it is hashed.
func compactSHA256(data []byte) [sha256.Size]byte {
	h := sha256.New()
	inString, escaped := false, false
	start := 0
	for i, c := range data {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			h.Write(data[start:i])
			start = i + 1
		}
	}
	h.Write(data[start:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// read loads and validates a stored snapshot. Unlike an import, it must
// carry its checksum: infera writes one in every snapshot, so a stored
// one without it was edited. Its secret references are taken only where
// base holds them (sealer.parseStored).
func (s *snapshots) read(name string, base *config.Config) (*config.Config, *snapshotHeader, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, name))
	if err != nil {
		return nil, nil, err
	}
	cfg, f, err := decodeSnapshot(data)
	if err != nil {
		return nil, nil, err
	}
	if f.SHA256 == "" {
		return nil, nil, &config.FieldError{Path: "sha256", Msg: "is missing: a stored snapshot always has one, so this one was edited"}
	}
	c, err := s.seal.parseStored(cfg, base)
	if err != nil {
		return nil, nil, err
	}
	return c, f, nil
}

// write stores a snapshot of c (temp file, fsync, rename) and rotates the
// snapshots of each kind down to keep. Lock must be held.
func (s *snapshots) write(c *config.Config, version uint64, kind string, keep int) (SnapshotInfo, error) {
	info, _, err := s.writeUnrotated(c, version, kind)
	if err != nil {
		return SnapshotInfo{}, err
	}
	s.rotateAll(keep)
	return info, nil
}

// writeUnrotated stores a snapshot of c (temp file, fsync, rename) and
// returns it with the lastSum it replaced. Lock must be held.
func (s *snapshots) writeUnrotated(c *config.Config, version uint64, kind string) (SnapshotInfo, [32]byte, error) {
	prev := s.lastSum
	now := time.Now()
	if s.now != nil {
		now = s.now()
	}
	now = now.UTC()
	data, err := s.seal.encodeSnapshot(c, version, kind, now)
	if err != nil {
		return SnapshotInfo{}, prev, err
	}
	name, err := s.nameAt(now, kind)
	if err != nil {
		return SnapshotInfo{}, prev, err
	}
	writeFile := config.WriteFileAtomic
	if s.writeFile != nil {
		writeFile = s.writeFile
	}
	if err := writeFile(filepath.Join(s.dir, name), data, 0o600); err != nil {
		return SnapshotInfo{}, prev, fmt.Errorf("cannot write snapshot %q: %w", name, err)
	}
	if clear, err := encodeClear(c); err == nil {
		s.lastSum = sha256.Sum256(clear)
	}
	return SnapshotInfo{Name: name, Kind: kind, Time: now, Size: int64(len(data)), Version: version}, prev, nil
}

// rotateAll rotates the snapshots of both kinds down to keep: a lowered
// keep prunes the manual snapshots too at the next cycle (they waited for
// the next manual one). Lock must be held.
func (s *snapshots) rotateAll(keep int) {
	s.rotate(kindAuto, keep)
	s.rotate(kindManual, keep)
}

// nameAt names a new snapshot of kind taken at now: the first of its
// millisecond has no suffix, the next ones -1, -2, ... counted across both
// kinds from the newest stored (snapshotNewer orders them so). The newest
// of a millisecond is never rotated out (each kind keeps its newest), so
// a name is never used twice: taking the first free one, as before, wrote
// the suffix-less name again once rotation had deleted it, and that
// snapshot, the oldest by name, was rotated out at once. Lock must be
// held.
func (s *snapshots) nameAt(now time.Time, kind string) (string, error) {
	list, err := s.list()
	if err != nil {
		return "", err
	}
	at := now.Truncate(time.Millisecond)
	seq := 0
	for _, info := range list {
		if info.Time.Equal(at) {
			seq = max(seq, info.seq+1)
		}
	}
	base := "snapshot-" + now.Format(snapshotTimeLayout) + "-" + kind
	for ; ; seq++ {
		name := base + ".json"
		if seq > 0 {
			name = base + "-" + strconv.Itoa(seq) + ".json"
		}
		// Not a regular file (list skips it), yet in the way.
		if _, err := os.Lstat(filepath.Join(s.dir, name)); errors.Is(err, os.ErrNotExist) {
			return name, nil
		}
	}
}

// rotate deletes the oldest snapshots of kind beyond keep.
func (s *snapshots) rotate(kind string, keep int) {
	if keep < 1 {
		keep = 1
	}
	list, err := s.list()
	if err != nil {
		slog.Error("cannot rotate snapshots", "err", err)
		return
	}
	n := 0
	for _, info := range list {
		if info.Kind != kind {
			continue
		}
		n++
		if n > keep {
			if err := os.Remove(filepath.Join(s.dir, info.Name)); err != nil {
				slog.Error("cannot delete an old snapshot", "name", info.Name, "err", err)
			}
		}
	}
}

// snapshot stores the current config. An automatic snapshot is skipped
// (ok false) when nothing changed since the newest snapshot.
func (a *Admin) snapshot(kind string) (info SnapshotInfo, err error) {
	s := a.snaps
	if s == nil {
		return info, errors.New("no snapshot directory: start with --persist-snapshot-dir")
	}
	if a.store.Path() != "" {
		// A hand edit of the file the poll has not seen yet (an edit, then
		// a restart at once) is picked up first: a snapshot taken without
		// it would be newer than the file yet hold the data before the
		// edit, and the next start would restore that over the edit.
		a.store.Reload()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, v := a.store.Current()
	return a.snapshotLocked(kind, c, v)
}

// preImportSnapshot is the manual snapshot an import takes of the data it
// replaces, cur at version ver, before its commit (postImport, through
// changeChecked's before). It is written outside the admin lock, so other
// admin writes go on while its file is written and fsynced, and the
// import commits only if the store is still at cur and ver once it is
// written (changeChecked): when another write landed meanwhile, the
// import goes again on the new data with a new snapshot, and this one,
// which no import followed, is dropped. Rotation waits until the import
// commits (keep): a snapshot written and then dropped would otherwise
// have rotated out an older one for nothing.
type preImportSnapshot struct {
	a        *Admin
	info     SnapshotInfo
	cur      *config.Config
	ver      uint64
	keepN    int
	prevSum  [32]byte // the snapshots' lastSum before this one
	clearSum [32]byte // its own
}

// takePreImportSnapshot writes the pre-import snapshot of c, the config of
// version v. The admin lock need not be held.
func (a *Admin) takePreImportSnapshot(c *config.Config, v uint64) (*preImportSnapshot, error) {
	s := a.snaps
	if s == nil {
		return nil, errors.New("no snapshot directory: start with --persist-snapshot-dir")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info, prev, err := s.writeUnrotated(c, v, kindManual)
	if err != nil {
		return nil, err
	}
	slog.Info("snapshot written", "name", info.Name, "kind", kindManual, "version", v, "before", "import")
	return &preImportSnapshot{a: a, info: info, cur: c, ver: v, keepN: a.o.Backup(c).Keep, prevSum: prev, clearSum: s.lastSum}, nil
}

// of reports whether p is the snapshot of c at version v.
func (p *preImportSnapshot) of(c *config.Config, v uint64) bool {
	return p != nil && p.cur == c && p.ver == v
}

// keep rotates the snapshots now that the import committed over p's data.
func (p *preImportSnapshot) keep() {
	if p == nil {
		return
	}
	s := p.a.snaps
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rotateAll(p.keepN)
}

// dropReason is why no import followed a pre-import snapshot (drop), as
// the log says it.
type dropReason string

// Drop reasons.
const (
	droppedOvertaken dropReason = "another write landed before the import"
	droppedShutdown  dropReason = "the router is shutting down: the import was refused"
	droppedRefused   dropReason = "the import was refused (its answer says why)"
)

// drop deletes p, which no import followed (why: droppedOvertaken,
// droppedShutdown, droppedRefused), and gives the snapshots back the
// lastSum before it when no snapshot was written since.
func (p *preImportSnapshot) drop(why dropReason) {
	if p == nil {
		return
	}
	s := p.a.snaps
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(filepath.Join(s.dir, p.info.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		slog.Error("cannot delete a pre-import snapshot no import followed", "name", p.info.Name, "err", err)
		return
	}
	if s.lastSum == p.clearSum {
		s.lastSum = p.prevSum
	}
	slog.Info("pre-import snapshot deleted: "+string(why), "name", p.info.Name, "version", p.ver)
}

// snapshotLocked stores a snapshot of c at version v. s.mu must be held.
func (a *Admin) snapshotLocked(kind string, c *config.Config, v uint64) (info SnapshotInfo, err error) {
	s := a.snaps
	if kind == kindAuto {
		clear, err := encodeClear(c)
		if err != nil {
			return info, err
		}
		if sha256.Sum256(clear) == s.lastSum {
			return info, nil
		}
	}
	info, err = s.write(c, v, kind, a.o.Backup(c).Keep)
	if err == nil {
		slog.Info("snapshot written", "name", info.Name, "kind", kind, "version", v)
	}
	return info, err
}

// restoreNewest swaps in the newest snapshot that reads back whole and
// valid, falling back to older ones with a logged reason.
func (a *Admin) restoreNewest() error {
	s := a.snaps
	info, c, f, err := s.newestUsable(a.store.Load())
	if err != nil || c == nil {
		return err
	}

	if clear, err := encodeClear(c); err == nil {
		s.lastSum = sha256.Sum256(clear)
	}
	a.pending.Store(&pendingChange{cfg: c, who: actor{Who: "startup"}, action: "restore " + info.Name})
	a.store.Replace(c, max(f.Version, 1))
	a.pending.Store(nil)
	slog.Info("management data restored from snapshot", "name", info.Name, "kind", info.Kind, "version", f.Version)
	return nil
}

// newestUsable returns the newest snapshot that reads back whole and
// valid, logging why each newer one was skipped; c is nil when there is
// none, and err an *errNoUsableSnapshot when there were some but none is
// usable.
func (s *snapshots) newestUsable(base *config.Config) (SnapshotInfo, *config.Config, *snapshotHeader, error) {
	list, err := s.list()
	if err != nil {
		return SnapshotInfo{}, nil, nil, err
	}
	var first error
	for _, info := range list {
		c, f, err := s.read(info.Name, base)
		if err != nil {
			slog.Error("snapshot unusable; trying the previous one", "name", info.Name, "reason", err)
			if first == nil {
				first = fmt.Errorf("%s: %w", info.Name, err)
			}
			continue
		}
		return info, c, f, nil
	}
	if len(list) > 0 {
		return SnapshotInfo{}, nil, nil, &errNoUsableSnapshot{dir: s.dir, n: len(list), newest: first}
	}
	return SnapshotInfo{}, nil, nil, nil
}

// errNoUsableSnapshot is a snapshot directory holding snapshots of which
// none restores (sealed with another key, all damaged). Without a config
// file that refuses the start: the defaults instead would serve no users
// (with no --api-key, the inference endpoints open to anyone) and their
// first snapshot would hide the real ones.
type errNoUsableSnapshot struct {
	dir    string
	n      int
	newest error
}

func (e *errNoUsableSnapshot) Error() string {
	return fmt.Sprintf("none of the %d snapshots in %s restores (the newest, %v): start with the key they were sealed with (--admin-seal-key, else --admin-key or --api-key), or move them out of the directory to start without them",
		e.n, e.dir, e.newest)
}

// restoreNewerThanFile is the start with a config file and a snapshot
// directory: the configuration center restores the newest backup at start,
// and the file is where the management data lives. The newest snapshot
// that reads back whole and valid is restored unless the file holds the
// same data or was modified after the snapshot was taken (a hand edit made
// while the router was stopped: the later change wins, as between the file
// and the API while it runs). A restore keeps the file's startup settings
// (llm_gateway, storage), is written to the file like an API write, and
// keeps the file's previous bytes beside it as <file>.before-restore.
func (a *Admin) restoreNewerThanFile() error {
	s, path := a.snaps, a.store.Path()
	info, c, f, err := s.newestUsable(a.store.Load())
	var none *errNoUsableSnapshot
	if errors.As(err, &none) {
		slog.Error("no usable snapshot; serving the config file", "config", path, "err", err)
		return nil
	}
	if err != nil || c == nil {
		return err // none: the file serves
	}
	cur := a.store.Load()
	c.LLMGateway, c.Storage = cur.LLMGateway, cur.Storage
	snap, err1 := encodeClear(c)
	file, err2 := encodeClear(cur)
	if err1 != nil || err2 != nil {
		return errors.Join(err1, err2)
	}
	s.lastSum = sha256.Sum256(snap)
	if bytes.Equal(snap, file) {
		slog.Info("the config file holds the newest snapshot's data", "config", path, "snapshot", info.Name)
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cannot read config file %q: %w", path, err)
	}
	if fi.ModTime().After(info.Time) {
		slog.Info("the config file was changed after the newest snapshot: the file wins (import the snapshot to restore it)",
			"config", path, "modified", fi.ModTime().UTC(), "snapshot", info.Name)
		return nil
	}
	if err := a.store.Check(c); err != nil {
		// What this router's flags refuse (static workers under etcd
		// discovery): written to the file, it refused this start and
		// every later one.
		slog.Error("snapshot not restored: this router's flags refuse it; serving the config file", "config", path, "snapshot", info.Name, "err", err)
		return nil
	}
	old, err := os.ReadFile(path)
	if err == nil {
		err = config.WriteFileAtomic(path+".before-restore", old, fi.Mode().Perm())
	}
	if err != nil {
		slog.Error("snapshot not restored: cannot keep the config file's bytes first; serving the file", "config", path, "snapshot", info.Name, "err", err)
		return nil
	}
	a.pending.Store(&pendingChange{cfg: c, who: actor{Who: "startup"}, action: "restore " + info.Name})
	_, err = a.st.commit(c, 0, actor{Who: "startup"}, false)
	a.pending.Store(nil)
	if err != nil {
		slog.Error("snapshot not restored; serving the config file", "config", path, "snapshot", info.Name, "err", err)
		return nil
	}
	slog.Info("management data restored from the newest snapshot (newer than the config file, which now holds it; its previous bytes are in .before-restore)",
		"name", info.Name, "kind", info.Kind, "version", f.Version, "config", path)
	return nil
}

// backupLoop takes an automatic snapshot every backup.interval_s (read
// again after each cycle, so a new interval applies from the next one).
func (a *Admin) backupLoop() {
	defer a.wg.Done()
	for {
		b := a.o.Backup(a.store.Load())
		d := time.Duration(b.IntervalSeconds * float64(time.Second))
		if d < time.Second {
			d = time.Second
		}
		t := time.NewTimer(d)
		select {
		case <-a.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if _, err := a.snapshot(kindAuto); err != nil {
			slog.Error("automatic snapshot failed", "err", err)
		}
	}
}
