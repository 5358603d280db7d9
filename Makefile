# Harmony fleet. `make test` takes a fresh machine to a full test run;
# `make demo` runs a demo device against a local nats-server.
SHELL := /bin/bash
CARGO ?= cargo

# Packaging: ARCH is amd64, arm64 or armhf (Debian names; rpm gets x86_64,
# aarch64, armv7hl). Cross builds use Debian's gcc-aarch64-linux-gnu and
# gcc-arm-linux-gnueabihf (make deps); .cargo/config.toml names the linkers.
ARCH ?= amd64
ARCHES := amd64 arm64 armhf
TRIPLE_amd64 := x86_64-unknown-linux-gnu
TRIPLE_arm64 := aarch64-unknown-linux-gnu
TRIPLE_armhf := armv7-unknown-linux-gnueabihf
TRIPLE = $(or $(TRIPLE_$(ARCH)),$(error ARCH must be one of $(ARCHES), not "$(ARCH)"))
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BIN_DIR = $(TARGET_DIR)/$(TRIPLE)/release
# ring's C and assembly: cc-rs would guess these too; say them.
export CC_aarch64_unknown_linux_gnu := aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu := aarch64-linux-gnu-ar
export CC_armv7_unknown_linux_gnueabihf := arm-linux-gnueabihf-gcc
export AR_armv7_unknown_linux_gnueabihf := arm-linux-gnueabihf-ar

# `make install`: DESTDIR stages, PREFIX places the operator CLI (fleetctl).
# The device files keep the fixed paths of DESIGN.md "On the device" whatever
# PREFIX says: the units, the updater and the active link name them.
DESTDIR ?=
PREFIX ?= /usr/local

.PHONY: all help deps lint build test test-systemd test-unit demo bench bench-profiles clean \
	release device-packages deb rpm packages packages-for-test test-agents install install-files uninstall

all: build

## Targets (packaging ones take ARCH=amd64|arm64|armhf, default amd64).
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## deps: install what the tests need when it is missing (apt packages, nats-server 2.14, Rust targets).
deps:
	@bash scripts/deps.sh

## lint: formatting and lints, as CI runs them.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## build: every binary the integration tests run (debug).
build:
	$(CARGO) build --workspace --bins

## test-agents: builds the upgrade tests run besides the normal ones, in $(TEST_AGENTS):
## fleet-agent-$(UPGRADE_TEST_VERSION) (the agent compiled as another version:
## FLEET_AGENT_VERSION is read by option_env!, so only the agent crate is
## rebuilt, twice) and fleet-updater (built with fault injection and test
## bounds). The version is fleet_harness::UPGRADE_TEST_VERSION.
UPGRADE_TEST_VERSION := 0.2.0-upgrade-test
TEST_AGENTS := $(TARGET_DIR)/test-agents
TEST_AGENT_SOURCES := $(shell find agent/src common/src updater/src -name '*.rs') \
	agent/Cargo.toml common/Cargo.toml updater/Cargo.toml Cargo.lock
# The agent devices in the field run: 0.1.0, the last release of the
# generation-1 protocol (a consumer per device), built from the commit that
# shipped it, for the mixed-fleet tests (an upgrade from it, served by
# today's server config), in a source tree and target dir of its own.
RELEASED_AGENT_VERSION := 0.1.0
RELEASED_AGENT_COMMIT := 6e73add4baa2f2fa1ce491cc2701e5d9187c6c95
test-agents: $(TEST_AGENTS)/fleet-agent-$(UPGRADE_TEST_VERSION) $(TEST_AGENTS)/fleet-updater \
	$(TEST_AGENTS)/fleet-agent-$(RELEASED_AGENT_VERSION)

$(TEST_AGENTS)/fleet-agent-$(RELEASED_AGENT_VERSION):
	mkdir -p $(TEST_AGENTS) $(TARGET_DIR)/released
	rm -rf $(TARGET_DIR)/released/src && mkdir -p $(TARGET_DIR)/released/src
	git archive $(RELEASED_AGENT_COMMIT) | tar -x -C $(TARGET_DIR)/released/src
	cd $(TARGET_DIR)/released/src && $(CARGO) build --locked -p fleet-agent --target-dir $(abspath $(TARGET_DIR))/released/target
	install -s -m 0755 $(TARGET_DIR)/released/target/debug/fleet-agent $@.tmp && mv $@.tmp $@

$(TEST_AGENTS)/fleet-agent-$(UPGRADE_TEST_VERSION): $(TEST_AGENT_SOURCES)
	mkdir -p $(TEST_AGENTS)
	FLEET_AGENT_VERSION=$(UPGRADE_TEST_VERSION) $(CARGO) build -p fleet-agent
	install -s -m 0755 $(TARGET_DIR)/debug/fleet-agent $@.tmp && mv $@.tmp $@
	$(CARGO) build -p fleet-agent

$(TEST_AGENTS)/fleet-updater: $(TEST_AGENT_SOURCES)
	mkdir -p $(TEST_AGENTS)
	$(CARGO) build -p fleet-updater --features fault-injection
	cp $(TARGET_DIR)/debug/fleet-updater $@.tmp && mv $@.tmp $@
	$(CARGO) build -p fleet-updater

