package admin

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"weak"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/jsonscan"
)

// Literal secrets of the config (upstream API keys, the mirror's token)
// take three forms here:
//   - in clear, in the config file (the operator wrote them there) and in
//     the working copy a change is built from;
//   - sealed ("enc:v2:..."), AES-256-GCM under a key derived from the seal
//     key (--admin-seal-key, else the admin key), in snapshots, exports and Redis, so a backup on shared storage
//     does not hold them in clear. The entry and address the secret
//     belongs to are the seal's additional data: a sealed key opens only
//     at the entry and address it was sealed for, so an edited export
//     cannot send it elsewhere. Keys sealed by earlier builds ("enc:v1:",
//     bound to nothing) are read from snapshots and Redis as before; sent
//     through the API (an import, a write) they count as redacted ones:
//     only for the key the same entry holds at the same address;
//   - redacted ("***" and 8 hex digits of a fingerprint) in API answers,
//     the console and the audit log. A write that sends a redacted secret
//     back keeps the secret with that fingerprint, but only for the
//     upstream entry that holds it (same section, same name, wherever it
//     moved in a list) at the same address: a fingerprint does not carry
//     a key to another entry or to a changed address, where the caller
//     would receive it as a bearer token; a fingerprint that matches
//     nothing is refused at its path;
//   - carried ("carry:v1:..."), in the working document a change is built
//     from (encodeClear): sealed under a key of this process only, with
//     the entry and address the secret belongs to, so a key the caller did
//     not send (an object merge-patched around it) obeys the same rule as
//     a redacted one.
// References (env:NAME, file:PATH) are resolved from the config file (and
// from snapshots and Redis, which hold what the file gave), never from the
// API: a write may keep an entry's current reference unchanged, at the
// same address, but not set one, so the API reads no host file or
// variable and cannot probe for them.
// User API keys are never in the config at all, only their salted hashes.

const (
	sealedPrefix   = "enc:v2:"
	sealedPrefixV1 = "enc:v1:"
	redactPrefix   = config.RedactedSecret
)

var secretType = reflect.TypeFor[config.Secret]()

// fingerprint identifies a secret without revealing it: 32 bits of an
// HMAC under a key derived from the seal key. It is in API answers, ETags
// and audit lines: unkeyed, anyone who read one could confirm a guess of a
// weak secret offline. Gateways with the same seal key (replicas, a
// restart) agree on it; without any key (no admin API) it is keyed by this
// process.
func (s *sealer) fingerprint(clear string) string {
	key := localFingerprintKey
	if s != nil {
		key = s.fpKey
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(clear))
	return hex.EncodeToString(mac.Sum(nil)[:4])
}

var localFingerprintKey = randomKey(32)

func (s *sealer) redacted(clear string) string { return redactPrefix + s.fingerprint(clear) }

// isRedacted reports whether v is a redacted form, and its fingerprint
// ("" for the bare placeholder).
func isRedacted(v string) (fp string, ok bool) {
	rest, ok := strings.CutPrefix(v, redactPrefix)
	if !ok {
		return "", false
	}
	if rest == "" {
		return "", true
	}
	if len(rest) != 8 {
		return "", false
	}
	if _, err := hex.DecodeString(rest); err != nil {
		return "", false
	}
	return rest, true
}

// sealer encrypts literal secrets at rest. A nil *sealer (no key) leaves
// them in clear.
type sealer struct {
	aead  cipher.AEAD   // seals, and opens first
	old   []cipher.AEAD // also open: the admin key's, when a seal key is set
	fpKey []byte        // keys fingerprints (of the key that seals)

	// redactedSum is the digest of the last redacted encoding noted
	// (noteRedacted), for the config it encodes.
	redactedSum atomic.Pointer[redactedDigest]
}

// redactedDigest is the SHA-256 of cfg's redacted encoding. cfg is weak:
// the digest keeps no config alive (a config replaced by an import of
// 50,000 users would stay live beside it). A config is never changed once
// parsed (the store swaps whole configs), so its encoding is a function of
// the pointer, for as long as the config lives.
type redactedDigest struct {
	cfg weak.Pointer[config.Config]
	sum [sha256.Size]byte
}

// noteRedacted returns the SHA-256 of data, the redacted encoding of c
// (encodeRedacted), and remembers it for c.
func (s *sealer) noteRedacted(c *config.Config, data []byte) [sha256.Size]byte {
	sum := sha256.Sum256(data)
	if s != nil {
		s.redactedSum.Store(&redactedDigest{cfg: weak.Make(c), sum: sum})
	}
	return sum
}

