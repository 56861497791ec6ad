# Stubborn: build, generate, lint, test.
#
# Tools are pinned here and installed with `go install` into .tools/, so their
# dependencies stay out of go.mod. Only Go is needed on the machine.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
GOCYCLO_VERSION            := v0.6.0

TOOLS := $(CURDIR)/.tools
BIN   := $(TOOLS)/bin
export PATH := $(BIN):$(PATH)

BUF                := $(TOOLS)/buf-$(BUF_VERSION)
PROTOC_GEN_GO      := $(TOOLS)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_GO_GRPC := $(TOOLS)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)
GOCYCLO            := $(TOOLS)/gocyclo-$(GOCYCLO_VERSION)

GO_TEST_FLAGS ?= -race -count=1 -timeout=15m

.PHONY: all
all: generate lint test

.PHONY: demo
demo: ## Run the demo: a server, demo delegates, fake models, four live runs and the web console in one process, until Ctrl-C (a first build takes minutes and prints nothing).
	go run ./cmd/stubborn demo

# One package at a time (-p 1), the docs' blocks (internal/doccheck) last:
# the engine's tests and the cluster tests measure time against leases and
# stores on two cores, and packages run beside each other (the docs' blocks
# build the binary and run servers) made them flake. Each package still
# runs its own tests in parallel.
.PHONY: test
test: checkgenerate lint breaking ## Lint, check gen/ is fresh and the API compatible, run every test with the race detector.
	go test -p 1 $(GO_TEST_FLAGS) $$(go list ./... | grep -v '/internal/doccheck$$')
	go test $(GO_TEST_FLAGS) ./internal/doccheck

# The docs cannot rot: internal/doccheck runs every ```sh block of README.md
# and docs/ (each in a fresh copy of the tree, with ./stubborn built, under
# `set -euo pipefail`, 3 minutes at most) but those marked
# `<!-- not run: REASON -->` on the line before their fence, and checks
# docs/configuration.md against the config parser's keys. `make test` runs
# it with the rest (./..., never -short); this runs it alone, verbosely,
# naming each block and how long it took.
.PHONY: checkdocs
checkdocs: ## Run the docs' shell blocks and check the configuration reference against the parser (make test runs it too).
	go test -count=1 -timeout=30m -v -run '^(TestDocsConventions|TestDocsShellBlocks|TestConfigReference)$$' ./internal/doccheck

# The web console in a real browser (issue 20): internal/consoletest/ drives
# Debian's chromium, headless, with chromedp against an in-process server and
# demo delegates on loopback. Its files have the build tag `browser`, so
# `make test` needs only Go; this target needs chromium (apt-get install
# chromium; .ci/run installs it). Without it the tests fail under CI and
# skip elsewhere. Screenshots go to internal/consoletest/testdata/artifacts/;
# STUBBORN_UPDATE_SCREENSHOTS=1 also rewrites docs/console-run.png, and
# STUBBORN_PERF_OUT=FILE collects the PERF figures (docs/PERFORMANCE.md).
BROWSER_TEST_FLAGS ?= -race -count=1 -timeout=10m

.PHONY: testbrowser
testbrowser: ## The web console in headless chromium (chromedp; needs Debian's chromium).
	go vet -tags browser ./internal/consoletest/...
	go test -tags browser $(BROWSER_TEST_FLAGS) ./internal/consoletest/...