## test: the one command: dependencies, lint, build, packages, every test; it ends with the
## fault matrix under systemd (fault point × outcome, written by tests/e2e-systemd).
E2E_MATRIX := $(TARGET_DIR)/e2e/matrix.md
test: deps lint build packages-for-test
	@rm -f $(E2E_MATRIX)
	@status=0; $(CARGO) test --workspace --no-fail-fast --features fleet-updater/fault-injection || status=$$?; \
	if [ -f $(E2E_MATRIX) ]; then echo; cat $(E2E_MATRIX); else echo "no fault matrix: $(E2E_MATRIX) was not written"; fi; \
	exit $$status

## test-systemd: only the end-to-end upgrade tests under systemd (tests/e2e-systemd), then the matrix.
test-systemd: build test-agents
	$(MAKE) --no-print-directory deb ARCH=amd64
	@rm -f $(E2E_MATRIX)
	@status=0; $(CARGO) test -p fleet-e2e-systemd --features fleet-updater/fault-injection || status=$$?; \
	if [ -f $(E2E_MATRIX) ]; then echo; cat $(E2E_MATRIX); fi; \
	exit $$status

## fuzz: the property tests of every parser of outside input, long (release build; PROPTEST_CASES, default 100000 per parser).
.PHONY: fuzz
fuzz:
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p fleet-common --test prop_parsers
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p fleet-auth-callout --lib prop_tests

## demo: one demo device against a local nats-server (Ctrl-C stops and cleans up).
demo: deps build
	@bash scripts/demo.sh

# The second agent version the cutover figure switches to (the bench's
# cutover::NEXT_VERSION); built in its own target dir so the release build
# of the workspace stays as it is.
BENCH_NEXT_VERSION := 0.2.0-bench
## bench: every DESIGN.md target measured on release builds beside a baseline from the same run (markdown table, also in target/bench/last-run.md; ~3 min). BENCH_ARGS: fleet-bench options, e.g. --only sizes,device.
bench: deps
	$(CARGO) build --release --workspace --bins
	FLEET_AGENT_VERSION=$(BENCH_NEXT_VERSION) $(CARGO) build --release -p fleet-agent --target-dir $(TARGET_DIR)/bench-next
	OUT_DIR=$(TARGET_DIR)/bench/packages BIN_DIR=$(TARGET_DIR)/release scripts/package.sh deb device amd64
	$(TARGET_DIR)/release/fleet-bench $(BENCH_ARGS)

## bench-profiles: make bench, with the daemons also built at opt-level 3 (size baseline) and statically for x86_64 musl (memory), reported beside.
# ring's C is built for musl with the host cc: it needs no libc headers.
bench-profiles: deps
	CARGO_PROFILE_RELEASE_OPT_LEVEL=3 $(CARGO) build --release -p fleet-agent -p fleet-updater --target-dir $(TARGET_DIR)/bench-o3
	rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl
	CC_x86_64_unknown_linux_musl=cc $(CARGO) build --release -p fleet-agent -p fleet-updater --target x86_64-unknown-linux-musl --target-dir $(TARGET_DIR)/bench-musl
	$(MAKE) bench

## release: release binaries of the agent, updater and fleetctl for ARCH.
release:
	$(CARGO) build --release --target $(TRIPLE) -p fleet-agent -p fleet-updater -p fleetctl

## device-packages: only harmony-fleet (.deb and .rpm) for ARCH, without building fleetctl.
device-packages:
	$(CARGO) build --release --target $(TRIPLE) -p fleet-agent -p fleet-updater
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh deb device $(ARCH)
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh rpm device $(ARCH)

## deb: harmony-fleet (device) and harmony-fleetctl .deb for ARCH, in target/packages/.
deb: release
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh deb device $(ARCH)
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh deb fleetctl $(ARCH)

## rpm: the same two packages as .rpm for ARCH.
rpm: release
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh rpm device $(ARCH)
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh rpm fleetctl $(ARCH)

## packages: .deb and .rpm of both packages for every ARCH.
packages:
	for a in $(ARCHES); do $(MAKE) --no-print-directory deb rpm ARCH=$$a || exit 1; done

## packages-for-test: what the tests use: amd64 packages, the ARM device packages (fleetctl's
## ARM builds, ~45 s each, are left to `make packages`), test agents.
packages-for-test: test-agents
	$(MAKE) --no-print-directory deb rpm ARCH=amd64
	for a in arm64 armhf; do $(MAKE) --no-print-directory device-packages ARCH=$$a || exit 1; done

## install: build, then the device files (fixed paths) and fleetctl (PREFIX) into DESTDIR; then run device setup.
install: release install-files

## install-files: install without building (the release binaries of ARCH exist).
install-files:
	scripts/stage.sh device "$(DESTDIR)" $(BIN_DIR)
	scripts/stage.sh fleetctl "$(DESTDIR)" $(BIN_DIR) $(PREFIX)
	@if [ -z "$(DESTDIR)" ]; then \
		echo "Now run device setup (as root): fleet-updater setup --agent-binary /usr/share/harmony-fleet/bootstrap/fleet-agent"; \
	fi

## uninstall: remove what install put there (not state, installed agent versions or the active link).
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then \
		systemctl disable --now fleet-agent.service fleet-updater.service 2>/dev/null || true; \
	fi
	{ scripts/stage.sh list device; scripts/stage.sh list fleetctl $(PREFIX); } | sed 's|^|$(DESTDIR)|' | \
		while read -r f; do rm -f "$$f"; rmdir -p --ignore-fail-on-non-empty "$$(dirname "$$f")" 2>/dev/null || true; done
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

clean:
	$(CARGO) clean
	rm -rf .deps
