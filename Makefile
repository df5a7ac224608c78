# Quota coordinator: make help lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
DEMO_DURATION ?= 90s
BENCHTIME ?= 1s
TEST_TIMEOUT ?= 14m

.PHONY: help demo test lint bench bench-hotkey proto sim reliability scale build deps clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

demo: ## run the local multi-region story on embedded defaults (DEMO_DURATION=20s to shorten); writes out/demo.svg
	$(GO) run ./cmd/demo -duration $(DEMO_DURATION) -chart out/demo.svg

test: ## install redis-server/protoc if missing, start Redis on a free loopback port, run every test with -race
	scripts/with-redis.sh $(GO) test -race -timeout $(TEST_TIMEOUT) ./...

lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

bench: ## Go benchmarks, then every scripts/bench-*.sh (each starts and stops what it needs; bench-hotkey among them)
	scripts/with-redis.sh $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...
	@for s in scripts/bench-*.sh; do [ -x "$$s" ] || continue; echo "== $$s"; "$$s" || exit 1; done

bench-hotkey: ## one global key on Redis Cluster of 1 and 3 masters, whole and sharded; writes the table in docs/hotkey.md
	scripts/bench-hotkey.sh

proto: ## regenerate the protobuf Go code (protoc from Debian, plugins pinned in go.mod)
	scripts/deps.sh
	scripts/proto.sh

sim: ## the simulator's default sweep into out/sim
	$(GO) run ./cmd/sim -out out/sim

build: ## build every command into bin/
	$(GO) build -o bin/ ./cmd/...

deps: ## install redis-server, redis-tools, protoc, kubectl and promtool (prometheus) from Debian when missing
	scripts/deps.sh

clean: ## remove build and run outputs
	rm -rf bin out

scale: ## the control plane at doubling policies, nodes and regions (cmd/scale) into out/scale.md
	scripts/scale.sh

reliability: ## fault, load and security suites (long form) with a summary table
	scripts/reliability.sh
