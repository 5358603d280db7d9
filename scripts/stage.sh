#!/usr/bin/env bash
# Lays out the installed files, for `make install` and for the packages.
#
#   stage.sh device   ROOT BIN_DIR    the device package: fixed paths (docs/design/architecture.md "Paths on a device")
#   stage.sh fleetctl ROOT BIN_DIR PREFIX
#                                     the operator CLI under PREFIX
#   stage.sh list device|fleetctl [PREFIX]
#                                     the files (no directories) the role installs, one a line
#
# ROOT is DESTDIR (empty or / for the live system). BIN_DIR holds the release
# binaries of one architecture. Modes are set here; owners are root in the
# packages (dpkg-deb --root-owner-group, %attr in the spec) and whoever runs
# `make install` otherwise (root, on a device). MAN_DIR holds the man pages
# and fleetctl's bash completion scripts/man.sh wrote (default target/man).
set -euo pipefail
cd "$(dirname "$0")/.."

# path-in-root  mode  source (bin:NAME = BIN_DIR/NAME, link:TARGET = a symlink,
# man:PAGE = MAN_DIR/PAGE gzipped, as Debian policy wants man pages,
# generated:FILE = MAN_DIR/FILE as it is)
device_files() {
	cat <<'EOF'
usr/lib/harmony-fleet/fleet-updater 0755 bin:fleet-updater
usr/sbin/fleet-updater 0777 link:../lib/harmony-fleet/fleet-updater
usr/lib/harmony-fleet/bootstrap/fleet-agent 0755 bin:fleet-agent
usr/lib/systemd/system/fleet-agent.service 0644 packaging/systemd/fleet-agent.service
usr/lib/systemd/system/fleet-updater.service 0644 packaging/systemd/fleet-updater.service
usr/lib/sysusers.d/harmony-fleet.conf 0644 packaging/sysusers.d/harmony-fleet.conf
usr/lib/tmpfiles.d/harmony-fleet.conf 0644 packaging/tmpfiles.d/harmony-fleet.conf
usr/share/doc/harmony-fleet/README.md 0644 packaging/README.md
usr/share/doc/harmony-fleet/REPAIR.md 0644 updater/REPAIR.md
usr/share/doc/harmony-fleet/copyright 0644 packaging/copyright
usr/share/man/man8/fleet-agent.8.gz 0644 man:fleet-agent.8
usr/share/man/man8/fleet-updater.8.gz 0644 man:fleet-updater.8
EOF
}

fleetctl_files() {
	local prefix=${1#/}
	cat <<EOF
$prefix/bin/fleetctl 0755 bin:fleetctl
$prefix/share/doc/harmony-fleetctl/copyright 0644 packaging/copyright
$prefix/share/bash-completion/completions/fleetctl 0644 generated:fleetctl.bash
$prefix/share/harmony-fleet/prometheus/harmony-fleet.rules.yml 0644 packaging/prometheus/harmony-fleet.rules.yml
$prefix/share/harmony-fleet/prometheus/harmony-fleet.dashboard.json 0644 packaging/prometheus/harmony-fleet.dashboard.json
EOF
	# One page per command, as `fleetctl generate man` wrote them; without
	# them the literal name below is missing, and staging says so.
	local page
	for page in "${MAN_DIR:-target/man}"/fleetctl.1 "${MAN_DIR:-target/man}"/fleetctl-*.1; do
		echo "$prefix/share/man/man1/${page##*/}.gz 0644 man:${page##*/}"
	done
}

files_of() {
	case $1 in
	device) device_files ;;
	fleetctl) fleetctl_files "${2:?fleetctl needs PREFIX}" ;;
	*) echo "stage.sh: unknown role $1 (device or fleetctl)" >&2; exit 2 ;;
	esac
}

stage() {
	local role=$1 root=${2:-/} bin_dir=$3 prefix=${4:-}
	root=${root%/}
	local path mode src from man_dir=${MAN_DIR:-target/man}
	while read -r path mode src; do
		case $src in
		link:*)
			mkdir -p "$(dirname "$root/$path")"
			ln -sfn "${src#link:}" "$root/$path"
			continue
			;;
		bin:*)
			from=$bin_dir/${src#bin:}
			[[ -f $from ]] || { echo "stage.sh: missing $from: build the release binaries first (make release ARCH=...)" >&2; exit 1; }
			;;
		man:*)
			from=$man_dir/${src#man:}
			[[ -f $from ]] || { echo "stage.sh: missing $from: generate the man pages first (make man)" >&2; exit 1; }
			mkdir -p "$(dirname "$root/$path")"
			gzip -9nc "$from" >"$root/$path"
			chmod "$mode" "$root/$path"
			continue
			;;
		generated:*)
			from=$man_dir/${src#generated:}
			[[ -f $from ]] || { echo "stage.sh: missing $from: generate it first (make man)" >&2; exit 1; }
			;;
		*) from=$src ;;
		esac
		install -D -m "$mode" "$from" "$root/$path"
	done < <(files_of "$role" "$prefix")
}

case ${1:-} in
device) stage device "${2-}" "${3:?stage.sh device ROOT BIN_DIR}" ;;
fleetctl) stage fleetctl "${2-}" "${3:?}" "${4:?stage.sh fleetctl ROOT BIN_DIR PREFIX}" ;;
list) files_of "${2:?}" "${3:-}" | awk '{ print "/" $1 }' ;;
*) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
