package testsrv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
)

// SignJWT makes a NATS JWT (header.claims.signature, ed25519 by the
// issuer's NKey) as nsc does, without github.com/nats-io/jwt, which is
// not a dependency: nats-server checks the issuer's signature.
func SignJWT(t testing.TB, issuer nkeys.KeyPair, sub, name string, nats map[string]any) string {
	t.Helper()
	iss, err := issuer.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{"jti": fmt.Sprintf("J%d", time.Now().UnixNano()), "iat": time.Now().Unix(),
		"iss": iss, "sub": sub, "name": name, "nats": nats}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signed := enc(map[string]string{"typ": "JWT", "alg": "ed25519-nkey"}) + "." + enc(claims)
	sig, err := issuer.Sign([]byte(signed))
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// NATSOperatorConf writes a nats-server config in operator (JWT) mode with
// one account, and a .creds file of a user of that account.
func NATSOperatorConf(t testing.TB) (conf, creds string) {
	t.Helper()
	dir := t.TempDir()
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	acc, _ := nkeys.CreateAccount()
	accPub, _ := acc.PublicKey()
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	userSeed, _ := user.Seed()
	opJWT := SignJWT(t, op, opPub, "op", map[string]any{"type": "operator", "version": 2})
	accJWT := SignJWT(t, op, accPub, "acc", map[string]any{"type": "account", "version": 2,
		"limits": map[string]any{"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1}})
	userJWT := SignJWT(t, acc, userPub, "user", map[string]any{"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1})
	conf = filepath.Join(dir, "nats.conf")
	writeFile(t, conf, fmt.Sprintf("operator: %q\nresolver: MEMORY\nresolver_preload: { %s: %q }\n", opJWT, accPub, accJWT))
	creds = filepath.Join(dir, "user.creds")
	writeFile(t, creds, fmt.Sprintf("-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n\n"+
		"************************* IMPORTANT *************************\nNKEY Seed printed below can be used to sign and prove identity.\n\n"+
		"-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n\n*************************************************************\n", userJWT, userSeed))
	return conf, creds
}

// NATSNkeyConf writes a nats-server config with one NKey user, and its seed.
func NATSNkeyConf(t testing.TB) (conf, seedFile string) {
	t.Helper()
	dir := t.TempDir()
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	conf = filepath.Join(dir, "nats.conf")
	writeFile(t, conf, fmt.Sprintf("authorization { users = [ { nkey: %q } ] }\n", pub))
	seedFile = filepath.Join(dir, "user.nk")
	writeFile(t, seedFile, string(seed)+"\n")
	return conf, seedFile
}

// NATSTLSConf writes a nats-server config that requires TLS with client
// certificates signed by a fresh CA.
func NATSTLSConf(t testing.TB) (conf string, certs Certs) {
	t.Helper()
	certs = GenCerts(t)
	conf = filepath.Join(t.TempDir(), "nats.conf")
	writeFile(t, conf, fmt.Sprintf("tls { cert_file: %q\n key_file: %q\n ca_file: %q\n verify: true\n timeout: 2 }\n",
		certs.ServerCert, certs.ServerKey, certs.CA))
	return conf, certs
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
