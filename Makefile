# Harmony fleet. `make test` takes a fresh machine to a full test run;
# `make demo` runs a demo device against a local nats-server.
SHELL := /bin/bash
CARGO ?= cargo
# Where cargo puts its builds (the bench runs the release binaries from there).
BENCH_TARGET := $(or $(CARGO_TARGET_DIR),target)

.PHONY: all deps lint build test test-unit demo bench bench-profiles clean

all: build

## Install what the tests need when it is missing (apt packages, nats-server 2.14, Rust targets).
deps:
	@bash scripts/deps.sh

## Formatting and lints, as CI runs them.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Every binary the integration tests run.
build:
	$(CARGO) build --workspace --bins

## The one command: dependencies, lint, build, every test.
test: deps lint build
	$(CARGO) test --workspace --no-fail-fast --features fleet-updater/fault-injection

## One demo device against a local nats-server (Ctrl-C stops and cleans up).
demo: deps build
	@bash scripts/demo.sh

## Measures every DESIGN.md target on release builds, each beside a
## baseline from the same run; prints a markdown table and writes
## target/bench/last-run.md (minutes: a 60 s idle window, 1,000 agents).
## BENCH_ARGS passes options (fleet-bench --help), e.g. --only sizes,device.
bench: deps
	$(CARGO) build --release --workspace --bins
	$(BENCH_TARGET)/release/fleet-bench $(BENCH_ARGS)

## `make bench`, plus two more builds of the daemons it reports beside the
## release build: at opt-level 3 (the size baseline, in target/bench-o3),
## and statically linked for x86_64 musl (the memory it saves, in
## target/bench-musl; ring's C is built with the host cc, which needs no
## libc headers for it).
bench-profiles: deps
	CARGO_PROFILE_RELEASE_OPT_LEVEL=3 $(CARGO) build --release -p fleet-agent -p fleet-updater --target-dir $(BENCH_TARGET)/bench-o3
	rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl
	CC_x86_64_unknown_linux_musl=cc $(CARGO) build --release -p fleet-agent -p fleet-updater --target x86_64-unknown-linux-musl --target-dir $(BENCH_TARGET)/bench-musl
	$(MAKE) bench

clean:
	$(CARGO) clean
	rm -rf .deps
