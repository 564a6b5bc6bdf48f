package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/infera/infera/internal/freeport"
	"github.com/valyala/fasthttp"
)

// FreePort returns a currently free loopback TCP port, below the kernel's
// ephemeral range (internal/freeport).
func FreePort() (int, error) { return freeport.Get() }

// Proc is a child process (an engine, a router, nginx) with its log file.
type Proc struct {
	Name string
	URL  string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// StartProc starts bin with args, logging to logDir/name.log. The child gets
// SIGTERM on Stop and SIGKILL if this process dies (Linux).
func StartProc(name, logDir, bin string, args ...string) (*Proc, error) {
	return StartProcEnv(name, logDir, nil, bin, args...)
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// LogTail returns the last n bytes of the process log.
func (p *Proc) LogTail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// Stop sends SIGTERM and waits up to 5 s, then kills.
func (p *Proc) Stop() {
	if p == nil || p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// WaitHTTP polls GET url until it answers 200 (and, when check is not nil,
// check accepts the body) or timeout passes or the process exits.
func WaitHTTP(ctx context.Context, p *Proc, url string, timeout time.Duration, check func([]byte) bool) error {
	return waitHTTPKey(ctx, p, url, "", timeout, check)
}

// waitHTTPKey is WaitHTTP sending "Authorization: Bearer key" (none when
// key is empty), for a router started with --api-key.
func waitHTTPKey(ctx context.Context, p *Proc, url, key string, timeout time.Duration, check func([]byte) bool) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited (%v) before it was ready; log tail:\n%s", p.Name, p.err, p.LogTail(2000))
		}
		status, body, err := getWithKey(url, key, time.Second)
		if err == nil && status == 200 && (check == nil || check(body)) {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = "status " + strconv.Itoa(status) + ": " + string(body)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	name := url
	if p != nil {
		name = p.Name + " (" + url + ")"
		return fmt.Errorf("%s not ready after %v (last: %s); log tail:\n%s", name, timeout, last, p.LogTail(2000))
	}
	return fmt.Errorf("%s not ready after %v (last: %s)", name, timeout, last)
}

// WaitListenAddr waits until the process logs a line with msg and an
// addr attribute (slog's text or default format), and returns that
// address: what a server started with --port 0 bound ("infera serving",
// "infera engine listening"). It fails when the process exits first or
// timeout passes.
func (p *Proc) WaitListenAddr(ctx context.Context, msg string, timeout time.Duration) (string, error) {
	want := []byte(msg)
	deadline := time.Now().Add(timeout)
	for {
		exited := p.Exited() // before the read: a line logged before the exit is seen
		if b, err := os.ReadFile(p.log); err == nil {
			for _, line := range bytes.Split(b, []byte("\n")) {
				if !bytes.Contains(line, want) {
					continue
				}
				if _, a, ok := bytes.Cut(line, []byte(" addr=")); ok {
					a, _, _ = bytes.Cut(a, []byte(" "))
					return string(a), nil
				}
			}
		}
		if exited {
			return "", fmt.Errorf("%s exited (%v) before it logged %q; log tail:\n%s", p.Name, p.err, msg, p.LogTail(2000))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s did not log %q within %v; log tail:\n%s", p.Name, msg, timeout, p.LogTail(2000))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Group stops a set of processes together.
type Group struct {
	mu    sync.Mutex
	procs []*Proc
}

// Add registers p.
func (g *Group) Add(p *Proc) {
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
}

// StopAll stops every process in parallel.
func (g *Group) StopAll() {
	g.mu.Lock()
	ps := g.procs
	g.procs = nil
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop() }()
	}
	wg.Wait()
}

// getWithKey GETs url with "Authorization: Bearer key" (none when key is
// empty) and returns the status and a copy of the body.
func getWithKey(url, key string, timeout time.Duration) (int, []byte, error) {
	if key == "" {
		return fasthttp.GetTimeout(nil, url, timeout)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+key)
	if err := fasthttp.DoTimeout(req, resp, timeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// postJSON POSTs body to url and returns an error unless it answers 2xx.
func postJSON(url string, body []byte) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	if c := resp.StatusCode(); c/100 != 2 {
		return fmt.Errorf("POST %s: status %d: %.200s", url, c, resp.Body())
	}
	return nil
}

// ResolveBin returns the infera binary to spawn: explicit, else this
// executable.
func ResolveBin(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cannot find the infera binary (use --infera-bin): %w", err)
	}
	return exe, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process unless it has ended (and was waited
// for): never to a process that reused its pid, as a kill(2) of Pid could.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// StartProcEnv is StartProc with extra environment variables (KEY=VALUE).
func StartProcEnv(name, logDir string, env []string, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("cannot create log for %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("cannot start %s (%s): %w", name, bin, err)
	}
	p := &Proc{Name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}
