# Harmony fleet. `make test` takes a fresh machine to a full test run;
# `make demo` runs a demo device against a local nats-server.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all deps lint build test test-agents test-unit demo bench clean

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

## Builds the upgrade tests run besides the normal ones, in $(TEST_AGENTS):
## fleet-agent-$(UPGRADE_TEST_VERSION) (the agent compiled as another version:
## FLEET_AGENT_VERSION is read by option_env!, so only the agent crate is
## rebuilt, twice) and fleet-updater (built with fault injection and test
## bounds). The version is fleet_harness::UPGRADE_TEST_VERSION.
UPGRADE_TEST_VERSION := 0.2.0-upgrade-test
TEST_AGENTS := $(or $(CARGO_TARGET_DIR),target)/test-agents
TEST_AGENT_SOURCES := $(shell find agent/src common/src updater/src -name '*.rs') \
	agent/Cargo.toml common/Cargo.toml updater/Cargo.toml Cargo.lock
test-agents: $(TEST_AGENTS)/fleet-agent-$(UPGRADE_TEST_VERSION) $(TEST_AGENTS)/fleet-updater

$(TEST_AGENTS)/fleet-agent-$(UPGRADE_TEST_VERSION): $(TEST_AGENT_SOURCES)
	mkdir -p $(TEST_AGENTS)
	FLEET_AGENT_VERSION=$(UPGRADE_TEST_VERSION) $(CARGO) build -p fleet-agent
	cp $(or $(CARGO_TARGET_DIR),target)/debug/fleet-agent $@.tmp && mv $@.tmp $@
	$(CARGO) build -p fleet-agent

$(TEST_AGENTS)/fleet-updater: $(TEST_AGENT_SOURCES)
	mkdir -p $(TEST_AGENTS)
	$(CARGO) build -p fleet-updater --features fault-injection
	cp $(or $(CARGO_TARGET_DIR),target)/debug/fleet-updater $@.tmp && mv $@.tmp $@
	$(CARGO) build -p fleet-updater

## The one command: dependencies, lint, build, every test.
test: deps lint build test-agents
	$(CARGO) test --workspace --no-fail-fast --features fleet-updater/fault-injection

## One demo device against a local nats-server (Ctrl-C stops and cleans up).
demo: deps build
	@bash scripts/demo.sh

clean:
	$(CARGO) clean
	rm -rf .deps
