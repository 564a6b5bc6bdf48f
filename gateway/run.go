package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/holdhup"
	"golang.org/x/sys/unix"
)

// Run serves on ln until ctx ends or SIGINT/SIGTERM arrives, then drains:
// new connections are refused, in-flight requests and streams get up to
// --shutdown-timeout to finish.
//
// Under systemd (Type=notify: NOTIFY_SOCKET set) it speaks sd_notify:
// READY=1 once the listener is up and the fleet had its first sync;
// RELOADING=1 with MONOTONIC_USEC, then READY=1, around each SIGHUP reload;
// WATCHDOG=1 every half WatchdogSec while the server is serving; STOPPING=1
// when the drain starts, with EXTEND_TIMEOUT_USEC covering the drain.
func (g *Gateway) Run(ctx context.Context, ln net.Listener) error {
	// Signals first: a SIGHUP that arrives once the server answers must
	// find a handler (its default action ends the process).
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sig)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ln) }()

	notify("READY=1\nSTATUS=serving " + strconv.Itoa(g.Workers()) + " workers")
	var watchdog <-chan time.Time
	if d, err := daemon.SdWatchdogEnabled(false); err == nil && d > 0 {
		t := time.NewTicker(d / 2)
		defer t.Stop()
		watchdog = t.C
	}
	if holdhup.Pending() && !hupQueued(sig) {
		sig <- syscall.SIGHUP // one sent while the router started: act on it now
	}
	// A config applied after a rejected reload (the file fixed and picked
	// up by the poll, or another replica's change), or the file put back
	// as it was (the broken edit reverted, the missing file restored),
	// ends the rejection that STATUS= still shows: systemctl status kept
	// saying "config reload rejected" for as long as no SIGHUP came. The
	// hook runs under the store's lock: it only signals the loop, which
	// sends; while rejected, the file is looked at every second.
	changed := make(chan struct{}, 1)
	g.store.OnChange(func(_, _ *config.Config) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	rejected := false
	var recheck <-chan time.Time
	var recheckT *time.Ticker
	defer func() {
		if recheckT != nil {
			recheckT.Stop()
		}
	}()
	settled := func() {
		if !rejected || !g.store.FileServes() {
			return
		}
		rejected = false
		recheckT.Stop()
		recheckT, recheck = nil, nil
		notify("STATUS=serving")
	}
	for {
		select {
		case err := <-errc:
			if err == nil {
				return nil
			}
			return fmt.Errorf("serve: %w", err)
		case <-watchdog:
			notify("WATCHDOG=1")
		case <-changed:
			settled()
		case <-recheck:
			settled()
		case s := <-sig:
			if s == syscall.SIGHUP {
				g.reloadTLS()                             // a renewed certificate
				if err := g.access.Reopen(); err != nil { // log rotation
					slog.Warn("access log not reopened; writing to the old file", "err", err)
				}
				notify("RELOADING=1\nMONOTONIC_USEC=" + strconv.FormatInt(monotonicUsec(), 10))
				_, err := g.store.ReloadAsked()
				rejected = err != nil
				if rejected {
					if recheckT == nil {
						recheckT = time.NewTicker(time.Second)
						recheck = recheckT.C
					}
					notify("READY=1\nSTATUS=config reload rejected (" + oneLine(err.Error()) + "); previous config serving")
				} else {
					if recheckT != nil {
						recheckT.Stop()
						recheckT, recheck = nil, nil
					}
					notify("READY=1\nSTATUS=serving")
				}
				continue
			}
			slog.Info("shutting down", "signal", s.String(), "drain_timeout", g.drainTimeout().String())
			return g.drain()
		case <-ctx.Done():
			return g.drain()
		}
	}
}

// drainTimeout is --shutdown-timeout, 0 (or less) meaning the default 30 s.
func (g *Gateway) drainTimeout() time.Duration {
	if g.flags.ShutdownTimeout <= 0 {
		return 30 * time.Second
	}
	return g.flags.ShutdownTimeout
}

func (g *Gateway) drain() error {
	timeout := g.drainTimeout()
	// The stop takes up to the drain, the cut after it and a margin:
	// systemd extends the unit's TimeoutStopSec to that if it is shorter
	// (a longer --shutdown-timeout was SIGKILLed mid-drain at 45 s).
	notify("STOPPING=1\nEXTEND_TIMEOUT_USEC=" + strconv.FormatInt((timeout+cutGrace+stopMargin).Microseconds(), 10))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := g.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// The stop was asked for and happens: what is still open is cut,
		// which is not a failure of the stop (a non-zero status would have
		// systemd record the unit as failed). Cut here, not by the exit:
		// each cut request then ends as one whose client left (its engine
		// request cancelled, its access-log line written).
		slog.Warn("shutdown: drain timeout reached; the requests still open are cut",
			"drain_timeout", timeout.String(), "open_connections", g.srv.OpenConnections())
		cctx, ccancel := context.WithTimeout(context.Background(), cutGrace)
		defer ccancel()
		if _, left := g.srv.CutOpen(cctx); left > 0 {
			slog.Warn("shutdown: requests still open after the cut; exiting without their access-log lines",
				"requests", left, "waited", cutGrace.String())
		}
		return nil
	}
	return err
}

// cutGrace bounds the wait, after the drain timeout, for the cut requests
// to end.
const cutGrace = 2 * time.Second

// stopMargin is what the stop may take past the drain and the cut, in the
// EXTEND_TIMEOUT_USEC of STOPPING=1: the admin listener's own shutdown (up
// to 5 s for its requests), the last snapshot (a file on a mount), closing
// discovery and the KV subscribers, and the exit. At 5 s the admin
// listener's wait alone could use it up and systemd SIGKILL the router
// before its last snapshot was written.
const stopMargin = 15 * time.Second

// notify sends an sd_notify message when NOTIFY_SOCKET is set (a no-op
// otherwise).
func notify(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		slog.Warn("sd_notify failed", "err", err)
	}
}

// oneLine is s with its control characters made spaces: an sd_notify
// message is newline-separated assignments, so a reason's own line breaks
// (a config key spelled with one, as the decoder's error names it) would
// send assignments of their own (STOPPING=1, MAINPID=...).
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, as systemd expects in
// MONOTONIC_USEC.
func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Sec*1_000_000 + ts.Nsec/1000
}

// hupQueued reports whether sig already holds a SIGHUP, keeping what it
// holds in order. A SIGHUP that arrived after signal.Notify registered sig
// and before holdhup.Pending was read reached both: the router reloaded
// twice for it, the second time possibly reading a file its writer had
// just truncated (a flaky TestARejectedReloadsStatusEndsWhenTheFixedFileIsLoaded).
// One reload covers every SIGHUP queued before it reads the file.
func hupQueued(sig chan os.Signal) bool {
	found := false
	for n := len(sig); n > 0; n-- {
		s := <-sig
		found = found || s == syscall.SIGHUP
		select {
		case sig <- s:
		default: // full of signals that came meanwhile: s was one of a burst
		}
	}
	return found
}
