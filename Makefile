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
test: ## All tests: unit, handler, TLS, the model check (short bounds), end-to-end against the real control plane, chart and alerts, then the image, the node and the chart installed on it
	hack/test.sh

# The Kubernetes releases `make compat` runs on: the oldest supported, the pinned one
# (the only one `make test` and CI use), the newest served. Each needs pins in
# hack/controlplane/ (kube/ and etcd/ for the pinned one, versions/<release>/ for others).
COMPAT_VERSIONS ?= v1.30.14 v1.36.3 v1.37.2

.PHONY: compat
compat: ## The suites `make test` runs on the control plane, then the node and the shipped suite, on each of COMPAT_VERSIONS; a table of results (hack/compat.sh)
	hack/compat.sh $(COMPAT_VERSIONS)

.PHONY: soak
soak: ## On the node, under a hatchery's load: a rolling upgrade, a replica SIGKILLed, evictions against the PDB, memory with 10,000 pods and abuse, certificate rotations through a SIGKILL and an upgrade, then a renewal in Gatekeeper's order (by hand) that the same counts catch
	hack/controlplane/cluster.sh up --node
	hack/tools/build.sh
	cargo test --locked --test soak -- --nocapture

.PHONY: image
image: ## Build the image from the Dockerfile with a local engine: cds-secret-guard:<version> and :dev
	hack/image.sh

.PHONY: reproduce
reproduce: ## Build the release image (linux/amd64 and linux/arm64) twice from scratch and check that both give one digest (hack/reproduce.sh; ~20 min)
	hack/reproduce.sh

.PHONY: release
release: ## Push the image and the chart to REGISTRY=host:port or host:port/path (REGISTRY/cds-secret-guard:<version>, oci://REGISTRY/charts/cds-secret-guard), signed with COSIGN_KEY=<cosign key> when given; a published version never moves; hack/release.sh says which logins and CA it takes
	REGISTRY=$(REGISTRY) COSIGN_KEY=$(COSIGN_KEY) hack/release.sh

.PHONY: bench
bench: ## Benchmarks (docs/design/benchmarks.md): in-process, guard vs ceiling over TLS, the apiserver path, the reconciler
	hack/bench.sh

.PHONY: fmt
fmt: ## Format the code
	cargo fmt --all
	cargo fmt --manifest-path fuzz/Cargo.toml

.PHONY: lint
lint: ## Formatting and clippy, as CI checks them
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	cargo clippy --locked --test shipped --test soak -- -D warnings
	cargo fmt --manifest-path fuzz/Cargo.toml -- --check

.PHONY: controlplane
controlplane: ## Build the control plane binaries (cached)
	hack/controlplane/build.sh

# cargo-fuzz is installed by `make fuzz` itself, into a cache outside the tree.
FUZZ_TOOLS ?= $(HOME)/.cache/cds-secret-guard/cargo-fuzz
FUZZ_TARGETS ?= decode validate mutate
# Executions per target; the default, 3 × 3,400,000, is over 10 million in all.
FUZZ_RUNS ?= 3400000
# Safe Rust (unsafe_code is forbidden): no sanitizer, debug assertions on.
FUZZ_BUILD := --sanitizer none --debug-assertions

.PHONY: fuzz
fuzz: ## Fuzz each target FUZZ_RUNS times (default 3.4M each, nightly, nice'd); findings in fuzz/artifacts
	test -x $(FUZZ_TOOLS)/bin/cargo-fuzz || cargo install cargo-fuzz --locked --root $(FUZZ_TOOLS)
	set -e; export PATH="$(FUZZ_TOOLS)/bin:$$PATH"; \
	for target in $(FUZZ_TARGETS); do \
	  mkdir -p target/fuzz-corpus/$$target; \
	  echo "== $$target: $(FUZZ_RUNS) runs"; \
	  time nice -n 15 cargo +nightly fuzz run $(FUZZ_BUILD) $$target \
	    target/fuzz-corpus/$$target fuzz/corpus/$$target -- \
	    -runs=$(FUZZ_RUNS) -max_len=8192 -dict=fuzz/admission.dict -print_final_stats=1 $(FUZZ_ARGS); \
	done

.PHONY: tools
tools: ## Build helm, promtool, toxiproxy, the test registry and crane (cached) into target/tools/bin
	hack/tools/build.sh

.PHONY: dashboard
dashboard: ## Draw docs/dashboard.png from a real Prometheus scraping two guards under a CDS-like load, then fire the guard-down alert (about 10 min; builds prometheus, cached)
	hack/dashboard.sh $(DASHBOARD_SECONDS)

.PHONY: model
model: ## The model check, deep bounds (tests/local/model): state counts and times per bound; MODEL_THREADS=2 for both cores, MODEL_BOUNDS=text for the bounds named so
	cargo test --release --locked --test model -- --ignored --nocapture the_protocol_holds_within_the_deep_bounds

.PHONY: race
race: ## The hatchery race, long (10,000 spawns per mode); CDS_CP_HA=1 for two apiservers, RACE_ARGS for more
	cargo build --release --locked --bins --example race
	target/release/examples/race $(RACE_ARGS)
