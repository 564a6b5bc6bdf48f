package govern

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/infera/infera/config"
)

// NewKey mints an API key and its stored hash. The key is shown to its
// owner once; only the hash goes into the config (users[].keys).
func NewKey() (key, hash string, err error) {
	var id [config.KeyIDLen / 2]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", "", fmt.Errorf("cannot read random bytes: %w", err)
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", "", fmt.Errorf("cannot read random bytes: %w", err)
	}
	key = config.KeyPrefix + hex.EncodeToString(id[:]) + "_" + base64.RawURLEncoding.EncodeToString(secret[:])
	hash, err = HashKey(key)
	return key, hash, err
}

// HashKey returns a stored hash of key under a fresh random salt:
// ifr1$<key id>$<salt>$<SHA-256(salt || key)>. The key must be in infera's
// format (NewKey); the error never quotes it.
func HashKey(key string) (string, error) {
	id, ok := config.KeyID(key)
	if !ok {
		return "", fmt.Errorf("not an infera API key: want %s<%d hex digits>_<%d base64url characters> as printed by infera key new", config.KeyPrefix, config.KeyIDLen, config.KeySecretLen)
	}
	var salt [config.KeySaltBytes]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return "", fmt.Errorf("cannot read random bytes: %w", err)
	}
	sum := keySum(salt[:], []byte(key))
	return config.KeyHashPrefix + id + "$" + base64.RawURLEncoding.EncodeToString(salt[:]) + "$" + base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// keySum is SHA-256(salt || key), computed without allocating.
func keySum(salt, key []byte) [32]byte {
	var buf [config.KeySaltBytes + config.KeyLen]byte
	if len(salt) != config.KeySaltBytes || len(key) != config.KeyLen {
		panic("BUG: keySum called with a malformed salt or key")
	}
	copy(buf[:], salt)
	copy(buf[config.KeySaltBytes:], key)
	return sha256.Sum256(buf[:])
}

// keyRecord is one stored key of a user.
type keyRecord struct {
	salt []byte
	sum  [32]byte
	user *User
}

// matches compares in constant time (for a key of the right length).
func (k *keyRecord) matches(key []byte) bool {
	sum := keySum(k.salt, key)
	return subtle.ConstantTimeCompare(sum[:], k.sum[:]) == 1
}

// BearerToken returns the token of an "Authorization: Bearer <token>"
// header value (nil when it is not one).
func BearerToken(auth []byte) []byte {
	const p = "bearer "
	if len(auth) < len(p) || !strings.EqualFold(string(auth[:len(p)]), p) {
		return nil
	}
	return auth[len(p):]
}

// KeyCmd is `infera key`: mint API keys and hash them for the config file.
type KeyCmd struct {
	New  KeyNewCmd  `cmd:"" help:"Mint an API key; print it once, with the hash to put in the config's users[].keys."`
	Hash KeyHashCmd `cmd:"" help:"Read an existing infera API key from stdin and print a stored hash of it (a new salt each time)."`
}

// KeyNewCmd is `infera key new`.
type KeyNewCmd struct {
	User string `help:"Print a users[] entry for this user name holding the new key's hash." env:"INFERA_KEY_USER"`
	JSON bool   `name:"json" help:"Print one JSON object {key, hash[, user]} instead of lines." default:"false" env:"INFERA_KEY_JSON"`

	Stdout io.Writer `kong:"-"`
}

// Run executes the command.
func (c *KeyNewCmd) Run() error {
	out := c.Stdout
	if out == nil {
		out = os.Stdout
	}
	if c.User != "" && !config.ValidUserName(c.User) {
		return fmt.Errorf("--user %q: want 1-64 of A-Z a-z 0-9 . _ @ + - starting with a letter or digit", c.User)
	}
	key, hash, err := NewKey()
	if err != nil {
		return err
	}
	var user *config.User
	if c.User != "" {
		user = &config.User{Name: c.User, Keys: []string{hash}, Enabled: true}
	}
	if c.JSON {
		v := struct {
			Key  string       `json:"key"`
			Hash string       `json:"hash"`
			User *config.User `json:"user,omitempty"`
		}{key, hash, user}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	}
	fmt.Fprintf(out, "key:  %s\n", key)
	fmt.Fprintf(out, "hash: %s\n", hash)
	if user != nil {
		b, err := json.Marshal(user)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "user: %s\n", b)
	}
	_, err = fmt.Fprintln(out, "The key is shown only now: give it to its owner. Put the hash in users[].keys.")
	return err
}

// KeyHashCmd is `infera key hash` (the key is read from stdin so that it
// stays out of shell history and process listings).
type KeyHashCmd struct {
	Stdin  io.Reader `kong:"-"`
	Stdout io.Writer `kong:"-"`
}

// Run executes the command.
func (c *KeyHashCmd) Run() error {
	in, out := c.Stdin, c.Stdout
	if in == nil {
		in = os.Stdin
	}
	if out == nil {
		out = os.Stdout
	}
	line, err := bufio.NewReader(io.LimitReader(in, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("cannot read the key from stdin: %w", err)
	}
	h, err := HashKey(strings.TrimSpace(line))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, h)
	return err
}
