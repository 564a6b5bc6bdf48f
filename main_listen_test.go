package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runChild runs `infera args...` as a child (TestMain) and returns its
// output once it exits, failing if it is still up after 20 s.
func runChild(t *testing.T, args ...string) string {
	t.Helper()
	js, _ := json.Marshal(args)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "INFERA_MAIN_CHILD_ARGS="+string(js))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%v: still running after 20 s:\n%s", args, out)
	}
	if err == nil {
		t.Fatalf("%v: exited 0, want a start error:\n%s", args, out)
	}
	return string(out)
}

// A listener that cannot open says which it is: with --admin-port equal
// to --port the admin listener (opened first) took the port and the front
// door failed with "cannot listen on 127.0.0.1:P", naming neither.
func TestAListenerThatCannotOpenSaysWhichItIs(t *testing.T) {
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	held := strconv.Itoa(hold.Addr().(*net.TCPAddr).Port)
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	base := []string{"serve", "--host", "127.0.0.1", "--workers", "a=http://127.0.0.1:1", "--worker-model", "m", "--admin-key", "admin-key-0123456789"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"the admin port is the front's", []string{"--port", port, "--admin-port", port},
			[]string{"cannot listen on 127.0.0.1:" + port + " for the API (--host, --port)", "the admin listener, --admin-port, holds that port"}},
		{"the front port is taken", []string{"--port", held, "--admin-port", "0"},
			[]string{"cannot listen on 127.0.0.1:" + held + " for the API (--host, --port)"}},
		{"the admin port is taken", []string{"--port", port, "--admin-port", held},
			[]string{"for the admin API and console (--admin-host, --admin-port)"}},
	} {
		out := runChild(t, append(append([]string{}, base...), tc.args...)...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: the start error does not say %q:\n%s", tc.name, w, out)
			}
		}
	}
}
