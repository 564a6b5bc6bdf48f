// Command infera is a single-binary LLM inference router and gateway.
//
//	infera serve     the router (OpenAI-compatible front door)
//	infera engine    a simulated inference engine
//	infera version   print the version
package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/bench"
	"github.com/infera/infera/engine"
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

var cli struct {
	Serve    serveCmd      `cmd:"" help:"Run the router in front of a fleet of inference engines."`
	Engine   engine.Cmd    `cmd:"" help:"Run a simulated OpenAI-compatible inference engine."`
	Worker   worker.Cmd    `cmd:"" help:"Run the sidecar beside one engine: register, heartbeat, relay KV events, drain."`
	Bench    bench.Cmd     `cmd:"" help:"Benchmarks: replay, compare, simulate, gen, proxy."`
	Tokenize tokenizer.Cmd `cmd:"" help:"Print the token ids of stdin (debugging the router's tokenizer)."`
	Version  versionCmd    `cmd:"" help:"Print the version."`
}

func main() {
	ctx := kong.Parse(&cli,
		kong.Name("infera"),
		kong.Description("High-performance LLM inference router and gateway."),
		kong.UsageOnError(),
	)
	if err := ctx.Run(); err != nil {
		slog.Error("fatal", "err", err)
		os.Exit(1)
	}
}