# Fuzz targets, as package:FuzzName[:count]. `go test` runs their seed
# corpora (the f.Add seeds and testdata/fuzz/) like any test; `make fuzz`
# mutates each for FUZZTIME, or for the target's own count when it has one
# and FUZZTIME was not set on the command line or in the environment. A
# failing input is written to the package's testdata/fuzz/FuzzName/: commit
# it, and it is a regression test.
#
# The default is a count of inputs, not a duration: with a duration, Go 1.26's
# fuzz coordinator can fail a target with a bare "context deadline exceeded"
# when the time runs out while a worker is busy (golang/go#75804, fixed in Go
# 1.27), which a loaded CI machine hits. A count has no deadline to race.
# FUZZTIME=30s still works for a longer local session.
#
# FuzzAPI runs 3000 inputs, not 10000: each is a few calls to a real server
# on embedded JetStream, and that server's background work (runs still
# going, NATS) makes inputs look like new coverage, which the fuzzer then
# spends up to a minute minimizing. 10000 inputs took 1.4 and 3.3 minutes
# in two runs on two busy cores; 3000 took 18 to 41 s.
FUZZTIME ?= 10000x
FUZZ_TARGETS := \
	./internal/server:FuzzValidateRunRequest \
	./internal/server:FuzzAPI:3000x \
	./internal/server:FuzzDoorParse \
	./internal/conversation:FuzzChatRequest \
	./internal/conversation:FuzzMessagesRequest \
	./internal/conversation:FuzzResponsesRequest \
	./internal/delegates:FuzzParse \
	./internal/controls:FuzzCompileExpr \
	./internal/controls:FuzzJudgeAnswer \
	./internal/controls:FuzzJournalReplay

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10000 inputs, or the target's own count).
	for t in $(FUZZ_TARGETS); do \
		IFS=: read -r pkg name count <<< "$$t"; \
		fuzztime=$(FUZZTIME); \
		if [ "$(origin FUZZTIME)" = file ] && [ -n "$$count" ]; then fuzztime=$$count; fi; \
		echo "fuzz: $$name in $$pkg for $$fuzztime"; \
		go test -run '^$$' -fuzz "^$$name\$$" -fuzztime "$$fuzztime" "$$pkg"; \
	done

.PHONY: generate
generate: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Regenerate gen/ from proto/.
	buf generate

.PHONY: checkgenerate
checkgenerate: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Fail if gen/ differs from what proto/ generates.
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	buf generate -o "$$tmp"; \
	if ! diff -r gen "$$tmp/gen"; then echo 'gen/ is stale: run make generate' >&2; exit 1; fi

