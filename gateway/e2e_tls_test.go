package gateway

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// infera serve --tls-cert-file/--tls-key-file: the front door and the admin
// listener speak HTTPS; after the certificate files are replaced (a
// renewal) and SIGHUP, new connections get the new certificate, and a
// broken replacement leaves the good one serving.
func TestE2ETLSFrontDoorAndAdminWithCertificateRenewalOnSIGHUP(t *testing.T) {
	c := testsrv.GenCerts(t)
	dir := t.TempDir()
	cert, key := dir+"/tls.crt", dir+"/tls.key"
	install := func(cf, kf string) { t.Helper(); testsrv.Install(t, cf, kf, cert, key) }
	install(c.ServerCert, c.ServerKey)
	pool := c.Pool(t)
	newClient := func() *http.Client { // a new connection each time
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	}

	_, e1 := startEngine(t, "--speedup", "50")
	// The front door and the admin listener bind ports of their own
	// (--port 0, --admin-port=-1), read from the log.
	r := launchChild(t, "serve", "", "serve-tls.log", []string{"--workers", e1, "--tls-cert-file", cert, "--tls-key-file", key,
		"--api-key", "tls-key", "--host", "127.0.0.1", "--port", "0", "--admin-port=-1"})
	url := "https://" + r.listenAddr(t)
	r.url = url
	waitUntil(t, "the router answers over HTTPS", func() bool {
		resp, err := newClient().Get(url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	serial := func(u string) int64 {
		t.Helper()
		req, _ := http.NewRequest("POST", u, strings.NewReader(chatJSON("sim-model", "hi", 2, false)))
		req.Header.Set("Authorization", "Bearer tls-key")
		resp, err := newClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 && !strings.Contains(u, "/api/") {
			t.Fatalf("%s: %d %s", u, resp.StatusCode, b)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	admin := r.adminAddr(t) + "/api/config"
	if !strings.HasPrefix(admin, "https://127.0.0.1:") {
		t.Fatalf("admin listener at %s", admin)
	}
	if serial(url+"/v1/chat/completions") != 2 || serial(admin) != 2 {
		t.Fatal("not the server certificate")
	}

	renewed, renewedKey := c.ServerLeaf(t, "renewed", 20, time.Now().Add(60*24*time.Hour))
	install(renewed, renewedKey)
	r.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, "the renewed certificate", func() bool { return serial(url+"/v1/chat/completions") == 20 })
	if serial(admin) != 20 {
		t.Fatal("the admin listener kept the old certificate")
	}
	os.WriteFile(key, []byte("broken"), 0o600)
	r.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, "the refused reload logged", func() bool { return strings.Contains(r.logText(), "TLS certificate not reloaded") })
	if serial(url+"/v1/chat/completions") != 20 {
		t.Fatal("a broken key file replaced the serving certificate")
	}
	if strings.Contains(r.logText(), "broken") {
		t.Fatal("the log shows the key file's content")
	}
}
