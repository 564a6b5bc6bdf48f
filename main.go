// Command infera is a single-binary LLM inference router and gateway.
//
//	infera serve     the router (OpenAI-compatible front door)
//	infera engine    a simulated inference engine
//	infera worker    the sidecar beside an engine
//	infera bench     benchmarks
//	infera classify  the reference classifier of smart model selection
//	infera tokenize  the router's tokenizer on stdin
//	infera key       mint API keys and hash them for users[].keys
//	infera version   print the version
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/bench"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/gateway"
	"github.com/infera/infera/govern"
	_ "github.com/infera/infera/internal/holdhup" // first: SIGHUP during start-up (package doc)
	"github.com/infera/infera/soak"
	"github.com/infera/infera/tokenizer"
	"github.com/infera/infera/worker"
)

var version = "dev"

type versionCmd struct{}

func (versionCmd) Run() error {
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = "dev-" + s.Value[:12]
			}
		}
	}
	fmt.Println("infera", v)
	return nil
}

type serveCmd struct {
	config.Serve
}

func (c *serveCmd) Run() error {
	f := &c.Serve
	setupLogging(f.LogLevel)
	if path := os.Getenv("INFERA_CPU_PROFILE"); path != "" {
		// Profiling aid: a CPU profile of the whole run, written at exit.
		pf, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("INFERA_CPU_PROFILE: %w", err)
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("INFERA_CPU_PROFILE: %w", err)
		}
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
	}
	g, err := gateway.New(f)
	if err != nil {
		return err
	}
	defer g.Close()
	addr := net.JoinHostPort(f.Host, strconv.Itoa(f.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		// Name the listener: the admin one is open by now, and when it
		// took the port the bare address said nothing of it.
		why := ""
		if a := g.Admin().Addr(); a != nil {
			if tcp, ok := a.(*net.TCPAddr); ok && tcp.Port == f.Port {
				why = " (the admin listener, --admin-port, holds that port)"
			}
		}
		return fmt.Errorf("cannot listen on %s for the API (--host, --port)%s: %w", addr, why, err)
	}
	slog.Info("infera serving", "addr", ln.Addr().String(), "workers", g.Workers(),
		"policy", f.RouterPolicy, "mode", f.RouterMode, "discovery", f.DiscoveryBackend,
		"request_transport", f.RequestTransport, "kv_event_transport", f.KVEventTransport, "tls", f.TLSCertFile != "")
	return g.Run(context.Background(), ln)
}

func setupLogging(level string) {
	var l slog.Level
	l.UnmarshalText([]byte(level))
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})))
}

var cli struct {
	Serve    serveCmd      `cmd:"" help:"Run the router in front of a fleet of inference engines."`
	Engine   engine.Cmd    `cmd:"" help:"Run a simulated OpenAI-compatible inference engine."`
	Worker   worker.Cmd    `cmd:"" help:"Run the sidecar beside one engine: register, heartbeat, relay KV events, drain."`
	Bench    bench.Cmd     `cmd:"" help:"Benchmarks: replay, compare, simulate, gen, proxy."`
	Classify classify.Cmd  `cmd:"" help:"Run the reference classifier of smart model selection (prompt length and keywords to L1/L2/L3)."`
	Tokenize tokenizer.Cmd `cmd:"" help:"Print the token ids of stdin (debugging the router's tokenizer)."`
	Soak     soak.Cmd      `cmd:"" help:"Soak and chaos run: mixed load through a real router while engines die, hang and fail, configs reload and NATS restarts."`
	Key      govern.KeyCmd `cmd:"" help:"Mint API keys and hash them for users[].keys."`
	Version  versionCmd    `cmd:"" help:"Print the version."`
}

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// run parses args and runs the command; it returns the exit status.
func run(args []string, stderr io.Writer) int {
	parser, err := kong.New(&cli, append(config.KongOptions(),
		kong.Name("infera"),
		kong.Description("High-performance LLM inference router and gateway."),
		kong.Writers(os.Stdout, stderr),
	)...)
	if err != nil {
		fmt.Fprintln(stderr, "infera:", err)
		return 2
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		// One line, not the whole usage: the flag or variable and why.
		msg := err.Error()
		env := envSource(parser, args, msg)
		if env != "" {
			msg = hideEnvValue(msg, env) + " (from " + env + ")"
		}
		fmt.Fprintf(stderr, "infera: %s (see infera --help)\n", msg)
		return 2
	}
	switch ctx.Command() {
	case "serve", "worker", "engine":
		// A service whose log reader goes away (journald restarted, a
		// `| tee` or log shipper that exits) must keep serving: Go's
		// default kills the process on its next write to fd 1 or 2, and
		// systemd counts death by SIGPIPE as a clean exit, so
		// Restart=on-failure did not bring it back. Ignored, the write
		// fails and the process goes on.
		signal.Ignore(syscall.SIGPIPE)
	}
	if err := ctx.Run(); err != nil {
		slog.Error("fatal", "err", err)
		return 1
	}
	return 0
}

// flagRef finds the flags an error message names.
var flagRef = regexp.MustCompile(`--[a-z0-9][a-z0-9-]*`)

// hideEnvValue removes from kong's message the value environment variable
// env holds (kong writes `got "abc" (from envar INFERA_X="abc")`): it may
// be a key, and the message goes to the journal.
func hideEnvValue(msg, env string) string {
	msg = strings.ReplaceAll(msg, " (from envar "+env+"="+strconv.Quote(os.Getenv(env))+")", "")
	if v := os.Getenv(env); v != "" {
		msg = strings.ReplaceAll(msg, strconv.Quote(v), "a value")
		if len(v) >= 8 {
			// Unquoted too, when it is long enough to be a key and not a
			// number the message's own text holds.
			msg = strings.ReplaceAll(msg, v, "(value not shown)")
		}
	}
	return msg
}

// envSource names the environment variable a flag named in msg took its
// value from, when the command line did not give it ("" otherwise), so the
// message can say " (from INFERA_X)", never the value (it may be a key).
// An operator whose unit reads an environment file saw only a flag they
// never typed.
func envSource(p *kong.Kong, args []string, msg string) string {
	for _, ref := range flagRef.FindAllString(msg, -1) {
		name := ref[2:]
		given := false
		for _, a := range args {
			if a == ref || strings.HasPrefix(a, ref+"=") {
				given = true
			}
		}
		if given {
			continue
		}
		var env string
		kong.Visit(p.Model, func(n kong.Visitable, next kong.Next) error {
			if f, ok := n.(*kong.Flag); ok && f.Name == name {
				for _, e := range f.Envs {
					if _, set := os.LookupEnv(e); set && env == "" {
						env = e
					}
				}
			}
			return next(nil)
		})
		if env != "" {
			return env
		}
	}
	return ""
}