// redactedDigestOf returns the digest noteRedacted remembers for c, if it
// is c's.
func (s *sealer) redactedDigestOf(c *config.Config) ([sha256.Size]byte, bool) {
	if s == nil {
		return [sha256.Size]byte{}, false
	}
	if d := s.redactedSum.Load(); d != nil && d.cfg.Value() == c {
		return d.sum, true
	}
	return [sha256.Size]byte{}, false
}

// newSealer seals with the first non-empty key of sealKey and adminKey and
// opens with either.
//
// older are keys that sealed before and only open (--api-key, the admin
// key's default, when --admin-key is set apart later).
func newSealer(sealKey, adminKey string, older ...string) *sealer {
	var s *sealer
	seen := map[string]bool{}
	for _, k := range append([]string{sealKey, adminKey}, older...) {
		if k == "" || seen[k] {
			continue
		}
		seen[k] = true
		if s == nil {
			s = &sealer{aead: sealAEAD(k), fpKey: deriveKey(k, "infera admin secret fingerprints v1")}
		} else {
			s.old = append(s.old, sealAEAD(k))
		}
	}
	return s
}

// olderKeys are the keys that may have sealed secrets before under the
// flags f: --api-key, when --admin-key is set apart (an operator who
// follows security.md's advice after admin writes sealed the file under
// the admin key's default: the gateway did not start).
func olderKeys(f *config.Serve) []string {
	if f.AdminKey != "" && f.APIKey != "" && f.APIKey != f.AdminKey {
		return []string{f.APIKey}
	}
	return nil
}

func sealAEAD(secret string) cipher.AEAD {
	blk, err := aes.NewCipher(deriveKey(secret, "infera admin sealed secrets v1"))
	if err != nil {
		panic("BUG: aes: " + err.Error())
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		panic("BUG: gcm: " + err.Error())
	}
	return aead
}

// deriveKey derives a 32-byte key for purpose from secret (HKDF-SHA256).
func deriveKey(secret, purpose string) []byte {
	key, err := hkdf.Key(sha256.New, []byte(secret), nil, purpose, 32)
	if err != nil {
		panic("BUG: hkdf: " + err.Error())
	}
	return key
}

// sealAAD is the additional data of a sealed secret: the entry and the
// address it belongs to.
func sealAAD(owner, address string) []byte {
	return []byte("infera sealed secret v2\x00" + owner + "\x00" + address)
}

