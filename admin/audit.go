package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/jsonscan"
)

// Bounds of one audit entry.
const (
	maxAuditChanges = 200
	maxAuditValue   = 512
)

// AuditEntry is one change of the management data.
type AuditEntry struct {
	Time time.Time `json:"time"`
	// Who is the admin key's label (admin-key or api-key), "config file"
	// for a hand edit, or "another replica (redis)".
	Who    string `json:"who"`
	Remote string `json:"remote,omitempty"`
	// Action says what was done: "PUT session_affinity", "create user
	// alice", "import snapshot-....json", "reload", "sync".
	Action  string   `json:"action"`
	Version uint64   `json:"version"`
	Changes []Change `json:"changes"`
	// More counts changes left out of Changes.
	More int `json:"more,omitempty"`
}

// Change is one setting that changed. Secrets appear only in redacted
// form (***fingerprint) and user key hashes by key id.
type Change struct {
	Path string `json:"path"`
	Old  string `json:"old"`
	New  string `json:"new"`
}

// auditLog is a bounded ring of the latest entries.
//
// The store's change hooks run under its lock, one after the other, after
// the new config is already served: add only queues the change, so the
// hooks after it (governance, discovery) apply the new config without
// waiting for the diff. The queue is recorded in order by drain, from a
// background goroutine (kick) and before every list.
type auditLog struct {
	mu      sync.Mutex
	entries []AuditEntry
	next    int
	full    bool

	qmu     sync.Mutex // guards queue
	queue   []queuedChange
	drainMu sync.Mutex // serializes drains: entries keep the order of changes
	kick    chan struct{}

	seal *sealer // fingerprints the secrets of the changes
}

// queuedChange is a change not recorded yet.
type queuedChange struct {
	time     time.Time
	who      actor
	action   string
	version  uint64
	old, cur *config.Config
}

func newAuditLog(n int, seal *sealer) *auditLog {
	return &auditLog{entries: make([]AuditEntry, n), kick: make(chan struct{}, 1), seal: seal}
}

// add queues a change (cheap: it runs under the store lock).
func (l *auditLog) add(who actor, action string, version uint64, old, cur *config.Config) {
	l.qmu.Lock()
	l.queue = append(l.queue, queuedChange{time: time.Now().UTC(), who: who, action: action, version: version, old: old, cur: cur})
	l.qmu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// run records queued changes as they come until stop is closed, then the
// rest.
func (l *auditLog) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			l.drain()
			return
		case <-l.kick:
			l.drain()
		}
	}
}

// drain records every queued change, in order.
func (l *auditLog) drain() {
	l.drainMu.Lock()
	defer l.drainMu.Unlock()
	l.qmu.Lock()
	q := l.queue
	l.queue = nil
	l.qmu.Unlock()
	for _, c := range q {
		l.record(c.time, c.who, c.action, c.version, c.old, c.cur)
	}
}

func (l *auditLog) record(at time.Time, who actor, action string, version uint64, old, cur *config.Config) {
	changes, more := diffUpTo(l.seal, old, cur, maxAuditChanges)
	e := AuditEntry{Time: at, Who: who.Who, Remote: who.Remote, Action: action, Version: version, Changes: changes, More: more}
	logged := make([]string, 0, min(len(changes), 20))
	for _, c := range changes[:min(len(changes), 20)] {
		logged = append(logged, c.Path+": "+c.Old+" -> "+c.New)
	}
	slog.Info("config changed", "who", e.Who, "remote", e.Remote, "action", e.Action, "version", version,
		"changed", len(changes)+e.More, "changes", logged)
	l.mu.Lock()
	l.entries[l.next] = e
	l.next = (l.next + 1) % len(l.entries)
	if l.next == 0 {
		l.full = true
	}
	l.mu.Unlock()
}

// list returns up to limit entries, newest first.
func (l *auditLog) list(limit int) []AuditEntry {
	l.drain()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.next
	if l.full {
		n = len(l.entries)
	}
	if limit <= 0 || limit > n {
		limit = n
	}
	out := make([]AuditEntry, 0, limit)
	for i := 0; i < limit; i++ {
		idx := (l.next - 1 - i + len(l.entries)) % len(l.entries)
		out = append(out, l.entries[idx])
	}
	return out
}

