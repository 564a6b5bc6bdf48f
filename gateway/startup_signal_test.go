package gateway

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A SIGHUP that arrives while the router is still starting (here: waiting
// up to 10 s for an unreachable etcd's first sync) does not end it: SIGHUP's
// default action ends a process, and nothing handled it before the config
// watcher and Run were up. A config reloader, a log rotator or an operator
// sending it during a slow start killed the router.
func TestSIGHUPDuringStartupDoesNotKillTheRouter(t *testing.T) {
	port := freePort(t)
	c := launchChild(t, "serve", "http://127.0.0.1:"+strconv.Itoa(port), "serve.log", []string{
		"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--admin-port", "0",
		"--discovery-backend", "etcd", "--etcd-endpoint", "127.0.0.1:" + strconv.Itoa(freePort(t)), "--request-transport", "http", "--kv-event-transport", "zmq",
	})
	// Wait until the child is inside New (its first log lines), then HUP it.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.logText(), "level=") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(c.logText(), "infera serving") {
		t.Skip("the router started before the signal could be sent")
	}
	c.cmd.Process.Signal(syscall.SIGHUP)
	select {
	case <-c.done:
		t.Fatalf("the router died of a SIGHUP during startup: %v", c.cmd.ProcessState)
	case <-time.After(time.Second):
	}
}