// seal seals the key of entry owner at address.
func (s *sealer) seal(owner, address, clear string) (string, error) {
	if s == nil {
		return clear, nil
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(clear)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := s.aead.Seal(nonce, nonce, []byte(clear), sealAAD(owner, address))
	return sealedPrefix + base64.RawURLEncoding.EncodeToString(out), nil
}

const msgNoAdminKey = "is sealed (enc:...) but this gateway has no key to open it: start it with the --admin-seal-key (or, without one, the --admin-key or --api-key) the snapshot was made with"

// openV1 opens a key an earlier build sealed (enc:v1:, no additional data).
func (s *sealer) openV1(v string) (string, error) {
	if s == nil {
		return "", errors.New(msgNoAdminKey)
	}
	return s.openRaw(strings.TrimPrefix(v, sealedPrefixV1), nil,
		"cannot be opened: it was sealed with another key (start with the --admin-seal-key, or without one the --admin-key, the snapshot was made with, or enter the key again)")
}

// open opens the key sealed for entry owner at address.
func (s *sealer) open(v, owner, address string) (string, error) {
	if s == nil {
		return "", errors.New(msgNoAdminKey)
	}
	return s.openRaw(strings.TrimPrefix(v, sealedPrefix), sealAAD(owner, address),
		"cannot be opened: re-enter the secret (it was sealed with another key, or for another upstream entry or address: a sealed key opens only at the entry and address it was sealed for)")
}

func (s *sealer) openRaw(b64 string, aad []byte, msg string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(b64)
	ns := s.aead.NonceSize()
	if err != nil || len(raw) < ns+s.aead.Overhead() {
		return "", errors.New("is a malformed sealed secret")
	}
	clear, err := s.aead.Open(nil, raw[:ns], raw[ns:], aad)
	for i := 0; err != nil && i < len(s.old); i++ {
		clear, err = s.old[i].Open(nil, raw[:ns], raw[ns:], aad)
	}
	if err != nil {
		return "", errors.New(msg)
	}
	return string(clear), nil
}

// fileCodec seals the literal secrets an admin write puts in the config
// file (config.Store.Apply) and opens them when the file is read back.
type fileCodec struct{ s *sealer }

func (f fileCodec) Seal(owner, address, key string) (string, error) {
	return f.s.seal(owner, address, key)
}

func (f fileCodec) Open(sealed, owner, address string) (string, error) {
	if strings.HasPrefix(sealed, sealedPrefixV1) {
		return f.s.openV1(sealed)
	}
	if !strings.HasPrefix(sealed, sealedPrefix) {
		return "", errors.New("is a malformed sealed secret")
	}
	key, err := f.s.open(sealed, owner, address)
	if err == nil && isReference(key) {
		return "", errors.New(msgReference) // the gateway seals keys only
	}
	return key, err
}

// FileSecretCodec is the codec of the config file for a gateway started
// with f: with a seal key (--admin-seal-key, else the admin key, else
// --api-key, as for snapshots) the literal secrets an admin API write puts
// in the file are sealed (enc:v2:, bound to their entry and address) and
// opened when it is read; nil without any key (they are then written in
// clear, as without the admin API).
func FileSecretCodec(f *config.Serve) config.SecretCodec {
	key := f.AdminKey
	if key == "" {
		key = f.APIKey
	}
	s := newSealer(f.AdminSealKey, key, olderKeys(f)...)
	if s == nil {
		return nil
	}
	return fileCodec{s}
}

// encodeClear is the form of the working document a change is built from
// and of comparisons: literal secrets are carried (see the top of this
// file), deterministically, so that equal configs encode equally within
// this process. It never leaves the process.
func encodeClear(c *config.Config) ([]byte, error) {
	return config.EncodeBound(c, func(owner, address, key string) (string, error) {
		return carrier.seal(owner, address, key), nil
	})
}

// clearDocOf is c as a working document (encodeClear, decoded).
func clearDocOf(c *config.Config) (map[string]any, error) {
	data, err := encodeClear(c)
	if err != nil {
		return nil, err
	}
	doc, err := decodeDoc(data)
	if err != nil {
		return nil, fmt.Errorf("BUG: a config does not decode: %w", err)
	}
	return doc, nil
}

func (s *sealer) encodeRedacted(c *config.Config) ([]byte, error) {
	return config.EncodeJSON(c, func(_, key string) (string, error) { return s.redacted(key), nil })
}

// encodeSealed is the form of snapshots and of Redis.
func (s *sealer) encodeSealed(c *config.Config) ([]byte, error) {
	return config.EncodeBound(c, s.seal)
}

// literalSecrets maps the fingerprints of c's literal secrets to the keys.
func (s *sealer) literalSecrets(c *config.Config) map[string]string {
	m := map[string]string{}
	config.EncodeJSON(c, func(_, key string) (string, error) {
		m[s.fingerprint(key)] = key
		return "", nil
	})
	return m
}

// randomKey returns n random bytes: a key of this process only.
func randomKey(n int) []byte {
	key := make([]byte, n)
	if _, err := rand.Read(key); err != nil {
		panic("BUG: crypto/rand: " + err.Error())
	}
	return key
}

const carriedPrefix = "carry:v1:"

// carrySealer seals secrets of the working document: AES-GCM under a key
// made at start, with a nonce derived from the content (an HMAC), so the
// same secret of the same entry encodes the same way.
type carrySealer struct {
	aead   cipher.AEAD
	macKey []byte
}

var carrier = newCarrySealer()

func newCarrySealer() *carrySealer {
	key := randomKey(64)
	blk, err := aes.NewCipher(key[:32])
	if err != nil {
		panic("BUG: aes: " + err.Error())
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		panic("BUG: gcm: " + err.Error())
	}
	return &carrySealer{aead: aead, macKey: key[32:]}
}

func (c *carrySealer) seal(owner, address, key string) string {
	plain := []byte(owner + "\x00" + address + "\x00" + key)
	mac := hmac.New(sha256.New, c.macKey)
	mac.Write(plain)
	nonce := mac.Sum(nil)[:c.aead.NonceSize()]
	return carriedPrefix + base64.RawURLEncoding.EncodeToString(c.aead.Seal(nonce, nonce, plain, nil))
}

// open returns what seal sealed; ok is false for anything else.
func (c *carrySealer) open(v string) (owner, address, key string, ok bool) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(v, carriedPrefix))
	ns := c.aead.NonceSize()
	if err != nil || len(raw) < ns+c.aead.Overhead() {
		return "", "", "", false
	}
	plain, err := c.aead.Open(nil, raw[:ns], raw[ns:], nil)
	if err != nil {
		return "", "", "", false
	}
	parts := strings.SplitN(string(plain), "\x00", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// isReference reports whether v is an env: or file: secret reference.
func isReference(v string) bool {
	return strings.HasPrefix(v, "env:") || strings.HasPrefix(v, "file:")
}

// heldSecret is a secret of a working document that stands for another
// (carried, redacted or a reference) and can be resolved only once the
// document is parsed, knowing the entry and address it lands at.
type heldSecret struct {
	sealed  string // sealed (enc:v2:): opened for the entry and address it lands at
	carried bool
	owner   string // carried: the entry and address it was sealed for
	address string
	key     string // carried: the key
	fp      string // redacted: the fingerprint
	ref     string // a reference
}

// heldSecrets replaces held secrets of a document by placeholders: unique
// literal keys that config.Parse accepts (and resolves nothing for) and
// that a caller cannot guess.
type heldSecrets struct {
	prefix string
	byKey  map[string]*heldSecret
}

// heldSecretPrefix begins every placeholder a parse holds a secret under.
const heldSecretPrefix = "infera-held-secret-"

func newHeldSecrets() *heldSecrets {
	var nonce [12]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		panic("BUG: crypto/rand: " + err.Error())
	}
	return &heldSecrets{prefix: heldSecretPrefix + hex.EncodeToString(nonce[:]) + "-", byKey: map[string]*heldSecret{}}
}

