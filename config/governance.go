package config

// Request rate limiting and user rate limiting (configuration center,
// "Request rate limiting" and "User rate limiting"). The govern package
// enforces what is declared here; docs/governance.md is the reference.

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	_ "time/tzdata" // user_limit.timezone must load on hosts without /usr/share/zoneinfo
	"unicode"
	"unicode/utf8"

	"github.com/infera/infera/internal/jsonscan"
)

// Over-limit handling of a concurrency limit.
const (
	OverlimitReject = "reject"
	OverlimitQueue  = "queue"
)

// Scopes of request rate limiting: what one concurrency counter covers.
const (
	ScopeInstance = "instance"
	ScopeService  = "service"
	ScopeGateway  = "gateway"
)

// What counters do when the shared state store (--state redis://...) cannot
// be reached.
const (
	StateErrorOpen   = "open"
	StateErrorClosed = "closed"
)

// Quota window periods.
const (
	Period5h    = "5h"
	PeriodDay   = "day"
	PeriodWeek  = "week"
	PeriodMonth = "month"
)

// Limits that keep every counter far from int64/float64 precision trouble.
const (
	maxLimit       = 1 << 40 // requests or tokens in one limit
	maxQueueSize   = 1 << 20
	maxTokenWeight = 1e6
	maxUserName    = 64
)

// RateLimit is request rate limiting: concurrency limits that protect the
// engines. A limit of 0 means no limit.
type RateLimit struct {
	// Scope is what one counter covers: instance (each engine instance has
	// its own seats), service (the instances of one service share them) or
	// gateway (one set of seats for the whole gateway). Default instance.
	Scope string `json:"scope"`
	// Overlimit is reject (429 at once) or queue (wait in a bounded FIFO
	// queue up to QueueTimeoutMS). Default reject.
	Overlimit string `json:"overlimit"`
	// OverallConcurrency counts a request from dispatch to the end of its
	// response (PD-integrated instances only). 0: no limit.
	OverallConcurrency int `json:"overall_concurrency"`
	// PrefillConcurrency counts a request from dispatch to its first token
	// (PD-integrated instances and PD-disaggregated prefill instances).
	PrefillConcurrency int `json:"prefill_concurrency"`
	// DecodeConcurrency counts a request on a PD-disaggregated decode
	// instance from its first token to the end of its response.
	DecodeConcurrency int `json:"decode_concurrency"`
	// QueueSize bounds the waiting queue (overlimit queue). Default 1000.
	QueueSize int `json:"queue_size"`
	// QueueTimeoutMS is the longest a request waits for a seat. Default 30000.
	QueueTimeoutMS float64 `json:"queue_timeout_ms"`
	// DryRun evaluates and counts the limits but blocks nothing.
	DryRun bool `json:"dry_run"`
	// OnStateError is open (admit) or closed (503) when the shared state
	// store cannot be reached. Default open.
	OnStateError string `json:"on_state_error"`
}

// DefaultRateLimit returns request rate limiting's defaults (no limits).
func DefaultRateLimit() RateLimit {
	return RateLimit{
		Scope:          ScopeInstance,
		Overlimit:      OverlimitReject,
		QueueSize:      1000,
		QueueTimeoutMS: 30000,
		OnStateError:   StateErrorOpen,
	}
}

// Limited reports whether any concurrency limit is set.
func (r *RateLimit) Limited() bool {
	return r.OverallConcurrency > 0 || r.PrefillConcurrency > 0 || r.DecodeConcurrency > 0
}

func (r *RateLimit) validate() error {
	switch r.Scope {
	case "", ScopeInstance, ScopeService, ScopeGateway:
	default:
		return fieldErr("rate_limit.scope", "%q: want instance, service or gateway", r.Scope)
	}
	if err := validOverlimit("rate_limit.overlimit", r.Overlimit); err != nil {
		return err
	}
	for _, f := range []struct {
		path string
		v    int
	}{
		{"rate_limit.overall_concurrency", r.OverallConcurrency},
		{"rate_limit.prefill_concurrency", r.PrefillConcurrency},
		{"rate_limit.decode_concurrency", r.DecodeConcurrency},
	} {
		if f.v < 0 || f.v > maxLimit {
			return fieldErr(f.path, "%d: want 0 (no limit) .. %d", f.v, maxLimit)
		}
	}
	if err := validQueue("rate_limit", r.Overlimit, r.QueueSize, r.QueueTimeoutMS); err != nil {
		return err
	}
	return validStateError("rate_limit.on_state_error", r.OnStateError)
}