// diff lists the settings that differ between two configs, by JSON path,
// with secrets redacted (fingerprinted by s).
func diff(s *sealer, old, cur *config.Config) []Change {
	a, ra, b, rb := flattenChanged(s, old, cur, nil)
	return diffFlat(a, ra, b, rb)
}

// diffUpTo is diff listing at most limit changes, and counting the rest in
// more. The members of a list told by name (users, templates, workers)
// are flattened only until limit of them differ: each further member
// added, removed or changed counts as one change in more, however many of
// its settings differ. An import of 100,000 users so flattens a few
// hundred of them, not all (which took most of what an import allocated).
func diffUpTo(s *sealer, old, cur *config.Config, limit int) (changes []Change, more int) {
	bud := &memberBudget{left: limit}
	a, ra, b, rb := flattenChanged(s, old, cur, bud)
	changes = diffFlat(a, ra, b, rb)
	more = bud.skipped
	if len(changes) > limit {
		more += len(changes) - limit
		changes = changes[:limit]
	}
	return changes, more
}

// memberBudget bounds how many differing list members a diff flattens
// (nil: all of them).
type memberBudget struct {
	left    int // members still flattened
	skipped int // differing members counted, not flattened
}

// take reports whether one more differing member is flattened, counting
// it as skipped when not.
func (m *memberBudget) take() bool {
	if m == nil {
		return true
	}
	if m.left > 0 {
		m.left--
		return true
	}
	m.skipped++
	return false
}