# The control algorithms, the engine and its stores stay readable: no
# function in internal/controls/ or internal/runs/ (the engine, its store
# contract and its stores) over a cyclomatic complexity of 20 (gocyclo),
# tests aside.
.PHONY: lint
lint: $(BUF) $(GOCYCLO) ## go vet, gofmt, gocyclo on internal/controls/ and internal/runs/, buf lint, buf format.
	go vet ./...
	@out=$$(find . -name '*.go' -not -path './gen/*' -not -path './.tools/*' -not -path './clients/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	gocyclo -over 20 -ignore '_test\.go$$' internal/controls/ internal/runs/
	buf lint
	buf format -d --exit-code

# The API clients rely on: a buf image (a FileDescriptorSet, with the
# imports and the comments) of proto/ at the last release (first taken from
# b8318ca, the API before the typed reasons), which `make breaking` compares
# proto/ with under buf.yaml's `breaking:` rules (FILE: no field,
# value, message, enum, RPC or file removed, renumbered, renamed or retyped;
# no package or option changed). It is not a .proto file, so buf lint,
# buf format, buf generate and protoc never read it.
#
# Move it on purpose, and only at a release, after the whole change log of
# the API has been read: `make baseline` writes the API of proto/ as it is
# now, to be committed with the release. Never move it to make `make
# breaking` pass: a change it reports breaks the clients already generated
# from the released API (a field dropped, renumbered or retyped reads their
# data wrong). Add instead: a new field, a new value, a new message.
API_BASELINE := proto/baseline/stubborn-v1.binpb

.PHONY: breaking
breaking: $(BUF) ## Fail if proto/ breaks the API of the last release (API_BASELINE).
	buf breaking --against $(API_BASELINE)

.PHONY: baseline
baseline: $(BUF) ## At a release only: make proto/ as it is now the API `make breaking` guards.
	buf build -o $(API_BASELINE)

.PHONY: bench
bench: ## Load harness: Stubborn beside a direct call and a plain gRPC proxy.
	go run ./bench $(BENCH_FLAGS)
	go test -run '^$$' -bench . -benchmem ./internal/controls/... ./internal/runs/...

# Temporal as a peer (issue 21, item 4): bench/temporal is a Go module of its
# own, so the main module, `make test` and CI never build Temporal (its first
# build takes about 10 minutes on two busy cores). This vets it and runs its
# smoke test: delegates, the embedded dev server and a worker as child
# processes, then a 2 s load of each scenario. bench/temporal/README.md.
.PHONY: benchtemporal
benchtemporal: ## Temporal as a peer (bench/temporal, its own module; first build ~10 min): vet and smoke test.
	cd bench/temporal && go vet ./... && go test -count=1 -v ./...

.PHONY: build
build:
	go build -o bin/stubborn ./cmd/stubborn

# Generated clients (clients/): Python with Debian 12's protoc 3.21 and gRPC
# Python plugin (protobuf-compiler, protobuf-compiler-grpc), TypeScript with
# the protoc-gen-es pinned in clients/typescript/package-lock.json, through
# buf.gen.clients.yaml. They need more than Go: clients/install-deps.sh
# installs it, and .ci/run calls it, then `make testclients`.
#
# Python's generated code lives in PY_GENERATED, under clients/python:
# stubborn/v1 from proto/, and stubborn/_vendor from the google.rpc and
# grpc.health.v1 protos vendored in clients/python/third_party (the delegate
# kit's error details and health; see its README). `make clients` deletes and
# rewrites only those: the rest of clients/python (stubborn/__init__.py, the
# kit stubborn/delegate.py, pyproject.toml, tests, examples) is hand-written.
PROTOC_VERSION     := 3.21
GRPC_PYTHON_PLUGIN ?= /usr/bin/grpc_python_plugin
PROTOC_GEN_ES      := clients/typescript/node_modules/.bin/protoc-gen-es
PY_GENERATED       := stubborn/v1 stubborn/_vendor
PY_THIRD_PARTY     := clients/python/third_party
# protoc_python DIR: generate the Python client from proto/ into DIR.
protoc_python = protoc -I proto --python_out=$(1) --pyi_out=$(1) --grpc_python_out=$(1) \
	--plugin=protoc-gen-grpc_python=$(GRPC_PYTHON_PLUGIN) proto/stubborn/v1/*.proto
# protoc_python_vendor DIR: generate the vendored protos' messages into DIR/stubborn/_vendor.
protoc_python_vendor = mkdir -p $(1)/stubborn/_vendor && \
	protoc -I $(PY_THIRD_PARTY)/googleapis -I $(PY_THIRD_PARTY)/grpc-proto \
	--python_out=$(1)/stubborn/_vendor --pyi_out=$(1)/stubborn/_vendor \
	$(PY_THIRD_PARTY)/googleapis/google/rpc/status.proto \
	$(PY_THIRD_PARTY)/googleapis/google/rpc/error_details.proto \
	$(PY_THIRD_PARTY)/grpc-proto/grpc/health/v1/health.proto
check_protoc = protoc --version | grep -q '^libprotoc $(PROTOC_VERSION)\.' || \
	{ echo "clients/python is generated with protoc $(PROTOC_VERSION) (Debian 12's protobuf-compiler), not $$(protoc --version 2>&1): run clients/install-deps.sh" >&2; exit 1; }

.PHONY: clients
clients: $(BUF) $(PROTOC_GEN_ES) ## Regenerate clients/python's generated code and clients/typescript/src/gen from the protos.
	@$(check_protoc)
	rm -rf $(addprefix clients/python/,$(PY_GENERATED))
	$(call protoc_python,clients/python)
	$(call protoc_python_vendor,clients/python)
	buf generate --template buf.gen.clients.yaml

.PHONY: checkclients
checkclients: $(BUF) $(PROTOC_GEN_ES) ## Fail if protoc warns on the protos or the generated clients are stale.
	@$(check_protoc)
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$$tmp/clients/python"; \
	if ! out=$$({ $(call protoc_python,"$$tmp/clients/python") && $(call protoc_python_vendor,"$$tmp/clients/python"); } 2>&1) || [ -n "$$out" ]; then \
		printf 'protoc must compile the protos without a word; it printed:\n%s\n' "$$out" >&2; exit 1; fi; \
	buf generate --template buf.gen.clients.yaml -o "$$tmp"; \
	stale=0; \
	for d in $(PY_GENERATED); do \
		diff -r -x __pycache__ "clients/python/$$d" "$$tmp/clients/python/$$d" || stale=1; done; \
	diff -r clients/typescript/src/gen "$$tmp/clients/typescript/src/gen" || stale=1; \
	if ((stale)); then echo 'clients/ is stale: run make clients' >&2; exit 1; fi

.PHONY: testclients
testclients: checkclients checkconsole ## checkclients, checkconsole, tsc, then the packages, the kit's tests and the examples (Python, TypeScript, Ruby, C++) against live servers, then testfrontdoor.
	cd clients/typescript && node_modules/.bin/tsc --noEmit
	bash clients/run-examples.sh
	bash clients/check-frontdoor.sh

# The front doors (Chat Completions and Anthropic Messages) driven by the
# official openai npm package and @anthropic-ai/sdk (clients/frontdoor-node,
# npm ci from its package-lock.json) and OpenAI Go SDK (clients/frontdoor-go,
# a Go module of its own like bench/temporal, so openai-go stays out of
# go.mod), over fake models that speak both APIs (tool calls, choices, the
# model's own errors), each in its own process, after the fake itself is
# checked under the SDKs: clients/check-frontdoor.sh. testclients runs it.
.PHONY: testfrontdoor
testfrontdoor: ## The front doors under the official openai npm package, openai-go and @anthropic-ai/sdk (clients/check-frontdoor.sh).
	bash clients/check-frontdoor.sh

$(PROTOC_GEN_ES): clients/typescript/package-lock.json
	cd clients/typescript && npm ci --no-audit --no-fund
	touch $@

# The web console: TypeScript in console/web (with the generated code of
# clients/typescript/src/gen), bundled by the esbuild pinned in
# console/web/package-lock.json into console/dist, which is committed and
# embedded in the binary (package console): building and testing Stubborn
# need only Go. After editing console/web, `make console` rebuilds
# console/dist; `make checkconsole` fails when console/web does not
# typecheck or console/dist is not what it builds (the build is
# deterministic). Both need Node.js and npm, so `make testclients` runs
# checkconsole, not `make test`.
CONSOLE_ESBUILD := console/web/node_modules/.bin/esbuild

.PHONY: console
console: $(CONSOLE_ESBUILD) ## Rebuild console/dist from console/web (needs Node.js and npm).
	cd console/web && node_modules/.bin/tsc --noEmit
	cd console/web && node build.mjs

.PHONY: checkconsole
checkconsole: $(CONSOLE_ESBUILD) ## Fail if console/web does not typecheck or console/dist is not what it builds.
	cd console/web && node_modules/.bin/tsc --noEmit
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	(cd console/web && node build.mjs "$$tmp/dist" >/dev/null); \
	if ! diff -rq console/dist "$$tmp/dist"; then echo 'console/dist is stale: run make console' >&2; exit 1; fi

$(CONSOLE_ESBUILD): console/web/package-lock.json
	cd console/web && npm ci --no-audit --no-fund
	touch $@

$(BUF):
	GOBIN=$(BIN) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	touch $@
$(GOCYCLO):
	GOBIN=$(BIN) go install github.com/fzipp/gocyclo/cmd/gocyclo@$(GOCYCLO_VERSION)
	touch $@
$(PROTOC_GEN_GO):
	GOBIN=$(BIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	touch $@
$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(BIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	touch $@

.PHONY: help
help:
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The fault-injection ("chaos") suite of issue 29, cmd/stubborn/chaos_test.go:
# a three-node cluster of real nats-server processes, three `stubborn serve
# -nats-url` replicas each behind TCP fault proxies of its own, a mixed
# workload, and one kind of fault per subtest of TestChaos (replica SIGKILL
# and SIGSTOP, SIGKILL of the STUBBORN_EVENTS leader, SIGSTOP of a NATS node,
# latency, blackhole and resets on one replica's link, two replicas started at
# once), then issue 29's invariants checked on every run. `make test` runs
# every scenario in a short form; this runs the long one (STUBBORN_CHAOS=long:
# more runs, three rounds of each fault, a 6 s lease). CHAOS_RUN picks
# scenarios, e.g. CHAOS_RUN=TestChaos/nats-leader-sigkill.
CHAOS_TEST_FLAGS ?= -race -count=1 -timeout=90m -v
CHAOS_RUN ?= ^TestChaos

.PHONY: chaos
chaos: ## The fault-injection suite of issue 29, long form (STUBBORN_CHAOS=long; CHAOS_RUN picks scenarios).
	STUBBORN_CHAOS=long go test $(CHAOS_TEST_FLAGS) -run '$(CHAOS_RUN)' ./cmd/stubborn/