func (h *heldSecrets) hold(s *heldSecret) string {
	k := h.prefix + strconv.Itoa(len(h.byKey))
	h.byKey[k] = s
	return k
}

// Messages of the secrets a write may not use.
const (
	msgAddressChanged = "re-enter the secret: the upstream's address changed (a key the API did not receive in clear stays with the address it was entered for)"
	msgOtherUpstream  = "re-enter the secret: a redacted secret stands only for the key of the same upstream entry (same name), not another or a new one"
	msgReference      = "secret references (env:NAME, file:PATH) are read from the config file only, not set through the admin API: enter the key itself, or set the reference in the config file"
	msgStoredRef      = "a secret reference (env:NAME, file:PATH) in stored data is taken only where this gateway's config holds the same reference at the same entry and address: set it in the config file"
)

// resolve puts the held secrets' keys in c, the config parsed from the
// document, checking each against the entry and address it landed at:
// a carried key must be at the entry and address it was sealed for; a
// redacted one and a reference must be what cur holds at the same entry
// and address.
func (h *heldSecrets) resolve(s *sealer, c, cur, refs *config.Config) error {
	slots := func(c *config.Config) map[string]config.SecretSlot {
		if c == nil {
			return nil
		}
		list := c.AppendSecretSlots(nil)
		m := make(map[string]config.SecretSlot, len(list))
		for _, sl := range list {
			m[sl.Owner] = sl
		}
		return m
	}
	curSlots, refSlots := slots(cur), slots(refs)
	// Sealed secrets that do not open (another seal key) are all named in
	// one error, so the operator fixes them from one attempt.
	var unopened *config.FieldError
	var others []string
	fail := func(err error) error {
		if unopened != nil {
			return config.UnopenedSecrets(unopened.Path, unopened.Msg, others)
		}
		return err
	}
	for _, sl := range c.AppendSecretSlots(nil) {
		hs := h.byKey[sl.Secret.Reveal()]
		if hs == nil {
			continue
		}
		prev, known := curSlots[sl.Owner]
		if hs.ref != "" {
			prev, known = refSlots[sl.Owner]
		}
		switch {
		case hs.sealed != "":
			key, err := s.open(hs.sealed, sl.Owner, sl.Address)
			if err != nil {
				if unopened == nil {
					unopened = &config.FieldError{Path: sl.Path, Msg: err.Error()}
				} else {
					others = append(others, sl.Path)
				}
				continue
			}
			if isReference(key) {
				// The gateway seals keys only; references stay in clear.
				return fail(&config.FieldError{Path: sl.Path, Msg: msgReference})
			}
			sec := config.NewSecret(key)
			if err := sec.Check(sl.Path); err != nil {
				return fail(err)
			}
			*sl.Secret = sec
		case hs.carried:
			if hs.owner != sl.Owner || hs.address != sl.Address {
				return fail(&config.FieldError{Path: sl.Path, Msg: msgAddressChanged})
			}
			*sl.Secret = config.NewSecret(hs.key)
		case hs.ref != "":
			if !known || prev.Secret.Ref() != hs.ref {
				if cur == nil {
					return fail(&config.FieldError{Path: sl.Path, Msg: msgStoredRef})
				}
				return fail(&config.FieldError{Path: sl.Path, Msg: msgReference})
			}
			if prev.Address != sl.Address {
				return fail(&config.FieldError{Path: sl.Path, Msg: msgAddressChanged})
			}
			*sl.Secret = *prev.Secret
		default:
			if !known || prev.Secret.Ref() != "" || !prev.Secret.IsSet() || s.fingerprint(prev.Secret.Reveal()) != hs.fp {
				return fail(&config.FieldError{Path: sl.Path, Msg: msgOtherUpstream})
			}
			if prev.Address != sl.Address {
				return fail(&config.FieldError{Path: sl.Path, Msg: msgAddressChanged})
			}
			*sl.Secret = *prev.Secret
		}
	}
	if unopened != nil {
		return fail(nil)
	}
	// A placeholder left anywhere would become an upstream's key.
	_, err := config.EncodeJSON(c, func(path, key string) (string, error) {
		if strings.HasPrefix(key, h.prefix) {
			return "", fmt.Errorf("BUG: secret %s is not among config.AppendSecretSlots", path)
		}
		return "", nil
	})
	return err
}

