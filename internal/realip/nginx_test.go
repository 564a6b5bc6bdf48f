package realip

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/freeport"
)

// startNginxRealip runs nginx with the realip module set as docs/security.md
// says infera matches (set_real_ip_from each of trusted, real_ip_header
// X-Forwarded-For, real_ip_recursive on), answering $remote_addr. It
// returns its address; the test stops it.
func startNginxRealip(t *testing.T, trusted ...string) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, err = os.Stat("/usr/sbin/nginx"); err != nil {
			t.Skip("no nginx")
		}
		bin = "/usr/sbin/nginx"
	}
	port, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "logs"), 0o755)
	var from strings.Builder
	for _, p := range trusted {
		fmt.Fprintf(&from, "    set_real_ip_from %s;\n", p)
	}
	// One process (no master): the test's kill stops all of it (a killed
	// master leaves its workers running).
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/logs/error.log warn;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  server {
    listen 127.0.0.1:%[2]d;
%[3]s    real_ip_header X-Forwarded-For;
    real_ip_recursive on;
    location / { return 200 "$remote_addr"; }
  }
}
`, dir, port, from.String())
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", cf, "-e", filepath.Join(dir, "logs", "error.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "logs", "error.log"))
			t.Fatalf("nginx did not start: %s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nginxClient asks nginx for the client address of a request with the
// X-Forwarded-For lines xff (each its own header line).
func nginxClient(t *testing.T, addr string, xff []string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req := "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
	for _, l := range xff {
		req += "X-Forwarded-For: " + l + "\r\n"
	}
	if _, err := c.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b strings.Builder
	_, err = bufio.NewReader(res.Body).WriteTo(&b)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("nginx: %d %v", res.StatusCode, err)
	}
	return b.String()
}

// The client infera finds is the one nginx's realip module finds with
// the same trusted addresses (set_real_ip_from, real_ip_header
// X-Forwarded-For, real_ip_recursive on), header for header, from a
// trusted peer (127.0.0.1) and, with loopback not trusted, from an
// untrusted one. One difference is deliberate: infera also reads a
// bracketed IPv6 address without a port ("[2001:db8::7]", which some
// proxies write), where nginx stops its walk
// (TestTheClientIsTheRightmostUntrustedAddress covers it).
func TestTheClientIsTheOneNginxRealipFinds(t *testing.T) {
	trusted := []string{"127.0.0.1", "10.0.0.0/8", "2001:db8:ffff::/48"}
	cases := [][]string{
		nil,
		{"203.0.113.9"},
		{"198.51.100.1, 203.0.113.9"},
		{"198.51.100.1,203.0.113.9, 10.1.1.1,10.0.0.3"},
		{"198.51.100.1", "203.0.113.9", "10.1.1.1"},
		{"198.51.100.1, 203.0.113.9 ,, ", "10.1.1.1,"},
		{"10.9.9.9, 10.1.1.1"},
		{"[2001:db8::7]:5555, [2001:db8:ffff::1]:443"},
		{"2001:db8::7, 2001:db8:ffff::1"},
		{"2001:db8::7"},
		{"203.0.113.9:1234"},
		{"198.51.100.1, unknown"},
		{"198.51.100.1, unknown, 10.1.1.1"},
		{"198.51.100.1", "_x", "10.1.1.1"},
		{"1.2.3.4, 999.1.1.1, 10.1.1.1"},
		{"1.2.3.4, 10.1.1.1:80"},
		{"::ffff:203.0.113.9"},
	}
	for _, withLoopback := range []bool{true, false} {
		list := trusted
		if !withLoopback {
			list = trusted[1:]
		}
		p := mustParse(t, list...)
		addr := startNginxRealip(t, list...)
		peer := netip.MustParseAddr("127.0.0.1")
		for _, xff := range cases {
			want := nginxClient(t, addr, xff)
			// nginx writes a mapped address as such; infera compares
			// and reports addresses unmapped.
			if got := p.ClientString(peer, xff); got != netip.MustParseAddr(want).Unmap() {
				t.Errorf("trusting %v, X-Forwarded-For %q: infera %s, nginx %s", list, xff, got, want)
			}
		}
	}
}