// UserLimit is user rate limiting: quota templates bound to users. The zero
// value is valid: an empty string setting means its default.
type UserLimit struct {
	// Timezone is the IANA timezone of allowed calling periods and of the
	// day, week and month quota boundaries. Default UTC.
	Timezone string `json:"timezone"`
	// DryRun evaluates and counts every template's rules but blocks
	// nothing (a global switch; each template has its own too).
	DryRun bool `json:"dry_run"`
	// OnStateError is open (admit) or closed (503) when the shared state
	// store cannot be reached. Default open.
	OnStateError string `json:"on_state_error"`
	// MetricsMaxUsers bounds the users that get per-user metric series (the
	// first ones in the users list). 0 means the default, 100; at most
	// 10000.
	MetricsMaxUsers int `json:"metrics_max_users"`
	// Templates are the quota templates; at most one is the default.
	Templates []QuotaTemplate `json:"templates"`
}

// DefaultUserLimit returns user rate limiting's defaults (no templates).
func DefaultUserLimit() UserLimit {
	return UserLimit{Timezone: "UTC", OnStateError: StateErrorOpen, MetricsMaxUsers: 100}
}

// QuotaTemplate is a set of limits bound to users. Each of its four
// capabilities has its own Enabled switch: switching one off keeps its
// settings for later.
type QuotaTemplate struct {
	Name string `json:"name"`
	// Default: users without a template use this one.
	Default bool `json:"default"`
	// DryRun evaluates and counts this template's rules, blocking nothing.
	DryRun bool `json:"dry_run"`

	Periods     AllowedPeriods  `json:"periods"`
	Quota       PeriodicQuota   `json:"quota"`
	Concurrency UserConcurrency `json:"concurrency"`
	Rate        UserRate        `json:"rate"`
}

// AllowedPeriods are the local times at which requests are allowed.
type AllowedPeriods struct {
	Enabled bool `json:"enabled"`
	// Segments: a request is allowed when its local time falls in any
	// segment. Empty: always allowed.
	Segments []PeriodSegment `json:"segments"`
}

// PeriodSegment is one allowed stretch of a day: from Start to End
// inclusive ("HH:MM", minute precision: End 18:00 allows up to 18:00:59),
// on Days (mon..sun; empty or all seven: every day). A period across
// midnight is two segments: fri 22:00-23:59 and sat 00:00-02:00.
type PeriodSegment struct {
	Days  []string `json:"days"`
	Start string   `json:"start"`
	End   string   `json:"end"`
}

// PeriodicQuota caps requests and weighted tokens per calendar window.
type PeriodicQuota struct {
	Enabled bool         `json:"enabled"`
	Weights TokenWeights `json:"weights"`
	// Windows: at most one per period.
	Windows []QuotaWindow `json:"windows"`
}

// TokenWeights turn an engine's reported usage into quota tokens:
// Input x (prompt tokens not served from the prefix cache) + Cached x
// (cached prompt tokens) + Output x (completion tokens). Default 1 each.
type TokenWeights struct {
	Input  float64 `json:"input"`
	Output float64 `json:"output"`
	Cached float64 `json:"cached"`
}

// QuotaWindow is one periodic quota: Period is 5h, day, week or month
// (boundaries in user_limit.timezone); 0 means no limit.
type QuotaWindow struct {
	Period      string `json:"period"`
	MaxRequests int64  `json:"max_requests"`
	MaxTokens   int64  `json:"max_tokens"`
}

