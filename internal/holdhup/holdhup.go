// Package holdhup keeps SIGHUP from ending `infera serve` while it starts.
//
// SIGHUP's default action ends a process, and the router handles it (a
// config reload, log rotation) only once it serves. A SIGHUP sent while it
// starts (a logrotate or `systemctl reload` racing a restart) killed it.
// Imported first by main, this package's init registers a channel nobody
// reads for SIGHUP as early as a Go program can: before the other
// packages' initialization (large: the etcd and gRPC clients, protobuf
// registries) and the flag parsing. signal.Notify drops what it cannot
// deliver, and the handlers registered later get every signal. Only for
// `serve`: the other commands keep SIGHUP's default.
package holdhup

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		Hold()
	}
}

// Hold makes SIGHUP's default action go away for good (once per process):
// a channel nobody reads but Pending stays registered. gateway.New calls
// it too, for a program that embeds the router.
var Hold = sync.OnceFunc(func() {
	signal.Notify(held, syscall.SIGHUP)
})

// held keeps one SIGHUP that arrived while nobody handled it.
var held = make(chan os.Signal, 1)

// Pending reports whether a SIGHUP arrived since Hold that no handler
// took, and forgets it: the server's handler, once registered, acts on it
// (a config edit signalled while the router started, after it last read
// the file, was lost).
func Pending() bool {
	select {
	case <-held:
		return true
	default:
		return false
	}
}
