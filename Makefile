# Harmony fleet. `make test` takes a fresh machine to a full test run;
# `make demo` runs a demo device against a local nats-server.
SHELL := /bin/bash
CARGO ?= cargo

# Packaging: ARCH is amd64, arm64 or armhf (Debian names; rpm gets x86_64,
# aarch64, armv7hl). Cross builds use Debian's gcc-aarch64-linux-gnu and
# gcc-arm-linux-gnueabihf (make deps); .cargo/config.toml names the linkers.
# The device daemons (fleet-agent, fleet-updater) of amd64 and arm64 are
# static musl builds (DEVICE_TRIPLE); armhf's stay on glibc, as Rust's
# armv7 musl target cannot be installed here. fleetctl is dynamic (TRIPLE).
ARCH ?= amd64
ARCHES := amd64 arm64 armhf
TRIPLE_amd64 := x86_64-unknown-linux-gnu
TRIPLE_arm64 := aarch64-unknown-linux-gnu
TRIPLE_armhf := armv7-unknown-linux-gnueabihf
TRIPLE = $(or $(TRIPLE_$(ARCH)),$(error ARCH must be one of $(ARCHES), not "$(ARCH)"))
DEVICE_TRIPLE_amd64 := x86_64-unknown-linux-musl
DEVICE_TRIPLE_arm64 := aarch64-unknown-linux-musl
DEVICE_TRIPLE_armhf := armv7-unknown-linux-gnueabihf
DEVICE_TRIPLE = $(or $(DEVICE_TRIPLE_$(ARCH)),$(error ARCH must be one of $(ARCHES), not "$(ARCH)"))
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BIN_DIR = $(TARGET_DIR)/$(TRIPLE)/release
DEVICE_BIN_DIR = $(TARGET_DIR)/$(DEVICE_TRIPLE)/release
# ring's C and assembly: cc-rs would guess the gnu ones too; say them. The
# musl targets have no cross gcc of their own: ring's C needs no libc
# headers, so the host cc and Debian's aarch64 glibc cross gcc build it.
export CC_aarch64_unknown_linux_gnu := aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu := aarch64-linux-gnu-ar
export CC_armv7_unknown_linux_gnueabihf := arm-linux-gnueabihf-gcc
export AR_armv7_unknown_linux_gnueabihf := arm-linux-gnueabihf-ar
export CC_x86_64_unknown_linux_musl := cc
export AR_x86_64_unknown_linux_musl := ar
export CC_aarch64_unknown_linux_musl := aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_musl := aarch64-linux-gnu-ar

# `make install`: DESTDIR stages, PREFIX places the operator CLI (fleetctl).
# The device files keep the fixed paths of docs/design/architecture.md
# ("Paths on a device") whatever
# PREFIX says: the units, the updater and the active link name them.
DESTDIR ?=
PREFIX ?= /usr/local

.PHONY: all help deps fresh-machine lint build test test-systemd test-unit test-integration test-e2e demo bench bench-100k bench-profiles clean \
	release release-device man device-packages deb rpm packages packages-for-test test-agents install install-files uninstall

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
## FLEET_AGENT_VERSION is read by option_env!) and fleet-updater (built with
## fault injection and test bounds). Built as the amd64 package's daemons are
## (release, static musl: DEVICE_TRIPLE_amd64), in their own target dir so
## the package's build is left as it is. The version is
## fleet_harness::UPGRADE_TEST_VERSION.
UPGRADE_TEST_VERSION := 0.3.0-upgrade-test
TEST_AGENTS := $(TARGET_DIR)/test-agents
TEST_AGENTS_BUILD := $(TARGET_DIR)/test-agents-build
TEST_AGENTS_BIN := $(TEST_AGENTS_BUILD)/$(DEVICE_TRIPLE_amd64)/release
TEST_AGENT_SOURCES := $(shell find agent/src common/src updater/src -name '*.rs') \
	agent/Cargo.toml common/Cargo.toml updater/Cargo.toml Cargo.lock