// UserConcurrency limits a user's requests in flight.
type UserConcurrency struct {
	Enabled bool `json:"enabled"`
	// Limit is the most requests of one user in flight at once.
	Limit int `json:"limit"`
	// Overlimit is reject or queue. Default reject.
	Overlimit string `json:"overlimit"`
	// QueueSize bounds the user's waiting queue. Default 100.
	QueueSize int `json:"queue_size"`
	// QueueTimeoutMS is the longest a request waits. Default 30000.
	QueueTimeoutMS float64 `json:"queue_timeout_ms"`
}

// UserRate is the RPM and TPM token buckets of a user.
type UserRate struct {
	Enabled bool `json:"enabled"`
	// RPM is requests per minute; 0 means no limit.
	RPM int64 `json:"rpm"`
	// TPM is tokens (prompt + completion) per minute; 0 means no limit.
	TPM int64 `json:"tpm"`
	// DefaultOutputTokens is the output estimate pre-deducted for a request
	// without max_tokens. Default 1024.
	DefaultOutputTokens int64 `json:"default_output_tokens"`
}

// DefaultQuotaTemplate is what a template's omitted fields are.
func DefaultQuotaTemplate() QuotaTemplate {
	return QuotaTemplate{
		Quota:       PeriodicQuota{Weights: TokenWeights{Input: 1, Output: 1, Cached: 1}},
		Concurrency: UserConcurrency{Overlimit: OverlimitReject, QueueSize: 100, QueueTimeoutMS: 30000},
		Rate:        UserRate{DefaultOutputTokens: 1024},
	}
}

// UnmarshalJSON decodes a template over its defaults, refusing unknown fields.
func (t *QuotaTemplate) UnmarshalJSON(b []byte) error {
	type plain QuotaTemplate
	v := plain(DefaultQuotaTemplate())
	if err := decodeStrict(b, &v); err != nil {
		return err
	}
	*t = QuotaTemplate(v)
	return nil
}

// Bounds of users[].models: patterns per user and bytes per pattern.
const (
	MaxUserModels       = 256
	MaxUserModelPattern = 256
)

// MaxAPIUserKeys bounds the keys the admin API lets one user hold
// (rotation needs two or three): POST /api/users/{name}/keys mints no more,
// and no other API write (a section write, an import) grows a user past it.
// It is not a validation rule: a config or snapshot holding more still
// loads, and an API write may keep a user at what it holds.
const MaxAPIUserKeys = 64

// MaxAPIUsers bounds the users POST /api/users creates: at this many users
// it creates no more (409) until some are deleted. Like MaxAPIUserKeys it
// is not a validation rule: a config, snapshot or import holding more
// still loads.
const MaxAPIUsers = 10000

// User is one API user.
type User struct {
	// Name identifies the user in metrics, logs and counters: 1-64 of
	// A-Z a-z 0-9 . _ @ + - starting with a letter or digit.
	Name string `json:"name"`
	// Keys are the stored hashes of the user's API keys (never the keys):
	// `infera key new` prints a key and its hash.
	Keys []string `json:"keys"`
	// Template names the user's quota template; empty: the default one.
	Template string `json:"template"`
	// Models are the models the user may call: names or '*' patterns
	// ("qwen3-*"), matched without regard to case against the model the
	// client asks for. Empty: every model.
	Models []string `json:"models,omitempty"`
	// Enabled: a disabled user's keys get 403. Default true.
	Enabled bool `json:"enabled"`
}

// UnmarshalJSON decodes a user with Enabled defaulting to true.
func (u *User) UnmarshalJSON(b []byte) error {
	if v, ok := plainUser(b); ok {
		*u = v
		return nil
	}
	type plain User
	v := plain{Enabled: true}
	if userKeysExact(b) {
		// Every key is a field's own name (as the config is written back):
		// no unknown field to refuse, so no Decoder of its own, whose
		// buffer and state were most of what parsing 10,000 users cost.
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
	} else if err := decodeStrict(b, &v); err != nil {
		return err
	}
	*u = User(v)
	return nil
}

