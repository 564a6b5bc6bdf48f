package engine

import (
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

	"github.com/infera/infera/tokenizer"
)

// loadTokenizer loads a Hugging Face tokenizer directory (a variable so
// tests can replace it).
var loadTokenizer = func(dir string) (tokenizer.Tokenizer, error) {
	h, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Cmd is `infera engine`: a simulated OpenAI-compatible inference engine.
type Cmd struct {
	Host  string   `help:"Listen address." default:"127.0.0.1" env:"INFERA_ENGINE_HOST"`
	Port  int      `help:"Listen port." default:"8100" env:"INFERA_ENGINE_PORT"`
	ID    string   `name:"id" help:"Engine instance id (X-Infera-Engine-Id); empty means engine-<port>." default:"" env:"INFERA_ENGINE_ID"`
	Model []string `help:"Served model names (repeatable or comma-separated); the first is the default." default:"sim-model" env:"INFERA_ENGINE_MODEL" sep:","`

	BlockSize        int `name:"block-size" help:"KV block size in tokens." default:"16" env:"INFERA_ENGINE_BLOCK_SIZE"`
	KVCapacityBlocks int `name:"kv-capacity-blocks" help:"KV cache capacity in blocks." default:"8192" env:"INFERA_ENGINE_KV_CAPACITY_BLOCKS"`
	MaxBatch         int `name:"max-batch" help:"Maximum concurrently running sequences; more requests queue." default:"64" env:"INFERA_ENGINE_MAX_BATCH"`
	MaxPrefillTokens int `name:"max-prefill-tokens" help:"Uncached prompt tokens admitted per step (0 = no cap)." default:"8192" env:"INFERA_ENGINE_MAX_PREFILL_TOKENS"`

	Speedup          float64       `help:"Divide every simulated duration by this." default:"1" env:"INFERA_ENGINE_SPEEDUP"`
	PrefillBase      time.Duration `name:"prefill-base" help:"Fixed cost of a step that prefills." default:"8ms" env:"INFERA_ENGINE_PREFILL_BASE"`
	PrefillPerToken  time.Duration `name:"prefill-per-token" help:"Prefill cost per uncached prompt token." default:"80us" env:"INFERA_ENGINE_PREFILL_PER_TOKEN"`
	PrefillPerSeq    time.Duration `name:"prefill-per-seq" help:"Prefill cost per sequence prefilled in a step." default:"250us" env:"INFERA_ENGINE_PREFILL_PER_SEQ"`
	DecodeBase       time.Duration `name:"decode-base" help:"Fixed cost of a decode step." default:"12ms" env:"INFERA_ENGINE_DECODE_BASE"`
	DecodePerSeq     time.Duration `name:"decode-per-seq" help:"Decode step cost per running sequence." default:"150us" env:"INFERA_ENGINE_DECODE_PER_SEQ"`
	TransferBase     time.Duration `name:"transfer-base" help:"Fixed latency of one prefill-to-decode KV transfer." default:"1ms" env:"INFERA_ENGINE_TRANSFER_BASE"`
	TransferPerBlock time.Duration `name:"transfer-per-block" help:"Prefill-to-decode KV transfer time per block." default:"40us" env:"INFERA_ENGINE_TRANSFER_PER_BLOCK"`

	Role                  string        `help:"Disaggregation role: mixed serves whole requests; prefill computes prompts and hands their KV to decode engines; decode receives the KV and generates." default:"mixed" enum:"mixed,prefill,decode" env:"INFERA_ENGINE_ROLE"`
	PDMode                string        `name:"pd-mode" help:"KV connector of --role prefill|decode: sglang (Mooncake push: bootstrap_host/port/room) or vllm (NixlConnector pull: kv_transfer_params)." default:"" env:"INFERA_ENGINE_PD_MODE"`
	BootstrapPort         int           `name:"bootstrap-port" help:"Prefill engine's KV server port: SGLang's bootstrap server or vLLM's NIXL side channel; -1 means 8998 (sglang) or 5600 (vllm), 0 an ephemeral port. An SGLang decode engine contacts this port when a request's bootstrap_port is null." default:"-1" env:"INFERA_ENGINE_BOOTSTRAP_PORT"`
	BootstrapHost         string        `name:"bootstrap-host" help:"Host decode engines reach the prefill engine's KV server at (vLLM remote_host); empty means --host, or 127.0.0.1 when --host is a wildcard." default:"" env:"INFERA_ENGINE_BOOTSTRAP_HOST"`
	PDWaitingTimeout      time.Duration `name:"pd-waiting-timeout" help:"Decode engine: longest wait for a request's KV transfer (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)." default:"300s" env:"INFERA_ENGINE_PD_WAITING_TIMEOUT"`
	PDBootstrapTimeout    time.Duration `name:"pd-bootstrap-timeout" help:"SGLang prefill engine: longest wait for the decode engine of a bootstrap_room to connect (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)." default:"300s" env:"INFERA_ENGINE_PD_BOOTSTRAP_TIMEOUT"`
	PDAbortRequestTimeout time.Duration `name:"pd-abort-request-timeout" help:"vLLM prefill engine: how long a finished prefill keeps its blocks for the decode engine's read (VLLM_NIXL_ABORT_REQUEST_TIMEOUT)." default:"480s" env:"INFERA_ENGINE_PD_ABORT_REQUEST_TIMEOUT"`

	Reasoning       bool `help:"Chat requests that ask to reason (chat_template_kwargs.enable_thinking given and not the boolean false, as Qwen3's template tests it, or else a reasoning_effort other than none/minimal) get half their tokens as reasoning_content, as vLLM's reasoning parser streams them." default:"false" env:"INFERA_ENGINE_REASONING"`
	ToolCalls       bool `name:"tool-calls" help:"Chat requests that offer tools (tool_choice not none, last message not a tool result) are answered with a call of the chosen or first tool, arguments made from its JSON schema, finish_reason tool_calls." default:"false" env:"INFERA_ENGINE_TOOL_CALLS"`
	NativeProtocols bool `name:"native-protocols" help:"Also serve POST /v1/messages, /v1/messages/count_tokens (Anthropic) and /v1/responses (OpenAI Responses), converted in-engine to chat as vLLM serves them (for a router's passthrough modes)." default:"false" env:"INFERA_ENGINE_NATIVE_PROTOCOLS"`

	DefaultMaxTokens int    `name:"default-max-tokens" help:"Tokens generated when a request sets no max_tokens." default:"256" env:"INFERA_ENGINE_DEFAULT_MAX_TOKENS"`
	Tokenizer        string `help:"Hugging Face tokenizer directory; empty uses the built-in Simple tokenizer." default:"" env:"INFERA_ENGINE_TOKENIZER"`
	// DefaultChatTemplateKwargs is vLLM's flag of the same name.
	DefaultChatTemplateKwargs string `name:"default-chat-template-kwargs" help:"Default chat_template_kwargs (a JSON object), merged under each request's as vLLM's flag of the same name merges them, e.g. {\"enable_thinking\": false}. Needs --tokenizer." default:"" env:"INFERA_ENGINE_DEFAULT_CHAT_TEMPLATE_KWARGS"`

	KVEventsEndpoint string `name:"kv-events-endpoint" help:"ZMQ PUB bind address for KV cache events, e.g. tcp://*:5557; empty disables." default:"" env:"INFERA_ENGINE_KV_EVENTS_ENDPOINT"`
	KVReplayEndpoint string `name:"kv-replay-endpoint" help:"ZMQ ROUTER bind address for KV event replay; empty disables." default:"" env:"INFERA_ENGINE_KV_REPLAY_ENDPOINT"`
	KVEventsLayout   string `name:"kv-events-layout" help:"KV event wire layout." enum:"legacy,map" default:"legacy" env:"INFERA_ENGINE_KV_EVENTS_LAYOUT"`
	KVEventsTopic    string `name:"kv-events-topic" help:"KV event topic prefix." default:"" env:"INFERA_ENGINE_KV_EVENTS_TOPIC"`

	Fault            string  `help:"Injected fault at start." enum:"none,error,hang,close-mid-stream,slow,health-fail" default:"none" env:"INFERA_ENGINE_FAULT"`
	FaultStatus      int     `name:"fault-status" help:"HTTP status of --fault=error." default:"500" env:"INFERA_ENGINE_FAULT_STATUS"`
	FaultAfterTokens int     `name:"fault-after-tokens" help:"Tokens sent before --fault=close-mid-stream closes the connection." default:"1" env:"INFERA_ENGINE_FAULT_AFTER_TOKENS"`
	FaultFactor      float64 `name:"fault-factor" help:"Step time multiplier of --fault=slow." default:"2" env:"INFERA_ENGINE_FAULT_FACTOR"`
	FaultRate        float64 `name:"fault-rate" help:"Fraction (0,1] of requests hit by per-request faults (0 means 1)." default:"1" env:"INFERA_ENGINE_FAULT_RATE"`
	FaultSeed        uint64  `name:"fault-seed" help:"Seed of the --fault-rate choice." default:"1" env:"INFERA_ENGINE_FAULT_SEED"`
}

// Config turns the flags into a server configuration, loading the tokenizer,
// starting the KV event publisher and opening a prefill engine's KV server
// listener when configured. The caller owns cfg.Sink and cfg.PD.Listener
// (Server.Close closes them).
func (c *Cmd) Config() (Config, error) {
	var models []string
	for _, m := range c.Model {
		for _, p := range strings.Split(m, ",") {
			if p = strings.TrimSpace(p); p != "" {
				models = append(models, p)
			}
		}
	}
	id := c.ID
	if id == "" {
		id = "engine-" + strconv.Itoa(c.Port)
	}
	tm := TimeModel{
		PrefillBase: c.PrefillBase, PrefillPerToken: c.PrefillPerToken, PrefillPerSeq: c.PrefillPerSeq,
		DecodeBase: c.DecodeBase, DecodePerSeq: c.DecodePerSeq, Speedup: c.Speedup,
		TransferBase: c.TransferBase, TransferPerBlock: c.TransferPerBlock,
	}
	if !(c.Speedup > 0) {
		return Config{}, fmt.Errorf("--speedup must be positive, got %v", c.Speedup)
	}
	fault, err := Fault{Mode: c.Fault, Status: c.FaultStatus, AfterTokens: c.FaultAfterTokens,
		Factor: c.FaultFactor, Rate: c.FaultRate, Seed: c.FaultSeed}.normalize()
	if err != nil {
		return Config{}, fmt.Errorf("invalid --fault flags: %w", err)
	}
	cfg := Config{
		ID:     id,
		Models: models,
		Core: CoreConfig{
			BlockSize: c.BlockSize, CapacityBlocks: c.KVCapacityBlocks,
			MaxBatch: c.MaxBatch, MaxPrefillTokens: c.MaxPrefillTokens, Time: tm,
		},
		DefaultMaxTokens: c.DefaultMaxTokens,
		Fault:            fault,
		Reasoning:        c.Reasoning,
		ToolCalls:        c.ToolCalls,
		NativeProtocols:  c.NativeProtocols,
	}
	role, err := ParseRole(c.Role)
	if err != nil {
		return Config{}, fmt.Errorf("invalid --role: %w", err)
	}
	mode, err := ParsePDMode(c.PDMode)
	if err != nil {
		return Config{}, fmt.Errorf("invalid --pd-mode: %w", err)
	}
	switch {
	case role == RoleMixed && mode != PDNone:
		return Config{}, fmt.Errorf("--pd-mode %s needs --role prefill or decode", mode)
	case role != RoleMixed && mode == PDNone:
		return Config{}, fmt.Errorf("--role %s needs --pd-mode sglang or vllm", role)
	case c.BootstrapPort < -1 || c.BootstrapPort > 65535:
		return Config{}, fmt.Errorf("--bootstrap-port must be -1 (the mode's default), 0 (ephemeral) or a port, got %d", c.BootstrapPort)
	case c.PDWaitingTimeout <= 0 || c.PDBootstrapTimeout <= 0 || c.PDAbortRequestTimeout <= 0:
		return Config{}, fmt.Errorf("--pd-waiting-timeout, --pd-bootstrap-timeout and --pd-abort-request-timeout must be positive")
	}
	cfg.PD = PDConfig{Role: role, Mode: mode, AdvertiseHost: c.BootstrapHost, WaitingTimeout: c.PDWaitingTimeout,
		BootstrapTimeout: c.PDBootstrapTimeout, AbortRequestTimeout: c.PDAbortRequestTimeout}
	if role == RoleDecode && mode == PDSGLang {
		cfg.PD.NullBootstrapPort = kvServerPort(c.BootstrapPort, mode) // 0 (ephemeral) keeps the default
	}
	if c.Tokenizer != "" {
		tok, err := loadTokenizer(c.Tokenizer)
		if err != nil {
			return Config{}, fmt.Errorf("cannot load tokenizer from %q: %w", c.Tokenizer, err)
		}
		if d, ok := tok.(interface{ SetDefaultKwargs([]byte) error }); ok {
			if err := d.SetDefaultKwargs([]byte(c.DefaultChatTemplateKwargs)); err != nil {
				return Config{}, fmt.Errorf("--default-chat-template-kwargs: %w", err)
			}
		} else if c.DefaultChatTemplateKwargs != "" {
			return Config{}, errors.New("--default-chat-template-kwargs needs a tokenizer with a chat template (--tokenizer)")
		}
		cfg.Tokenizer = tok
	} else if c.DefaultChatTemplateKwargs != "" {
		return Config{}, errors.New("--default-chat-template-kwargs needs --tokenizer: the built-in tokenizer has no chat template")
	}
	if role == RolePrefill {
		addr := net.JoinHostPort(c.Host, strconv.Itoa(kvServerPort(c.BootstrapPort, mode)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return Config{}, fmt.Errorf("cannot listen for the KV server (--bootstrap-port) on %s: %w", addr, err)
		}
		cfg.PD.Listener = ln
	}
	if c.KVEventsEndpoint != "" {
		sink, err := NewKVEventSink(KVEventsOptions{
			Endpoint: c.KVEventsEndpoint, ReplayEndpoint: c.KVReplayEndpoint,
			Layout: EventLayout(c.KVEventsLayout), Topic: c.KVEventsTopic,
		})
		if err != nil {
			cfg.closeResources()
			return Config{}, fmt.Errorf("cannot start KV event publisher: %w", err)
		}
		cfg.Sink = sink
	}
	return cfg, nil
}

// closeResources closes what Cmd.Config opened, for when no Server took
// ownership of it.
func (cfg *Config) closeResources() {
	if cfg.Sink != nil {
		_ = cfg.Sink.Close()
	}
	if cfg.PD.Listener != nil {
		_ = cfg.PD.Listener.Close()
	}
}

// Run starts the engine and serves until SIGINT or SIGTERM.
func (c *Cmd) Run() error {
	cfg, err := c.Config()
	if err != nil {
		return err
	}
	srv, err := NewServer(cfg)
	if err != nil {
		cfg.closeResources()
		return fmt.Errorf("cannot start engine: %w", err)
	}
	addr := net.JoinHostPort(c.Host, strconv.Itoa(c.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	slog.Info("infera engine listening", "addr", ln.Addr().String(), "id", cfg.ID, "models", cfg.Models,
		"speedup", c.Speedup, "max_batch", c.MaxBatch, "kv_blocks", c.KVCapacityBlocks, "fault", cfg.Fault.Mode,
		"role", cfg.PD.Role.String(), "pd_mode", cfg.PD.Mode.String())
	if b := srv.BootstrapInfo(); b != nil {
		slog.Info("infera engine KV server listening; register this worker with these flags",
			"addr", cfg.PD.Listener.Addr().String(), "worker_flags", "--role prefill --bootstrap '"+string(b)+"'")
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case err = <-errc:
		_ = srv.Close()
		return err
	case s := <-sig:
		slog.Info("infera engine stopping", "signal", s.String())
	}
	return srv.Close()
}

// kvServerPort resolves --bootstrap-port: -1 is the real engine's default
// (SGLang's bootstrap server 8998, vLLM's NIXL side channel 5600).
func kvServerPort(flag int, mode PDMode) int {
	if flag != -1 {
		return flag
	}
	if mode == PDVLLM {
		return DefaultNixlSideChannelPort
	}
	return DefaultSGLangBootstrapPort
}