# The agents devices in the field run, each built from the commit that
# shipped it, in a source tree and target dir of its own: 0.1.0, the last
# release of the generation-1 protocol (a consumer per device), and 0.2.0,
# the first of generation 2 (Direct Get and republished keys, a heartbeat
# write every 30 s, workload specs without health probes). The mixed-fleet
# tests run them against today's server config and fleetctl.
RELEASED_AGENT_VERSION := 0.1.0
RELEASED_AGENT_COMMIT := 6e73add4baa2f2fa1ce491cc2701e5d9187c6c95
RELEASED_AGENT_0_2_VERSION := 0.2.0
RELEASED_AGENT_0_2_COMMIT := 06df2a6f5687376036476fa8177fc7550fbe6e3b
test-agents: $(TEST_AGENTS)/fleet-agent-$(UPGRADE_TEST_VERSION) $(TEST_AGENTS)/fleet-updater \
	$(TEST_AGENTS)/fleet-agent-$(RELEASED_AGENT_VERSION) $(TEST_AGENTS)/fleet-agent-$(RELEASED_AGENT_0_2_VERSION)

# released-agent VERSION COMMIT: the debug agent built from that commit's tree.
define released-agent
$(TEST_AGENTS)/fleet-agent-$(1):
	mkdir -p $(TEST_AGENTS) $(TARGET_DIR)/released-$(1)
	rm -rf $(TARGET_DIR)/released-$(1)/src && mkdir -p $(TARGET_DIR)/released-$(1)/src
	git archive $(2) | tar -x -C $(TARGET_DIR)/released-$(1)/src
	cd $(TARGET_DIR)/released-$(1)/src && $(CARGO) build --locked -p fleet-agent --target-dir $(abspath $(TARGET_DIR))/released-$(1)/target
	install -s -m 0755 $(TARGET_DIR)/released-$(1)/target/debug/fleet-agent $$@.tmp && mv $$@.tmp $$@
endef
$(eval $(call released-agent,$(RELEASED_AGENT_VERSION),$(RELEASED_AGENT_COMMIT)))
$(eval $(call released-agent,$(RELEASED_AGENT_0_2_VERSION),$(RELEASED_AGENT_0_2_COMMIT)))

$(TEST_AGENTS)/fleet-agent-$(UPGRADE_TEST_VERSION): $(TEST_AGENT_SOURCES)
	mkdir -p $(TEST_AGENTS)
	FLEET_AGENT_VERSION=$(UPGRADE_TEST_VERSION) $(CARGO) build --release --target $(DEVICE_TRIPLE_amd64) \
		--target-dir $(TEST_AGENTS_BUILD) -p fleet-agent
	install -m 0755 $(TEST_AGENTS_BIN)/fleet-agent $@.tmp && mv $@.tmp $@

$(TEST_AGENTS)/fleet-updater: $(TEST_AGENT_SOURCES)
	mkdir -p $(TEST_AGENTS)
	$(CARGO) build --release --target $(DEVICE_TRIPLE_amd64) --target-dir $(TEST_AGENTS_BUILD) \
		-p fleet-updater --features fault-injection
	install -m 0755 $(TEST_AGENTS_BIN)/fleet-updater $@.tmp && mv $@.tmp $@

## The tiers (docs/development/testing.md): each runs every one of its suites even when one
## fails, logs to $(TEST_LOGS)/TIER.log, and fails when it ran no test.
TEST_LOGS := $(TARGET_DIR)/test-logs
TEST_FEATURES := --features fleet-updater/fault-injection
E2E_PACKAGES := -p fleet-packaging-tests -p fleet-e2e-systemd
E2E_MATRIX := $(TARGET_DIR)/e2e/matrix.md
# The harness's own test of a booted container's exec is in-crate (it reads private
# state) but boots a container: it runs with the integration tier.
HARNESS_BOOT_TEST := systemd::tests::exec_output_is_exact_and_can_be_read_again_until_the_next_exec
UNIT_CMD := $(CARGO) test --workspace $(TEST_FEATURES) --lib --bins --test golden --test prop_parsers \
	-- --skip $(HARNESS_BOOT_TEST) +++ $(CARGO) test --workspace $(TEST_FEATURES) --doc