// plainUser decodes the user object b by hand when it is written as the
// config is written back: each key a field's own name, at most once, each
// value a string without escapes, a list of such strings, true, false or
// null. It decodes it as encoding/json would (null leaves a field as it
// is, [] is an empty list, not nil) and allocates only the strings and the
// lists: a json.Unmarshal per user, with its decoder state and a heap copy
// of the user, was most of what decoding a config of many users
// allocated. ok is false for anything else (escapes, another key, a
// repeated key, a number...), which UnmarshalJSON leaves to encoding/json:
// its result and its errors are theirs.
func plainUser(b []byte) (u User, ok bool) {
	u.Enabled = true
	var seen [len(userFieldNames)]bool
	end, err := jsonscan.WalkMembers(b, 0, func(raw []byte, vs int) (int, error) {
		f := -1
		for i, name := range userFieldNames {
			if string(raw) == name {
				f = i
				break
			}
		}
		if f < 0 || seen[f] {
			return vs, errNotPlain
		}
		seen[f] = true
		if b[vs] == 'n' {
			return jsonscan.SkipValue(b, vs, 0) // null: as it is
		}
		switch f {
		case 0, 2: // name, template
			s, ve, ok := plainString(b, vs)
			if !ok {
				return vs, errNotPlain
			}
			if f == 0 {
				u.Name = s
			} else {
				u.Template = s
			}
			return ve, nil
		case 1, 3: // keys, models
			list, ve, ok := plainStrings(b, vs)
			if !ok {
				return vs, errNotPlain
			}
			if f == 1 {
				u.Keys = list
			} else {
				u.Models = list
			}
			return ve, nil
		default: // enabled
			if b[vs] != 't' && b[vs] != 'f' {
				return vs, errNotPlain
			}
			u.Enabled = b[vs] == 't'
			return jsonscan.SkipValue(b, vs, 0)
		}
	})
	if err != nil || jsonscan.SkipSpace(b, end) != len(b) {
		return User{}, false
	}
	return u, true
}

// errNotPlain ends plainUser's walk.
var errNotPlain = errors.New("not a plain user")

// plainString reads the string at b[i] when it has no escapes (its bytes
// are then its value), and returns it and the index after it.
func plainString(b []byte, i int) (string, int, bool) {
	raw, next, ok := plainRaw(b, i)
	if !ok {
		return "", i, false
	}
	return string(raw), next, true
}

// plainRaw is plainString's bytes, in b.
func plainRaw(b []byte, i int) ([]byte, int, bool) {
	if b[i] != '"' {
		return nil, i, false
	}
	raw, next, err := jsonscan.ScanString(b, i)
	if err != nil || jsonscan.HasEscape(raw) {
		return nil, i, false
	}
	return raw, next, true
}

// plainStrings reads the list of plain strings (plainString) at b[i] into
// a slice of its length ([] into an empty one, as encoding/json does), and
// returns it and the index after it.
func plainStrings(b []byte, i int) ([]string, int, bool) {
	if b[i] != '[' {
		return nil, i, false
	}
	n := 0
	end, err := jsonscan.WalkArray(b, i, 1, func(vs, _ int) error {
		if _, _, ok := plainRaw(b, vs); !ok {
			return errNotPlain
		}
		n++
		return nil
	})
	if err != nil {
		return nil, i, false
	}
	list := make([]string, 0, n)
	jsonscan.WalkArray(b, i, 1, func(vs, _ int) error {
		raw, _, _ := plainRaw(b, vs)
		list = append(list, string(raw))
		return nil
	})
	return list, end, true
}

// userKeysExact reports whether b is an object whose keys are all, as
// written, the JSON names of User's fields (each at most once).
func userKeysExact(b []byte) bool {
	var seen [5]bool
	_, err := jsonscan.WalkObject(b, 0, 2, func(key []byte, _, _ int) error {
		for i, name := range userFieldNames {
			if string(key) == name && !seen[i] {
				seen[i] = true
				return nil
			}
		}
		return jsonscan.ErrSyntax
	})
	return err == nil
}

// userFieldNames are the JSON names of User's fields.
var userFieldNames = [5]string{"name", "keys", "template", "models", "enabled"}

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func validOverlimit(path, v string) error {
	if v != "" && v != OverlimitReject && v != OverlimitQueue {
		return fieldErr(path, "%q: want reject or queue", v)
	}
	return nil
}

