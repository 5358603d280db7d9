# Harmony fleet. `make test` takes a fresh machine to a full test run;
# `make demo` runs a demo device against a local nats-server.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all deps lint build test test-unit demo bench clean

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

clean:
	$(CARGO) clean
	rm -rf .deps
