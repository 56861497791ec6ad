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

TOOLS := $(CURDIR)/.tools
BIN   := $(TOOLS)/bin
export PATH := $(BIN):$(PATH)

BUF                := $(TOOLS)/buf-$(BUF_VERSION)
PROTOC_GEN_GO      := $(TOOLS)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_GO_GRPC := $(TOOLS)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)

GO_TEST_FLAGS ?= -race -count=1 -timeout=15m

.PHONY: all
all: generate lint test

.PHONY: demo
demo: ## Run the demo: a server, demo delegates and two live runs in one process.
	go run ./cmd/stubborn demo

.PHONY: test
test: checkgenerate lint ## Lint, check gen/ is fresh, run every test with the race detector.
	go test $(GO_TEST_FLAGS) ./...

.PHONY: generate
generate: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Regenerate gen/ from proto/.
	buf generate

.PHONY: checkgenerate
checkgenerate: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Fail if gen/ differs from what proto/ generates.
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	buf generate -o "$$tmp"; \
	if ! diff -r gen "$$tmp/gen"; then echo 'gen/ is stale: run make generate' >&2; exit 1; fi

.PHONY: lint
lint: $(BUF) ## go vet, gofmt, buf lint, buf format.
	go vet ./...
	@out=$$(find . -name '*.go' -not -path './gen/*' -not -path './.tools/*' -not -path './clients/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	buf lint
	buf format -d --exit-code

.PHONY: bench
bench: ## Load harness: Stubborn beside a direct call and a plain gRPC proxy.
	go run ./bench $(BENCH_FLAGS)
	go test -run '^$$' -bench . -benchmem ./controls/... ./runs/...

.PHONY: build
build:
	go build -o bin/stubborn ./cmd/stubborn

$(BUF):
	GOBIN=$(BIN) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
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