func validStateError(path, v string) error {
	if v != "" && v != StateErrorOpen && v != StateErrorClosed {
		return fieldErr(path, "%q: want open or closed", v)
	}
	return nil
}

func validQueue(prefix, overlimit string, size int, timeoutMS float64) error {
	if size < 0 || size > maxQueueSize {
		return fieldErr(prefix+".queue_size", "%d: want 0..%d", size, maxQueueSize)
	}
	if err := millis(prefix+".queue_timeout_ms", timeoutMS); err != nil {
		return err
	}
	if overlimit == OverlimitQueue {
		if size == 0 {
			return fieldErr(prefix+".queue_size", "must be positive with overlimit queue")
		}
		if timeoutMS == 0 {
			return fieldErr(prefix+".queue_timeout_ms", "must be positive with overlimit queue")
		}
	}
	return nil
}

func (u *UserLimit) validate(c *Config) error {
	// "" is UTC. time.LoadLocation also takes "Local", the host's zone
	// (the process's TZ): not an IANA name, and routers started with
	// different TZ would disagree on every window and period.
	if _, err := time.LoadLocation(u.Timezone); err != nil || u.Timezone == "Local" {
		return fieldErr("user_limit.timezone", "%q is not an IANA timezone", u.Timezone)
	}
	if err := validStateError("user_limit.on_state_error", u.OnStateError); err != nil {
		return err
	}
	if u.MetricsMaxUsers < 0 || u.MetricsMaxUsers > 10000 {
		return fieldErr("user_limit.metrics_max_users", "%d: want 0..10000", u.MetricsMaxUsers)
	}
	templates := make(map[string]bool, len(u.Templates))
	defaults := 0
	for i := range u.Templates {
		t := &u.Templates[i]
		p := fmt.Sprintf("user_limit.templates[%d]", i)
		if t.Name == "" {
			return fieldErr(p+".name", "is required")
		}
		if !validTemplateName(t.Name) {
			return fieldErr(p+".name", "%s: want 1-%d bytes of printable UTF-8 (no control or invisible characters, no space but ' ') without '/', not starting or ending with a space, and not . or .. (a path segment of /api/templates/{name})", quotedKey(t.Name), maxTemplateName)
		}
		if templates[t.Name] {
			return fieldErr(p+".name", "duplicate template %q", t.Name)
		}
		templates[t.Name] = true
		if t.Default {
			defaults++
			if defaults > 1 {
				return fieldErr(p+".default", "only one template may be the default")
			}
		}
		if err := t.validate(p); err != nil {
			return err
		}
	}
	users := make(map[string]bool, len(c.Users))
	nkeys := 0
	for i := range c.Users {
		nkeys += len(c.Users[i].Keys)
	}
	keyIDs := make(map[string]bool, nkeys)
	for i := range c.Users {
		us := &c.Users[i]
		// The paths are made only for an error: a config of 10,000 users
		// is validated several times per admin write.
		p := func() string { return fmt.Sprintf("users[%d]", i) }
		if !ValidUserName(us.Name) {
			return fieldErr(p()+".name", "%s: want 1-%d of A-Z a-z 0-9 . _ @ + - starting with a letter or digit", quotedKey(us.Name), maxUserName)
		}
		if users[us.Name] {
			return fieldErr(p()+".name", "duplicate user %q", us.Name)
		}
		users[us.Name] = true
		if us.Template != "" && !templates[us.Template] {
			// Named with its user: a template deleted while bound is
			// refused here, and the user is what the operator must change.
			return fieldErr(p()+".template", "no quota template named %s (bound to user %q)", quotedKey(us.Template), us.Name)
		}
		if len(us.Models) > MaxUserModels {
			return fieldErr(p()+".models", "%d patterns: at most %d", len(us.Models), MaxUserModels)
		}
		for j, m := range us.Models {
			if m == "" || len(m) > MaxUserModelPattern || !utf8.ValidString(m) {
				return fieldErr(fmt.Sprintf("%s.models[%d]", p(), j), "want a model name or '*' pattern of 1-%d bytes", MaxUserModelPattern)
			}
		}
		for j, k := range us.Keys {
			kp := func() string { return fmt.Sprintf("%s.keys[%d]", p(), j) }
			if LooksLikeKey(k) {
				// Do not echo it: it is a secret.
				return fieldErr(kp(), "is an API key in clear; store its hash (infera key hash) instead, and consider the key leaked")
			}
			id, ok := plainKeyHashID(k)
			if !ok {
				h, err := ParseKeyHash(k)
				if err != nil {
					return fieldErr(kp(), "%v", err)
				}
				id = h.ID
			}
			if keyIDs[id] {
				return fieldErr(kp(), "key id %s is used twice", id)
			}
			keyIDs[id] = true
		}
	}
	return nil
}