// diffFlat lists the differences of two flattened configs (flatten).
func diffFlat(a map[string]string, ra map[string][]string, b map[string]string, rb map[string][]string) []Change {
	var out []Change
	for p, nv := range b {
		if ov, ok := a[p]; !ok || ov != nv {
			if !ok {
				ov = "(none)"
			}
			out = append(out, Change{Path: p, Old: ov, New: nv})
		}
	}
	for p, ov := range a {
		if _, ok := b[p]; !ok {
			out = append(out, Change{Path: p, Old: ov, New: "(none)"})
		}
	}
	// An empty or null list or object that gained (or lost) its members is
	// told by the members' changes alone.
	ia, ib := memberIndex{m: a}, memberIndex{m: b}
	kept := out[:0]
	for _, c := range out {
		if (c.New == "(none)" && isEmptyJSON(c.Old) && ib.has(c.Path)) ||
			(c.Old == "(none)" && isEmptyJSON(c.New) && ia.has(c.Path)) {
			continue
		}
		// No list and an empty one are the same, as same counts them (the
		// console saves [] where there was none): not a change.
		if (c.Old == "null" && c.New == "[]" || c.Old == "[]" && c.New == "null") && !nilMeansDefault[lastKey(c.Path)] {
			continue
		}
		kept = append(kept, c)
	}
	out = kept
	// Members told by name lose their position: a list whose members
	// stayed but moved (split proxies and global members are tried in list
	// order) is told by its names in the old and the new order.
	for p, on := range ra {
		if nn, ok := rb[p]; ok && reordered(on, nn) {
			out = append(out, Change{Path: p, Old: auditNames(on), New: auditNames(nn)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// reordered tells whether the members both lists name are in another
// order in y than in x.
func reordered(x, y []string) bool {
	inX, inY := sortedNames(x), sortedNames(y)
	i, j := 0, 0
	for {
		for i < len(x) && !inY.has(x[i]) {
			i++
		}
		for j < len(y) && !inX.has(y[j]) {
			j++
		}
		if i == len(x) || j == len(y) {
			return false
		}
		if x[i] != y[j] {
			return true
		}
		i++
		j++
	}
}

// nameIndex finds a list's members by name: their positions, sorted by
// name. A map of every name (one per side, and one more per side to tell
// that the names are unique) was, for an import of 50,000 users, most of
// what its audit entry held beside the two encodings it compares.
type nameIndex struct {
	names  []string
	byName []int32 // positions in names, sorted by name
}

func sortedNames(names []string) nameIndex {
	x := nameIndex{names: names, byName: make([]int32, len(names))}
	for i := range x.byName {
		x.byName[i] = int32(i)
	}
	slices.SortFunc(x.byName, func(a, b int32) int { return strings.Compare(names[a], names[b]) })
	return x
}

// find returns the position of the member named n.
func (x nameIndex) find(n string) (int, bool) {
	i, ok := slices.BinarySearchFunc(x.byName, n, func(p int32, n string) int { return strings.Compare(x.names[p], n) })
	if !ok {
		return -1, false
	}
	return int(x.byName[i]), true
}

func (x nameIndex) has(n string) bool {
	_, ok := x.find(n)
	return ok
}

// unique reports whether no two members have the same name.
func (x nameIndex) unique() bool {
	for i := 1; i < len(x.byName); i++ {
		if x.names[x.byName[i-1]] == x.names[x.byName[i]] {
			return false
		}
	}
	return true
}

// auditNames is a list's member names for the audit log, cut as a long
// value is.
func auditNames(names []string) string {
	data, _ := json.Marshal(names)
	if len(data) > maxAuditValue {
		return string(data[:maxAuditValue]) + "..."
	}
	return string(data)
}

// lastKey is the last object key of a flattened path.
func lastKey(path string) string {
	return path[strings.LastIndexByte(path, '.')+1:]
}

func isEmptyJSON(v string) bool { return v == "null" || v == "[]" || v == "{}" }

// memberIndex tells whether a flattened config holds members (paths
// path.k or path[i]) under a path. The paths are sorted once, on the first
// question, so that each question is a binary search: scanning the whole
// map per question made a diff of n lists that all gained members
// quadratic in n.
type memberIndex struct {
	m      map[string]string
	sorted []string
}

func (x *memberIndex) has(path string) bool {
	if x.sorted == nil {
		x.sorted = make([]string, 0, len(x.m))
		for p := range x.m {
			x.sorted = append(x.sorted, p)
		}
		sort.Strings(x.sorted)
	}
	// The paths starting with a prefix are a run of the sorted list that
	// starts at the first path not below the prefix.
	for _, sep := range [...]string{".", "["} {
		pre := path + sep
		i := sort.SearchStrings(x.sorted, pre)
		if i < len(x.sorted) && strings.HasPrefix(x.sorted[i], pre) {
			return true
		}
	}
	return false
}

// flatten maps every setting of c to its value by path, and the path of
// every list told by name to its members' names, in order.
func flatten(s *sealer, c *config.Config) (map[string]string, map[string][]string) {
	m := map[string]string{}
	order := map[string][]string{}
	if c == nil {
		return m, order
	}
	data, err := s.encodeRedacted(c)
	if err != nil {
		return m, order
	}
	s.noteRedacted(c, data) // the ETag of c (Admin.etag), if asked next
	doc, err := decodeDoc(data)
	if err != nil {
		return m, order
	}
	flattenValue(m, order, "", doc)
	return m, order
}

// flattenValue adds v at path, and everything below it, to m and order
// (see flatten).
func flattenValue(m map[string]string, order map[string][]string, path string, v any) {
	switch t := v.(type) {
	case map[string]any:
		if len(t) == 0 {
			m[path] = "{}"
		}
		for k, e := range t {
			flattenValue(m, order, join(path, k), e)
		}
	case []any:
		if len(t) == 0 {
			m[path] = "[]"
		}
		// Members named uniquely (users, quota templates, workers,
		// upstream entries) are told by name: deleting the first of
		// three users read as two renames and a deletion.
		if names := memberNames(t); names != nil {
			order[path] = names
			for i, e := range t {
				flattenValue(m, order, memberPath(path, names[i]), e)
			}
			break
		}
		for i, e := range t {
			flattenValue(m, order, fmt.Sprintf("%s[%d]", path, i), e)
		}
	case string:
		m[path] = auditString(t)
	default:
		data, _ := json.Marshal(t)
		m[path] = string(data)
	}
}

// memberPath is the path of a list member told by name.
func memberPath(path, name string) string {
	data, _ := json.Marshal(name)
	return path + "[" + string(data) + "]"
}

// maxScanLevels bounds the nesting jsonscan walks in an encoded config
// (the config nests a handful of levels).
const maxScanLevels = 64

// flattenChanged is flatten of old and of cur, leaving out what the two
// encode alike: a top-level section with the same bytes, and a member
// (told by name) with the same bytes in a list of members told by name on
// both sides (the lists' names are still all in the orders). Equal parts
// make no change, so diffFlat finds the same changes; a write that adds one
// user to 10,000 walks that user, not 20,000 (flattening both configs whole
// was most of what such a write allocated).
//
// With bud, at most bud.left differing members of lists told by name are
// flattened (a list present on one side only counts its members too).
func flattenChanged(s *sealer, old, cur *config.Config, bud *memberBudget) (a map[string]string, ra map[string][]string, b map[string]string, rb map[string][]string) {
	if old == nil || cur == nil {
		a, ra = flatten(s, old)
		b, rb = flatten(s, cur)
		return a, ra, b, rb
	}
	da, err1 := s.encodeRedacted(old)
	db, err2 := s.encodeRedacted(cur)
	if err2 == nil {
		s.noteRedacted(cur, db) // the ETag of cur (Admin.etag), if asked next
	}
	secA, ok1 := topSections(da)
	secB, ok2 := topSections(db)
	if err1 != nil || err2 != nil || !ok1 || !ok2 {
		a, ra = flatten(s, old)
		b, rb = flatten(s, cur)
		return a, ra, b, rb
	}
	a, ra, b, rb = map[string]string{}, map[string][]string{}, map[string]string{}, map[string][]string{}
	for k, x := range secA {
		y, ok := secB[k]
		switch {
		case !ok:
			if !flattenNamedOneSide(a, ra, k, x, bud) {
				flattenRaw(a, ra, k, x)
			}
		case bytes.Equal(x, y):
		case !flattenNamedChanged(a, ra, b, rb, k, x, y, bud):
			flattenRaw(a, ra, k, x)
			flattenRaw(b, rb, k, y)
		}
	}
	for k, y := range secB {
		if _, ok := secA[k]; !ok {
			if !flattenNamedOneSide(b, rb, k, y, bud) {
				flattenRaw(b, rb, k, y)
			}
		}
	}
	return a, ra, b, rb
}

// flattenNamedOneSide flattens the members of list x (at path), present on
// one side only, within bud, when bud is set and x is a non-empty list of
// members told by name; it reports false, having done nothing, otherwise.
func flattenNamedOneSide(m map[string]string, order map[string][]string, path string, x []byte, bud *memberBudget) bool {
	if bud == nil {
		return false
	}
	xs := listMembers(x)
	if len(xs) == 0 {
		return false
	}
	nx := rawMemberNames(xs)
	if nx == nil {
		return false
	}
	order[path] = nx
	for i, n := range nx {
		if bud.take() {
			flattenRaw(m, order, memberPath(path, n), xs[i])
		}
	}
	return true
}

// flattenNamedChanged flattens the members of lists x and y (at path) that
// differ, when both are non-empty lists of members told by name; it
// reports false, having done nothing, otherwise.
// A member changed on both sides is flattened on both or neither (bud).
func flattenNamedChanged(a map[string]string, ra map[string][]string, b map[string]string, rb map[string][]string, path string, x, y []byte, bud *memberBudget) bool {
	xs, ys := listMembers(x), listMembers(y)
	switch {
	case len(xs) == 0 && len(ys) == 0:
		return false
	case len(xs) == 0:
		// An empty (or null) list that gained members is told by the
		// members alone (as diffFlat tells it), within bud.
		return flattenNamedOneSide(b, rb, path, y, bud)
	case len(ys) == 0:
		return flattenNamedOneSide(a, ra, path, x, bud)
	}
	nx, ny := rawMemberNames(xs), rawMemberNames(ys)
	if nx == nil || ny == nil {
		return false
	}
	ra[path], rb[path] = nx, ny
	inX, inY := sortedNames(nx), sortedNames(ny)
	for i, n := range nx {
		j, ok := inY.find(n)
		if ok && bytes.Equal(ys[j], xs[i]) || !bud.take() {
			continue
		}
		flattenRaw(a, ra, memberPath(path, n), xs[i])
		if ok {
			flattenRaw(b, rb, memberPath(path, n), ys[j])
		}
	}
	for i, n := range ny {
		if inX.has(n) || !bud.take() {
			continue
		}
		flattenRaw(b, rb, memberPath(path, n), ys[i])
	}
	return true
}

// flattenRaw flattens the encoded value raw at path.
func flattenRaw(m map[string]string, order map[string][]string, path string, raw []byte) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return
	}
	flattenValue(m, order, path, v)
}

// topSections splits an encoded config into its top-level sections (the
// values are slices of data); ok is false when data is not one object.
func topSections(data []byte) (map[string][]byte, bool) {
	secs := make(map[string][]byte, 32)
	end, err := jsonscan.WalkObject(data, 0, maxScanLevels, func(key []byte, vs, ve int) error {
		secs[string(key)] = data[vs:ve]
		return nil
	})
	if err != nil || jsonscan.SkipSpace(data, end) != len(data) {
		return nil, false
	}
	return secs, true
}

// listMembers splits an encoded list into its members (slices of raw); nil
// when raw is not a list, or an empty one.
func listMembers(raw []byte) [][]byte {
	if len(raw) == 0 || raw[0] != '[' {
		return nil
	}
	// Counted first: grown by append, the list of 50,000 members was
	// reallocated at each step.
	n := 0
	if _, err := jsonscan.WalkArray(raw, 0, maxScanLevels, func(vs, ve int) error {
		n++
		return nil
	}); err != nil || n == 0 {
		return nil
	}
	out := make([][]byte, 0, n)
	jsonscan.WalkArray(raw, 0, maxScanLevels, func(vs, ve int) error {
		out = append(out, raw[vs:ve])
		return nil
	})
	return out
}

// rawMemberNames is memberNames of encoded members.
func rawMemberNames(members [][]byte) []string {
	for _, key := range [...]string{"name", "id"} {
		names := make([]string, 0, len(members))
		for _, e := range members {
			if len(e) == 0 || e[0] != '{' {
				return nil
			}
			n, ok := objectString(e, key)
			if !ok || n == "" {
				break
			}
			names = append(names, n)
		}
		if len(names) == len(members) && sortedNames(names).unique() {
			return names
		}
	}
	return nil
}

// objectString returns the string member key of the encoded object obj
// (the last one, as a decoded map keeps); ok is false when there is none or
// it is not a string.
func objectString(obj []byte, key string) (string, bool) {
	var val []byte
	found := false
	_, err := jsonscan.WalkObject(obj, 0, maxScanLevels, func(k []byte, vs, ve int) error {
		if string(k) == key {
			val, found = obj[vs:ve], true
		}
		return nil
	})
	if err != nil || !found || len(val) < 2 || val[0] != '"' {
		return "", false
	}
	return string(jsonscan.Key(val[1 : len(val)-1])), true
}

// memberNames returns the names of a list's members when each is an
// object whose "name" (else "id") is a string, not empty and unique in the
// list; nil otherwise (the members are then told by position).
func memberNames(list []any) []string {
	for _, key := range [...]string{"name", "id"} {
		names := make([]string, 0, len(list))
		seen := make(map[string]bool, len(list))
		for _, e := range list {
			o, ok := e.(map[string]any)
			if !ok {
				return nil
			}
			n, ok := o[key].(string)
			if !ok || n == "" || seen[n] {
				break
			}
			seen[n] = true
			names = append(names, n)
		}
		if len(names) == len(list) {
			return names
		}
	}
	return nil
}

// auditString quotes a value for the audit log: a user key hash shows only
// its key id, and long values are cut.
func auditString(s string) string {
	if rest, ok := strings.CutPrefix(s, keyHashPrefix); ok {
		id, _, _ := strings.Cut(rest, "$")
		return "key " + id
	}
	if len(s) > maxAuditValue {
		s = s[:maxAuditValue] + "..."
	}
	data, _ := json.Marshal(s)
	return string(data)
}

// keyHashPrefix starts a stored user key hash (config.KeyHashPrefix).
const keyHashPrefix = "ifr1$"