INTEGRATION_CMD := $(CARGO) test --workspace $(TEST_FEATURES) --no-fail-fast --test '*' \
	--exclude fleet-packaging-tests --exclude fleet-e2e-systemd \
	+++ $(CARGO) test --workspace $(TEST_FEATURES) --lib -- --exact $(HARNESS_BOOT_TEST)
E2E_CMD := $(CARGO) test $(E2E_PACKAGES) $(TEST_FEATURES) --no-fail-fast

## test-unit: the unit and in-crate tests, golden and property tests: nothing outside the build.
test-unit:
	@bash scripts/test-tier.sh unit $(TEST_LOGS) $(UNIT_CMD)

## test-integration: the tests against nats-server, Podman, HTTPS servers, the registry.
test-integration: build test-agents
	@bash scripts/test-tier.sh integration $(TEST_LOGS) $(INTEGRATION_CMD)

## test-e2e: booted systemd containers: the packages, upgrades under systemd, the fault matrix.
test-e2e: packages-for-test
	@rm -f $(E2E_MATRIX)
	@status=0; bash scripts/test-tier.sh e2e $(TEST_LOGS) $(E2E_CMD) || status=$$?; \
	if [ -f $(E2E_MATRIX) ]; then echo; cat $(E2E_MATRIX); fi; \
	exit $$status