func (t *QuotaTemplate) validate(p string) error {
	for i, s := range t.Periods.Segments {
		sp := fmt.Sprintf("%s.periods.segments[%d]", p, i)
		for j, d := range s.Days {
			if _, ok := ParseWeekday(d); !ok {
				return fieldErr(fmt.Sprintf("%s.days[%d]", sp, j), "%q: want mon, tue, wed, thu, fri, sat or sun", d)
			}
		}
		start, ok := ParseClock(s.Start)
		if !ok {
			return fieldErr(sp+".start", "%q: want HH:MM (00:00..23:59)", s.Start)
		}
		end, ok := ParseClock(s.End)
		if !ok {
			return fieldErr(sp+".end", "%q: want HH:MM (00:00..23:59)", s.End)
		}
		if end < start {
			return fieldErr(sp+".end", "%s is before start %s: split a period across midnight into two segments (22:00-23:59 and 00:00-02:00 of the next day)", s.End, s.Start)
		}
	}
	w := t.Quota.Weights
	for _, f := range []struct {
		name string
		v    float64
	}{{"input", w.Input}, {"output", w.Output}, {"cached", w.Cached}} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > maxTokenWeight {
			return fieldErr(p+".quota.weights."+f.name, "must be in [0, %g]", float64(maxTokenWeight))
		}
	}
	seen := map[string]bool{}
	for i, win := range t.Quota.Windows {
		wp := fmt.Sprintf("%s.quota.windows[%d]", p, i)
		switch win.Period {
		case Period5h, PeriodDay, PeriodWeek, PeriodMonth:
		default:
			return fieldErr(wp+".period", "%q: want 5h, day, week or month", win.Period)
		}
		if seen[win.Period] {
			return fieldErr(wp+".period", "a second %s window: one window per period", win.Period)
		}
		seen[win.Period] = true
		if win.MaxRequests < 0 || win.MaxRequests > maxLimit {
			return fieldErr(wp+".max_requests", "%d: want 0 (no limit) .. %d", win.MaxRequests, int64(maxLimit))
		}
		if win.MaxTokens < 0 || win.MaxTokens > maxLimit {
			return fieldErr(wp+".max_tokens", "%d: want 0 (no limit) .. %d", win.MaxTokens, int64(maxLimit))
		}
	}
	cc := t.Concurrency
	if cc.Limit < 0 || cc.Limit > maxLimit {
		return fieldErr(p+".concurrency.limit", "%d: want 0..%d", cc.Limit, maxLimit)
	}
	if cc.Enabled && cc.Limit == 0 {
		return fieldErr(p+".concurrency.limit", "must be positive when concurrency is enabled")
	}
	if err := validOverlimit(p+".concurrency.overlimit", cc.Overlimit); err != nil {
		return err
	}
	if err := validQueue(p+".concurrency", cc.Overlimit, cc.QueueSize, cc.QueueTimeoutMS); err != nil {
		return err
	}
	r := t.Rate
	if r.RPM < 0 || r.RPM > maxLimit {
		return fieldErr(p+".rate.rpm", "%d: want 0 (no limit) .. %d", r.RPM, int64(maxLimit))
	}
	if r.TPM < 0 || r.TPM > maxLimit {
		return fieldErr(p+".rate.tpm", "%d: want 0 (no limit) .. %d", r.TPM, int64(maxLimit))
	}
	if r.DefaultOutputTokens < 0 || r.DefaultOutputTokens > maxLimit {
		return fieldErr(p+".rate.default_output_tokens", "%d: want 0..%d", r.DefaultOutputTokens, int64(maxLimit))
	}
	return nil
}