// decodeDoc decodes a JSON object keeping numbers exact.
func decodeDoc(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, &config.FieldError{Msg: "cannot parse JSON: " + err.Error()}
	}
	if !atEnd(dec) {
		return nil, &config.FieldError{Msg: "unexpected data after the JSON object"}
	}
	if doc == nil {
		return nil, &config.FieldError{Msg: "want a JSON object"}
	}
	return doc, nil
}

// parseDoc is parseConfig of a working document (a write through the
// API, built as a decoded document).
func (s *sealer) parseDoc(doc map[string]any, cur *config.Config) (*config.Config, error) {
	data, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("BUG: cannot re-encode a decoded document: %w", err)
	}
	return s.parseRefs(data, cur, cur)
}

// parseConfig turns a config document (one JSON object, as decodeDoc
// takes it) into a validated Config: sealed, carried and redacted secrets
// are resolved, and config.Parse validates. With cur (a write or an
// import through the API) redacted secrets and references resolve only
// to what cur holds at the same entry and address (see the top of this
// file); without it references are resolved and redacted secrets refused.
// Errors are *config.FieldError with the most precise path known.
func (s *sealer) parseConfig(data []byte, cur *config.Config) (*config.Config, error) {
	if err := checkObject(data); err != nil {
		return nil, err
	}
	return s.parseRefs(data, cur, cur)
}

// parseStored parses a document this gateway stored (Redis, a snapshot)
// as parseConfig does without cur, except that a secret reference is
// taken only where base (the config this replica serves: its file's, or
// one it took before) holds the same reference at the same entry and
// address: whoever can write to Redis or the snapshot directory must not
// make every replica read a host file or variable and send it to an
// address of their choosing.
func (s *sealer) parseStored(data []byte, base *config.Config) (*config.Config, error) {
	if err := checkObject(data); err != nil {
		return nil, err
	}
	if base == nil {
		base = &config.Config{}
	}
	return s.parseRefs(data, nil, base)
}

// checkObject refuses data that decodeDoc refuses, with its error, without
// decoding data that it takes.
func checkObject(data []byte) error {
	if i := jsonscan.SkipSpace(data, 0); i < len(data) && data[i] == '{' && json.Valid(data) {
		return nil
	}
	if _, err := decodeDoc(data); err != nil {
		return err
	}
	panic("BUG: decodeDoc takes what json.Valid refuses")
}

