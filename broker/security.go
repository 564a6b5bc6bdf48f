package broker

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Security is how a process proves itself to the NATS broker and checks
// the broker, besides the credentials a --nats-url may carry (a token, or
// user:password). The router and the worker sidecars take the same flags.
type Security struct {
	// CredsFile (--nats-creds-file) is a .creds file: a user JWT and its
	// NKey seed, for a broker run in operator (JWT) mode.
	CredsFile string
	// NkeySeedFile (--nats-nkey-seed-file) holds a user NKey seed (SU...)
	// whose public key the broker lists.
	NkeySeedFile string
	// CAFile (--nats-tls-ca-file) verifies the broker's certificate instead
	// of the system's CAs.
	CAFile string
	// CertFile and KeyFile (--nats-tls-cert-file, --nats-tls-key-file) are
	// the client certificate of mutual TLS.
	CertFile, KeyFile string
}

// Options checks s's files and returns nats.go's options for them (none
// when s is empty). Each file is read once here, so a missing, unreadable
// or malformed one refuses the start with an error naming its flag and its
// path, never its content. Any TLS file requires TLS of the broker, as a
// tls:// URL does. nats.go reads the files again at every connection: a
// renewed .creds file, certificate or CA is used from the next
// (re)connection on.
//
// natsURL is --nats-url: credentials in it exclude an NKey or a .creds
// file (nats.go ignores the NKey seed of a URL with a user, and sends a
// token or password along with a JWT).
func (s Security) Options(natsURL string) ([]nats.Option, error) {
	var opts []nats.Option
	if s.CredsFile != "" && s.NkeySeedFile != "" {
		return nil, errors.New("--nats-creds-file and --nats-nkey-seed-file exclude each other (a .creds file holds its own NKey seed)")
	}
	if (s.CredsFile != "" || s.NkeySeedFile != "") && urlHasUser(natsURL) {
		return nil, errors.New("--nats-url carries credentials (user or token) and --nats-creds-file or --nats-nkey-seed-file is set: use one way to authenticate")
	}
	if s.CredsFile != "" {
		if err := checkCredsFile(s.CredsFile); err != nil {
			return nil, fmt.Errorf("--nats-creds-file %q: %w", s.CredsFile, err)
		}
		opts = append(opts, nats.UserCredentials(s.CredsFile))
	}
	if s.NkeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(s.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey-seed-file %q: %w", s.NkeySeedFile, err)
		}
		opts = append(opts, o)
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return nil, errors.New("--nats-tls-cert-file and --nats-tls-key-file go together")
	}
	// nats.go's own options load the files when applied; apply them here
	// to refuse the start on a bad one (nats.Connect would fail the same
	// way, and the worker retries a failed connect for ever).
	var probe nats.Options
	if s.CAFile != "" {
		o := nats.RootCAs(s.CAFile)
		if err := o(&probe); err != nil {
			return nil, fmt.Errorf("--nats-tls-ca-file %q: %w", s.CAFile, err)
		}
		opts = append(opts, o)
	}
	if s.CertFile != "" {
		o := nats.ClientCert(s.CertFile, s.KeyFile)
		if err := o(&probe); err != nil {
			return nil, fmt.Errorf("--nats-tls-cert-file %q, --nats-tls-key-file %q: %w", s.CertFile, s.KeyFile, err)
		}
		if err := checkNotExpired(s.CertFile); err != nil {
			return nil, fmt.Errorf("--nats-tls-cert-file %q: %w", s.CertFile, err)
		}
		opts = append(opts, o)
	}
	return opts, nil
}

// urlHasUser reports whether a URL of the comma-separated list natsURL
// carries a user (a token, or user:password), read as nats.go reads it.
func urlHasUser(natsURL string) bool {
	for _, p := range strings.Split(natsURL, ",") {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		if u, err := url.Parse(p); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

// checkCredsFile reads a .creds file as nats.go will: a decorated user JWT
// then a decorated user NKey seed. A file without the decorations was sent
// whole as the JWT (nkeys.ParseDecoratedJWT returns the content as it is),
// seed included, and the broker refused it with no word on why.
func checkCredsFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer wipe(b)
	jwt, err := nkeys.ParseDecoratedJWT(b)
	if err != nil || jwt == string(b) {
		return errors.New("no decorated user JWT (-----BEGIN NATS USER JWT-----) found: not a .creds file")
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("no user NKey seed: %w", err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	var claims struct {
		Sub  string `json:"sub"`
		Exp  int64  `json:"exp"`
		NATS struct {
			Type string `json:"type"`
		} `json:"nats"`
	}
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return errors.New("the user JWT is not a JWT (header.claims.signature)")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return errors.New("the user JWT's claims are not base64url")
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		return errors.New("the user JWT's claims are not JSON")
	}
	if claims.NATS.Type != "user" {
		return fmt.Errorf("the JWT is a %q JWT, not a user JWT", claims.NATS.Type)
	}
	if claims.Sub != pub {
		return fmt.Errorf("the user JWT is for %s, the NKey seed is %s's: they do not go together", claims.Sub, pub)
	}
	if claims.Exp > 0 && time.Unix(claims.Exp, 0).Before(time.Now()) {
		return fmt.Errorf("the user JWT expired at %s", time.Unix(claims.Exp, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// checkNotExpired refuses a client certificate outside its validity: the
// broker would refuse the handshake with only "bad certificate".
func checkNotExpired(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return err
		}
		if now := time.Now(); now.After(c.NotAfter) || now.Before(c.NotBefore) {
			return fmt.Errorf("the client certificate is valid from %s to %s only", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
		}
		return nil // the leaf comes first
	}
}

// wipe overwrites a file's content read into memory (a seed).
func wipe(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}