// ValidUserName reports whether s may name a user (it appears in metric
// labels and Redis keys, so the alphabet is small).
func ValidUserName(s string) bool {
	if s == "" || len(s) > maxUserName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || strings.IndexByte("._@+-", c) < 0) {
			return false
		}
	}
	return true
}

// maxTemplateName bounds a quota template's name.
const maxTemplateName = 64

// validTemplateName reports whether s may name a quota template: it is a
// path segment of the admin API (/api/templates/{name}) and is shown in
// the console and the logs, so it is printable UTF-8 without '/', without
// surrounding spaces, and not "." or ".."; a console user may still write
// "Gold tier".
func validTemplateName(s string) bool {
	if s == "" || len(s) > maxTemplateName || !utf8.ValidString(s) || strings.TrimSpace(s) != s {
		return false
	}
	if s == "." || s == ".." {
		// Dot segments: clients remove them from a path, so no URL
		// reaches /api/templates/{name} for such a name.
		return false
	}
	prev := rune(-1)
	for _, r := range s {
		// Printable (unicode.IsPrint: no control or format characters,
		// no space but ASCII's): an invisible character made a name that
		// looks like another in the console ("gold\u200b").
		if r == '/' || !unicode.IsPrint(r) || r == utf8.RuneError || shownAsNothing(r, prev) {
			return false
		}
		prev = r
	}
	return true
}

// shownAsNothing reports whether r, after prev (-1 at the start), is
// printable to unicode.IsPrint yet drawn as nothing or as a blank: the
// rest of Unicode's Default_Ignorable_Code_Point (a combining grapheme
// joiner, the Hangul fillers, Khmer's inherent vowels), the blank braille
// cell, and a variation selector that selects nothing (at the start or
// after an ASCII character: "gold\ufe0f" shows as "gold"; after an emoji
// or an ideograph it is part of the character).
func shownAsNothing(r, prev rune) bool {
	switch {
	case r < utf8.RuneSelf:
		return false
	case r == '\u2800' || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r):
		return true
	case unicode.Is(unicode.Variation_Selector, r):
		return prev < utf8.RuneSelf
	}
	return false
}

// ParseWeekday maps mon..sun (any case, or the full English name) to a
// time.Weekday.
func ParseWeekday(s string) (time.Weekday, bool) {
	s = strings.ToLower(s)
	for d := time.Sunday; d <= time.Saturday; d++ {
		full := strings.ToLower(d.String())
		if s == full || s == full[:3] {
			return d, true
		}
	}
	return 0, false
}

// ParseClock parses "HH:MM" (00:00..23:59) into minutes after midnight.
func ParseClock(s string) (int, bool) {
	if len(s) != 5 || s[2] != ':' {
		return 0, false
	}
	for _, i := range [4]int{0, 1, 3, 4} {
		if s[i] < '0' || s[i] > '9' { // no sign: "00:-0" is not a time
			return 0, false
		}
	}
	h := int(s[0]-'0')*10 + int(s[1]-'0')
	m := int(s[3]-'0')*10 + int(s[4]-'0')
	if h > 23 || m > 59 {
		return 0, false
	}
	return h*60 + m, true
}

// API key formats. A key is KeyPrefix + 16 hex digits of key id + "_" +
// 43 base64url characters of secret (32 random bytes). Its stored form is
// KeyHashPrefix + id + "$" + salt + "$" + SHA-256(salt || key), salt (16
// bytes) and digest in unpadded base64url. The key id lets a key's record be
// found without trying every stored hash; only the digest proves the key.
const (
	KeyPrefix     = "ifr_"
	KeyHashPrefix = "ifr1$"
	KeyIDLen      = 16
	KeySecretLen  = 43
	KeyLen        = len(KeyPrefix) + KeyIDLen + 1 + KeySecretLen
	KeySaltBytes  = 16
)

// KeyHash is a parsed stored key hash.
type KeyHash struct {
	ID   string
	Salt []byte
	Sum  [32]byte
}