// parseRefs is parseConfig of a JSON object, with refs the config whose
// references a document may keep (nil: any reference is resolved).
//
// The document is decoded once, by config.Parse, into the typed config:
// first the secrets are found where the config's types put them
// (walkSecrets, which skips the sections without any, the users and
// templates among them) and each that stands for another (sealed,
// carried, redacted, a reference) is replaced in a copy of the bytes by a
// placeholder, resolved on the typed config once it is parsed
// (heldSecrets). Walking the document decoded as generic JSON to do this
// made an import of 50,000 users peak at 14 to 19 times its body.
func (s *sealer) parseRefs(data []byte, cur, refs *config.Config) (*config.Config, error) {
	data = validUTF8(data)
	c, err := s.parseRefsOnce(data, cur, refs)
	var fe *config.FieldError
	if err != nil && errors.As(err, &fe) && strings.HasPrefix(fe.Msg, "cannot use number ") {
		// A whole number written as 100.0 or 1e2 (see wholeNumber), or a
		// number no setting of its type takes: once written plain, the
		// document parses, or walkDoc says why not.
		plain, werr := wholeNumbersWritten(data)
		if werr != nil {
			return nil, werr
		}
		return s.parseRefsOnce(plain, cur, refs)
	}
	return c, err
}

// parseRefsOnce is parseRefs of a document in valid UTF-8, as it is.
func (s *sealer) parseRefsOnce(data []byte, cur, refs *config.Config) (*config.Config, error) {
	take := secretTaker{s: s, cur: cur, refs: refs, held: newHeldSecrets()}
	var edits []secretEdit
	err := walkSecrets(data, jsonscan.SkipSpace(data, 0), reflect.TypeFor[config.Config](), "", func(path string, vs, ve int, v string) error {
		nv, err := take.secret(path, v)
		if err == nil && nv != v {
			edits = append(edits, secretEdit{vs: vs, ve: ve, v: nv})
		}
		return err
	})
	if err != nil {
		var fe *config.FieldError
		if !errors.As(err, &fe) {
			err = fmt.Errorf("BUG: cannot walk a valid document: %w", err)
		}
		return nil, err
	}
	data = spliceSecrets(data, edits)
	c, err := config.Parse(data)
	if err != nil {
		// Errors only: the document decoded, for the precise path.
		again, derr := decodeDoc(data)
		if derr != nil {
			return nil, err
		}
		return nil, refineError(again, err)
	}
	if refs != nil {
		// Every reference was replaced by a placeholder above: one that
		// reached config.Parse was read from a host file or variable on
		// behalf of the caller.
		for _, sl := range c.AppendSecretSlots(nil) {
			if sl.Secret.Ref() != "" {
				return nil, fmt.Errorf("BUG: secret %s was not found by walkSecrets", sl.Path)
			}
		}
	}
	if len(take.held.byKey) > 0 {
		if err := take.held.resolve(s, c, cur, refs); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// validUTF8 returns JSON data with each byte that is not valid UTF-8
// replaced by U+FFFD, as encoding/json reads it (such bytes can only be in
// strings, where jsonscan refuses them): data itself when it is valid.
func validUTF8(data []byte) []byte {
	if utf8.Valid(data) {
		return data
	}
	out := make([]byte, 0, len(data)+len(data)/8)
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, data[i:i+n]...)
		}
		i += n
	}
	return out
}

// secretTaker decides what each secret of a document parsed by parseRefs
// stands for.
type secretTaker struct {
	s         *sealer
	cur, refs *config.Config
	held      *heldSecrets
	known     map[string]string // fingerprints of cur's literal keys, once needed
}

// secret returns what config.Parse is to read for the secret v at path:
// v itself (a key in clear), the key an enc:v1: seal holds (stored data),
// or a placeholder for a secret resolved on the parsed config.
func (p *secretTaker) secret(path, v string) (string, error) {
	s, held := p.s, p.held
	if strings.HasPrefix(v, carriedPrefix) {
		owner, address, key, ok := carrier.open(v)
		if !ok {
			return "", &config.FieldError{Path: path, Msg: "is a malformed carried secret: enter the key again"}
		}
		return held.hold(&heldSecret{carried: true, owner: owner, address: address, key: key}), nil
	}
	if strings.HasPrefix(v, sealedPrefix) {
		// Opened by held.resolve, which names every one that does not
		// open (without a key, none does).
		return held.hold(&heldSecret{sealed: v}), nil
	}
	if strings.HasPrefix(v, sealedPrefixV1) {
		clear, err := s.openV1(v)
		if err != nil {
			return "", &config.FieldError{Path: path, Msg: err.Error()}
		}
		if p.cur != nil {
			// Bound to nothing: through the API it stands only for
			// the key the same entry holds at the same address.
			return held.hold(&heldSecret{fp: s.fingerprint(clear)}), nil
		}
		v = clear
	}
	if isReference(v) {
		if p.refs == nil {
			return v, nil
		}
		return held.hold(&heldSecret{ref: v}), nil
	}
	if strings.HasPrefix(v, heldSecretPrefix) {
		// Another parse's placeholder is never a key.
		return "", &config.FieldError{Path: path, Msg: "is an internal placeholder, not a key: enter the key again"}
	}
	fp, ok := isRedacted(v)
	if !ok {
		return v, nil
	}
	if p.known == nil {
		p.known = map[string]string{}
		if p.cur != nil {
			p.known = s.literalSecrets(p.cur)
		}
	}
	if fp == "" {
		return "", &config.FieldError{Path: path, Msg: "is the bare redacted placeholder \"***\": enter the key (or keep the ***xxxxxxxx form the API gave you to keep the current key)"}
	}
	if _, ok := p.known[fp]; !ok {
		return "", &config.FieldError{Path: path, Msg: "is a redacted secret that matches no current key: enter the key again"}
	}
	return held.hold(&heldSecret{fp: fp}), nil
}

