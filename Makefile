# cds-secret-guard tasks. `make` lists them.
.DEFAULT_GOAL := help
SHELL := bash

.PHONY: help
help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

.PHONY: run
run: ## Build, start the local control plane and the guard, register it, print what to try
	hack/local.sh up

.PHONY: down
down: ## Stop the guard and the local control plane
	hack/local.sh down

.PHONY: test
test: ## All tests: unit, handler, TLS and end-to-end against the real control plane
	tests/controlplane/cluster.sh up
	cargo test --locked --all-targets

.PHONY: bench
bench: ## Benchmarks (BENCHMARKS.md): in-process, guard vs ceiling over TLS, the apiserver path, the reconciler
	hack/bench.sh

.PHONY: fmt
fmt: ## Format the code
	cargo fmt --all

.PHONY: lint
lint: ## Formatting and clippy, as CI checks them
	cargo fmt --all -- --check
	cargo clippy --locked --all-targets -- -D warnings

.PHONY: controlplane
controlplane: ## Build the control plane binaries (cached)
	tests/controlplane/build.sh

.PHONY: race
race: ## The hatchery race, long (10,000 spawns per mode); CDS_CP_HA=1 for two apiservers, RACE_ARGS for more
	cargo build --release --locked --bins --example race
	target/release/examples/race $(RACE_ARGS)