// ParseKeyHash parses a stored key hash. Its errors never quote the input.
func ParseKeyHash(s string) (KeyHash, error) {
	var h KeyHash
	rest, ok := strings.CutPrefix(s, KeyHashPrefix)
	if !ok {
		return h, fmt.Errorf("not a key hash: want %s<key id>$<salt>$<digest> as printed by infera key new", KeyHashPrefix)
	}
	// Cut, and the digest decoded in place: a split and a decoded copy
	// of the digest were most of what compiling a user's key allocated
	// (govern.Governor.Apply; TestParsingAKeyHashAllocatesItsSaltAlone).
	id, rest, ok := strings.Cut(rest, "$")
	salt64, sum64, ok2 := strings.Cut(rest, "$")
	if !ok || !ok2 || strings.Contains(sum64, "$") {
		return h, fmt.Errorf("malformed key hash: want 3 $-separated parts after %s", KeyHashPrefix)
	}
	if !validKeyID(id) {
		return h, fmt.Errorf("malformed key hash: the key id must be %d lowercase hex digits", KeyIDLen)
	}
	h.ID = id
	salt, err := base64.RawURLEncoding.DecodeString(salt64)
	if err != nil || len(salt) != KeySaltBytes {
		return h, fmt.Errorf("malformed key hash: the salt must be %d bytes in base64url", KeySaltBytes)
	}
	h.Salt = salt
	// The digest goes through buffers on the stack (base64 skips line
	// breaks: its encoding may be longer than 43 characters).
	var src [64]byte
	var sum [48]byte // base64.RawURLEncoding.DecodedLen(len(src))
	var n int
	if len(sum64) <= len(src) {
		n, err = base64.RawURLEncoding.Decode(sum[:], src[:copy(src[:], sum64)])
	} else {
		var b []byte
		b, err = base64.RawURLEncoding.DecodeString(sum64)
		n = len(b)
		copy(sum[:], b)
	}
	if err != nil || n != len(h.Sum) {
		return h, fmt.Errorf("malformed key hash: the digest must be %d bytes in base64url", len(h.Sum))
	}
	copy(h.Sum[:], sum[:n])
	return h, nil
}

// plainKeyHashID returns the key id of s, without allocating, when s is a
// key hash as infera writes it: the prefix, the key id, and the salt and
// digest in unpadded base64url without line breaks. ParseKeyHash takes
// every such s (base64 of those lengths decodes to 16 and 32 bytes
// whatever its characters of the alphabet), and decides the rest (it
// also takes line breaks, which base64 skips). Validation checked every
// key of every user with ParseKeyHash: a split and two decoded slices
// per key.
func plainKeyHashID(s string) (string, bool) {
	const (
		saltLen = (KeySaltBytes*8 + 5) / 6 // 22
		sumLen  = (sha256.Size*8 + 5) / 6  // 43
		idEnd   = len(KeyHashPrefix) + KeyIDLen
	)
	if len(s) != idEnd+1+saltLen+1+sumLen || s[:len(KeyHashPrefix)] != KeyHashPrefix ||
		s[idEnd] != '$' || s[idEnd+1+saltLen] != '$' {
		return "", false
	}
	id := s[len(KeyHashPrefix):idEnd]
	if !validKeyID(id) || !base64URLRaw(s[idEnd+1:idEnd+1+saltLen]) || !base64URLRaw(s[idEnd+1+saltLen+1:]) {
		return "", false
	}
	return id, true
}

// base64URLRaw reports whether s is all of the base64url alphabet.
func base64URLRaw(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// LooksLikeKey reports whether s has the shape of an API key in clear.
func LooksLikeKey(s string) bool {
	_, ok := KeyID(s)
	return ok
}

// KeyID returns the key id of a key in clear, without allocating.
func KeyID(key string) (string, bool) {
	if len(key) != KeyLen || key[:len(KeyPrefix)] != KeyPrefix || key[len(KeyPrefix)+KeyIDLen] != '_' {
		return "", false
	}
	id := key[len(KeyPrefix) : len(KeyPrefix)+KeyIDLen]
	if !validKeyID(id) {
		return "", false
	}
	return id, true
}

func validKeyID(s string) bool {
	if len(s) != KeyIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