// secretEdit replaces the JSON string at [vs, ve) of a document by v.
type secretEdit struct {
	vs, ve int
	v      string
}

// spliceSecrets returns data with edits (in document order) made, in a
// copy; data itself when there are none.
func spliceSecrets(data []byte, edits []secretEdit) []byte {
	if len(edits) == 0 {
		return data
	}
	n := len(data)
	for _, e := range edits {
		n += len(e.v) + 2 - (e.ve - e.vs)
	}
	out := make([]byte, 0, n+16)
	last := 0
	for _, e := range edits {
		out = append(out, data[last:e.vs]...)
		out = jsonscan.AppendString(out, e.v)
		last = e.ve
	}
	return append(out, data[last:]...)
}

// walkLevels bounds the nesting walkSecrets descends: encoding/json's,
// which the documents it walks already passed.
const walkLevels = 10001

// walkSecrets calls f, in document order, with the path, the span and the
// decoded value of every secret in the JSON value at d[i] read as Go type
// t, as encoding/json decodes it into t. It descends only into values
// whose type holds a secret (holdsSecret); there, as walkDoc does, it
// refuses a key that matches no field and a secret that is not a string.
// A value of another shape than t's it leaves to the decoder, which
// decodes nothing from it (nor null). d must be valid JSON.
func walkSecrets(d []byte, i int, t reflect.Type, path string, f func(path string, vs, ve int, v string) error) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if i >= len(d) || !holdsSecret(t) {
		return nil
	}
	if t == secretType {
		switch d[i] {
		case 'n':
			return nil
		case '"':
		default:
			return &config.FieldError{Path: path, Msg: "want a string (the key, env:NAME or file:PATH)"}
		}
		raw, ve, err := jsonscan.ScanString(d, i)
		if err != nil {
			return err
		}
		return f(path, i, ve, string(jsonscan.Key(raw)))
	}
	var err error
	switch t.Kind() {
	case reflect.Struct:
		if d[i] != '{' || reflect.PointerTo(t).Implements(unmarshalerType) && !structLike(t) {
			return nil
		}
		_, err = jsonscan.WalkObject(d, i, walkLevels, func(key []byte, vs, _ int) error {
			ft, ok := config.FieldType(t, string(key))
			if !ok {
				return &config.FieldError{Path: join(path, echoName(string(key))), Msg: "unknown field " + quoteName(string(key))}
			}
			return walkSecrets(d, vs, ft, join(path, string(key)), f)
		})
	case reflect.Map:
		if d[i] != '{' {
			return nil
		}
		_, err = jsonscan.WalkObject(d, i, walkLevels, func(key []byte, vs, _ int) error {
			return walkSecrets(d, vs, t.Elem(), join(path, string(key)), f)
		})
	case reflect.Slice, reflect.Array:
		if d[i] != '[' {
			return nil
		}
		n := 0
		_, err = jsonscan.WalkArray(d, i, walkLevels, func(vs, _ int) error {
			n++
			return walkSecrets(d, vs, t.Elem(), fmt.Sprintf("%s[%d]", path, n-1), f)
		})
	}
	return err
}

// holdsSecret reports whether a value of type t can hold a config.Secret.
func holdsSecret(t reflect.Type) bool {
	if h, ok := secretHolders.Load(t); ok {
		return h.(bool)
	}
	h := holdsSecretSeen(t, map[reflect.Type]bool{})
	secretHolders.Store(t, h)
	return h
}

