#!/usr/bin/env bash
# `make fresh-machine` (root; not part of `make test`: ~15 minutes, mostly
# downloads): proves that `make deps` takes a fresh Debian 12 to a working
# build. In a chroot of a clean bookworm (debootstrap minbase with only
# make, git and ca-certificates added; cached as a tarball in
# $FLEET_TEST_CACHE or /var/cache/fleet-test and unpacked anew each run),
# with a fresh rustup (its toolchain from rust-toolchain.toml) and this work tree's files, it runs
# `make deps` twice (install, then only the checks) and builds ring's C
# and assembly for each cross target, the step that failed without the
# cross libc headers.
#
# The host's local CAs (/usr/local/share/ca-certificates) are copied in: a
# network whose egress re-signs TLS needs them on any machine behind it.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "fresh-machine: run as root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh-machine: needs Debian package debootstrap" >&2; exit 1; }

cache=${FLEET_TEST_CACHE:-/var/cache/fleet-test}
image=$cache/bookworm-minbase-make-git.tar
mkdir -p "$cache"
if [[ ! -f $image ]]; then
  echo "fresh-machine: debootstrap bookworm (minbase + make, git, ca-certificates) into $image"
  tmp=$(mktemp -d "$cache/fresh.XXXXXX")
  debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$tmp/rootfs" \
    http://deb.debian.org/debian >"$tmp/debootstrap.log" 2>&1 ||
    { tail -n 20 "$tmp/debootstrap.log" >&2; rm -rf "$tmp"; exit 1; }
  tar -C "$tmp" -cf "$image.tmp" rootfs && mv "$image.tmp" "$image"
  rm -rf "$tmp"
fi

work=$(mktemp -d /var/tmp/fleet-fresh.XXXXXX)
R=$work/rootfs
mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    m=${mounted[i]}
    umount -R "$m" 2>/dev/null || umount -lR "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
tar -C "$work" -xf "$image"
cp /etc/resolv.conf "$R/etc/resolv.conf"
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
  chroot "$R" update-ca-certificates >/dev/null 2>&1
fi
mount -t proc proc "$R/proc" && mounted+=("$R/proc")
mount --rbind /sys "$R/sys" && mounted+=("$R/sys")
mount --rbind /dev "$R/dev" && mounted+=("$R/dev")
mount -t tmpfs tmpfs "$R/tmp" && mounted+=("$R/tmp")
mkdir -p "$R/src"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$R/src" -xf -
rustup_bin=$(command -v rustup-init || command -v rustup || true)
[[ -n $rustup_bin ]] || { echo "fresh-machine: needs rustup on the host (copied in as rustup-init)" >&2; exit 1; }
install -m 0755 "$rustup_bin" "$R/usr/local/bin/rustup-init"

chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb \
  PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c '
set -euo pipefail
echo "== fresh machine: the build tools present"
dpkg-query -W -f "\${Package} \${Status}\n" gcc libc6-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross 2>/dev/null |
  grep " installed" || echo "none of gcc, libc6-dev, the cross compilers, their libc headers"
rustup-init -y -q --profile minimal --default-toolchain none --no-modify-path >/tmp/rustup.log 2>&1 ||
  { tail -n 20 /tmp/rustup.log; exit 1; }
cd /src && rustup toolchain install >/dev/null 2>&1; rustc --version
cd /src
echo "== make deps"
make deps
echo "== make deps again: only the checks"
make deps
echo "== ring (C and assembly) for every cross target, with the Makefile'"'"'s compilers"
for t in aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf aarch64-unknown-linux-musl x86_64-unknown-linux-musl; do
  printf "include Makefile\nring-for:\n\t\$(CARGO) build -q --release --target \$(T) -p ring\n" | make -s -f - ring-for T=$t
  echo "ring built for $t"
done
echo "fresh-machine: ok"
'