## test: the one command: dependencies, lint, build, packages, every tier; it ends with the
## fault matrix under systemd (fault point × outcome, written by tests/e2e-systemd) and the
## time each suite took.
test: deps lint build packages-for-test
	@rm -f $(E2E_MATRIX) $(TEST_LOGS)/*.log
	@status=0; \
	bash scripts/test-tier.sh unit $(TEST_LOGS) $(UNIT_CMD) || status=1; \
	bash scripts/test-tier.sh integration $(TEST_LOGS) $(INTEGRATION_CMD) || status=1; \
	bash scripts/test-tier.sh e2e $(TEST_LOGS) $(E2E_CMD) || status=1; \
	if [ -f $(E2E_MATRIX) ]; then echo; cat $(E2E_MATRIX); else echo "no fault matrix: $(E2E_MATRIX) was not written"; fi; \
	bash scripts/test-tier.sh --times $(TEST_LOGS); \
	grep -hE '^test .* FAILED$$' $(TEST_LOGS)/*.log 2>/dev/null | sed 's/^/failed: /'; \
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
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p fleet-agent --bin fleet-agent prop_tests
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p fleet-updater --lib prop_tests

## fresh-machine: (root, ~15 min, not in test) make deps in a clean Debian 12 chroot with a fresh rustup, then ring built for every cross target.
fresh-machine:
	@bash scripts/fresh-machine.sh

## demo: one demo device against a local nats-server (Ctrl-C stops and cleans up).
demo: deps build
	@bash scripts/demo.sh

# The second agent version the cutover figure switches to (the bench's
# cutover::NEXT_VERSION); built in its own target dir so the release build
# of the workspace stays as it is.
BENCH_NEXT_VERSION := 0.3.0-bench
## bench: every target of docs/development/bench.md measured on release builds (the shipped static musl daemons; glibc beside) with a baseline from the same run (each section's table into docs/bench/<section>.md, the whole in target/bench/last-run.md; ~33 min: 16 of them the scale section, 13 the traffic section). BENCH_ARGS: fleet-bench options, e.g. --only sizes,device.
# The daemons measured against the targets are the amd64 package's (static
# musl, DEVICE_TRIPLE_amd64); the glibc release build of the workspace is
# measured beside them.
# The traffic section measures the released agent 0.2.0 beside ours.
bench: deps man $(TEST_AGENTS)/fleet-agent-$(RELEASED_AGENT_0_2_VERSION)
	$(CARGO) build --release --workspace --bins
	$(MAKE) --no-print-directory release-device ARCH=amd64
	FLEET_AGENT_VERSION=$(BENCH_NEXT_VERSION) $(CARGO) build --release -p fleet-agent --target $(DEVICE_TRIPLE_amd64) --target-dir $(TARGET_DIR)/bench-next
	OUT_DIR=$(TARGET_DIR)/bench/packages BIN_DIR=$(TARGET_DIR)/$(DEVICE_TRIPLE_amd64)/release scripts/package.sh deb device amd64
	$(TARGET_DIR)/release/fleet-bench $(BENCH_ARGS)

## bench-100k: the scale-leaf section at 100,000 simulated devices on 7 leaf nodes of the 3-node hub, GOMEMLIMIT 1800MiB on each of the 10 servers (~13 min, ~18 GiB of memory in all; not part of make bench), into docs/bench/scale-leaf.md.
bench-100k: deps
	$(CARGO) build --release --workspace --bins
	GOMEMLIMIT=1800MiB $(TARGET_DIR)/release/fleet-bench --only scale-leaf --scale-leaf-devices 100000 --leaves 7 --scale-leaf-rate 1000

## bench-profiles: make bench, with the daemons also built at opt-level 3 (glibc; size baseline), reported beside.
bench-profiles: deps
	CARGO_PROFILE_RELEASE_OPT_LEVEL=3 $(CARGO) build --release -p fleet-agent -p fleet-updater --target-dir $(TARGET_DIR)/bench-o3
	$(MAKE) bench

## release: release binaries of the agent and updater (DEVICE_TRIPLE: static musl on amd64 and arm64) and fleetctl (TRIPLE) for ARCH.
release: release-device
	$(CARGO) build --release --target $(TRIPLE) -p fleetctl

release-device:
	$(CARGO) build --release --target $(DEVICE_TRIPLE) -p fleet-agent -p fleet-updater

## man: the man pages (the daemons' from their --help, fleetctl's and its bash completion from its clap definition; host debug build), into target/man (scripts/man.sh).
MAN_DIR := $(TARGET_DIR)/man
export MAN_DIR
man:
	$(CARGO) build --bins -p fleet-agent -p fleet-updater -p fleetctl -p fleet-auth-callout
	scripts/man.sh $(MAN_DIR) $(TARGET_DIR)/debug

## device-packages: only harmony-fleet (.deb and .rpm) for ARCH, without building fleetctl.
device-packages: release-device man
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(DEVICE_BIN_DIR) scripts/package.sh deb device $(ARCH)
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(DEVICE_BIN_DIR) scripts/package.sh rpm device $(ARCH)

## deb: harmony-fleet (device) and harmony-fleetctl .deb for ARCH, in target/packages/.
deb: release man
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(DEVICE_BIN_DIR) scripts/package.sh deb device $(ARCH)
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(BIN_DIR) scripts/package.sh deb fleetctl $(ARCH)

## rpm: the same two packages as .rpm for ARCH.
rpm: release man
	OUT_DIR=$(TARGET_DIR)/packages BIN_DIR=$(DEVICE_BIN_DIR) scripts/package.sh rpm device $(ARCH)
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
install: release man install-files

## install-files: install without building (the release binaries of ARCH and target/man exist).
install-files:
	scripts/stage.sh device "$(DESTDIR)" $(DEVICE_BIN_DIR)
	scripts/stage.sh fleetctl "$(DESTDIR)" $(BIN_DIR) $(PREFIX)
	@if [ -z "$(DESTDIR)" ]; then \
		echo "Now run device setup (as root): fleet-updater setup --agent-binary /usr/lib/harmony-fleet/bootstrap/fleet-agent"; \
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