var secretHolders sync.Map // reflect.Type -> bool

func holdsSecretSeen(t reflect.Type, seen map[reflect.Type]bool) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == secretType {
		return true
	}
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if holdsSecretSeen(t.Field(i).Type, seen) {
				return true
			}
		}
	case reflect.Slice, reflect.Array, reflect.Map:
		return holdsSecretSeen(t.Elem(), seen)
	}
	return false
}

// refineError replaces a decoding error whose path encoding/json could not
// tell precisely (unknown fields name no parent; type errors name no list
// index) by the first misfit a typed walk of the document finds.
func refineError(doc any, err error) error {
	var fe *config.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	if !strings.HasPrefix(fe.Msg, "unknown field") && !strings.HasPrefix(fe.Msg, "cannot use") {
		return err
	}
	if _, werr := walkDoc(doc, reflect.TypeFor[config.Config](), "", nil); werr != nil {
		return werr
	}
	return err
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// walkDoc walks a decoded JSON value along Go type t as encoding/json
// would decode it, calling f (when non-nil) at every Secret and leaf and
// replacing the value with what f returns. It reports the first unknown
// field or JSON type that t cannot hold as a *config.FieldError. It writes
// a whole-number setting given as 100.0 or 1e2 as 100 (wholeNumber), and
// refuses one that is not whole or lies past its type's range.
func walkDoc(v any, t reflect.Type, path string, f func(path string, t reflect.Type, v any) (any, error)) (any, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil { // null leaves a Go value as it was
		return nil, nil
	}
	if t == secretType {
		if _, ok := v.(string); !ok {
			return nil, &config.FieldError{Path: path, Msg: "want a string (the key, env:NAME or file:PATH)"}
		}
		return leaf(f, path, t, v)
	}
	switch t.Kind() {
	case reflect.Struct:
		if reflect.PointerTo(t).Implements(unmarshalerType) && !structLike(t) {
			return leaf(f, path, t, v)
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, typeErr(path, "an object", v)
		}
		for k, fv := range m {
			ft, ok := config.FieldType(t, k)
			if !ok {
				return nil, &config.FieldError{Path: join(path, echoName(k)), Msg: "unknown field " + quoteName(k)}
			}
			nv, err := walkDoc(fv, ft, join(path, k), f)
			if err != nil {
				return nil, err
			}
			m[k] = nv
		}
		return m, nil
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return leaf(f, path, t, v)
		}
		l, ok := v.([]any)
		if !ok {
			return nil, typeErr(path, "a list", v)
		}
		for i, ev := range l {
			nv, err := walkDoc(ev, t.Elem(), fmt.Sprintf("%s[%d]", path, i), f)
			if err != nil {
				return nil, err
			}
			l[i] = nv
		}
		return l, nil
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, typeErr(path, "an object", v)
		}
		for k, ev := range m {
			nv, err := walkDoc(ev, t.Elem(), join(path, k), f)
			if err != nil {
				return nil, err
			}
			m[k] = nv
		}
		return m, nil
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return nil, typeErr(path, "true or false", v)
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			return nil, typeErr(path, "a string", v)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := v.(json.Number)
		if !ok {
			return nil, typeErr(path, "a whole number", v)
		}
		w, err := wholeNumber(n, t)
		if err != nil {
			return nil, &config.FieldError{Path: path, Msg: err.Error()}
		}
		v = w
	case reflect.Float32, reflect.Float64:
		if _, ok := v.(json.Number); !ok {
			return nil, typeErr(path, "a number", v)
		}
	}
	return leaf(f, path, t, v)
}

// structLike reports whether a struct with its own UnmarshalJSON still
// decodes as its fields (the config's types that only apply defaults).
func structLike(t reflect.Type) bool {
	return t.NumField() > 0 && t.Field(0).IsExported()
}

func leaf(f func(string, reflect.Type, any) (any, error), path string, t reflect.Type, v any) (any, error) {
	if f == nil {
		return v, nil
	}
	return f(path, t, v)
}

func typeErr(path, want string, v any) error {
	got := "null"
	switch v.(type) {
	case bool:
		got = "a boolean"
	case string:
		got = "a string"
	case json.Number:
		got = "a number"
	case []any:
		got = "a list"
	case map[string]any:
		got = "an object"
	}
	return &config.FieldError{Path: path, Msg: fmt.Sprintf("want %s, got %s", want, got)}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	if k == "" {
		return path
	}
	return path + "." + k
}
