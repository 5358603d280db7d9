#!/usr/bin/env bash
# Builds one package from release binaries that already exist (make builds
# them: `make deb ARCH=arm64`).
#
#   package.sh deb|rpm device|fleetctl ARCH
#
# ARCH is amd64, arm64 or armhf. Environment:
#   VERSION     package version (default: the workspace version in Cargo.toml)
#   BIN_DIR     release binaries (default: target/<rust triple>/release; the
#               device package of amd64 and arm64 takes the static musl ones)
#   OUT_DIR     where the package goes (default: target/packages)
#   MAINTAINER  the Maintainer / Packager field
#   MAN_DIR     the man pages scripts/man.sh wrote (default target/man)
#
# Packages: harmony-fleet (device: updater, bootstrap agent, units, setup)
# and harmony-fleetctl (operator CLI; never on a device).
set -euo pipefail
cd "$(dirname "$0")/.."

format=${1:?usage: package.sh deb|rpm device|fleetctl ARCH}
role=${2:?usage: package.sh deb|rpm device|fleetctl ARCH}
arch=${3:?usage: package.sh deb|rpm device|fleetctl ARCH}

case $arch in
amd64) triple=x86_64-unknown-linux-gnu device_triple=x86_64-unknown-linux-musl rpm_arch=x86_64 ;;
arm64) triple=aarch64-unknown-linux-gnu device_triple=aarch64-unknown-linux-musl rpm_arch=aarch64 ;;
armhf) triple=armv7-unknown-linux-gnueabihf device_triple=$triple rpm_arch=armv7hl ;;
*) echo "package.sh: ARCH must be amd64, arm64 or armhf (got $arch)" >&2; exit 2 ;;
esac

workspace_version() {
	awk '/^\[workspace.package\]/ { p = 1; next } /^\[/ { p = 0 } p && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml
}
version=${VERSION:-$(workspace_version)}
[[ $version =~ ^[0-9][0-9A-Za-z.+~]*$ ]] || { echo "package.sh: bad version '$version'" >&2; exit 2; }
[[ $role == device ]] && triple=$device_triple
bin_dir=${BIN_DIR:-target/$triple/release}
out_dir=${OUT_DIR:-target/packages}
maintainer=${MAINTAINER:-NationTech Harmony fleet <harmony-fleet@nationtech.io>}
mkdir -p "$out_dir"

case $role in
device)
	package=harmony-fleet
	summary="Harmony fleet device agent and crash-safe updater"
	description="The fleet agent reconciles Podman workloads from NATS JetStream desired
state as the unprivileged user fleet-agent (rootless Podman); the root
updater replaces the agent binary through a durable transaction with
rollback. Installing runs device setup: users, directories, the bootstrap
agent as a versioned binary, the active link (never moved from a working
agent), and the two systemd services."
	recommends="podman, uidmap, slirp4netns, dbus-user-session"
	;;
fleetctl)
	package=harmony-fleetctl
	summary="Harmony fleet operator CLI"
	description="fleetctl writes desired workloads and per-device agent upgrade attempts
to NATS, rolls a release out over a fleet and shows fleet status. It
belongs on an operator's machine, not on a device."
	recommends=""
	;;
*) echo "package.sh: role must be device or fleetctl (got $role)" >&2; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/root
case $role in
device) scripts/stage.sh device "$stage" "$bin_dir" ;;
fleetctl) scripts/stage.sh fleetctl "$stage" "$bin_dir" /usr ;;
esac

# Debian dependencies of the binaries: the shared libraries they load (any
# other is an error here, to be mapped) and the newest glibc symbol version.
# Static binaries (the musl device daemons of amd64 and arm64) load none.
elf_files=$(find "$stage" -type f -perm -0100 -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
# The device daemons of amd64 and arm64 ship static (Makefile DEVICE_TRIPLE):
# refuse a dynamic build handed in by mistake.
if [[ $role == device && $arch != armhf ]]; then
	for f in $elf_files; do
		if readelf -lW "$f" | grep -q 'Requesting program interpreter' || readelf -d "$f" | grep -q '(NEEDED)'; then
			echo "package.sh: ${f#"$stage"} is dynamically linked; the $arch device package ships static musl builds (make device-packages ARCH=$arch)" >&2
			exit 1
		fi
	done
fi
glibc=$(grep -aoh 'GLIBC_2\.[0-9][0-9.]*' $elf_files | sort -uV | tail -n1 || true)
glibc=${glibc#GLIBC_}
lib_depends=""
for lib in $(readelf -d $elf_files | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u); do
	case $lib in
	libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | ld-linux*) ;;
	libgcc_s.so.1) lib_depends+=", libgcc-s1" ;;
	*) echo "package.sh: the binaries need $lib: add its Debian package to scripts/package.sh" >&2; exit 1 ;;
	esac
done

# The Debian changelog of $package (packaging/changelog, kept for
# harmony-fleet, renamed); a $version it has no entry for (a test or
# development build) gets one on top, dated like the last commit.
deb_changelog() {
	local top
	top=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' packaging/changelog)
	if [[ $top != "$version" ]]; then
		printf '%s (%s) unstable; urgency=medium\n\n  * Development build of %s.\n\n -- %s  %s\n\n' \
			"$package" "$version" "$version" "$maintainer" \
			"$(date -u -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}")"
	fi
	sed "s/^harmony-fleet (/$package (/" packaging/changelog
}

# The same as rpm's %changelog: "* DAY MON DD YYYY NAME <EMAIL> - VERSION-1",
# then "- " items.
rpm_changelog() {
	deb_changelog | awk '
		/^[^ ].*\(.*\)/ { v = $2; gsub(/[()]/, "", v); n = 0; next }
		/^  \* / { sub(/^  \* /, "- "); items[++n] = $0; next }
		/^    / { sub(/^    /, "  "); items[++n] = $0; next }
		/^ -- / {
			line = $0; sub(/^ -- /, "", line)
			split(line, parts, "  ")
			cmd = "date -u -d \"" parts[2] "\" \"+%a %b %d %Y\""
			cmd | getline day; close(cmd)
			if (out++) print ""
			print "* " day " " parts[1] " - " v "-1"
			for (i = 1; i <= n; i++) print items[i]
		}'
}

build_deb() {
	local deb_arch=$arch depends=""
	[[ -n $glibc ]] && depends="libc6 (>= $glibc)$lib_depends"
	[[ -z $glibc && -n $lib_depends ]] && { echo "package.sh: shared libraries but no glibc symbol version" >&2; exit 1; }
	[[ $role == device ]] && depends+="${depends:+, }systemd (>= 247)"
	[[ -n $depends ]] || { echo "package.sh: $package would depend on nothing" >&2; exit 1; }
	# A native package (no Debian revision): changelog.gz, and the lintian
	# overrides of packaging/deb (a reason each) for this architecture.
	local doc=$stage/usr/share/doc/$package
	deb_changelog | gzip -9n >"$doc/changelog.gz"
	chmod 0644 "$doc/changelog.gz"
	local overrides=packaging/deb/$package.lintian-overrides
	if [[ -f $overrides ]]; then
		# "[ARCH,...] " lines apply to those architectures only.
		# An override keeps the comment above it: lintian shows it as the
		# reason.
		awk -v arch="$deb_arch" '
			/^#/ { why = why $0 "\n"; next }
			/^[[:space:]]*$/ { why = ""; next }
			/^\[/ { split(substr($1, 2, length($1) - 2), a, ","); ok = 0
				for (i in a) if (a[i] == arch) ok = 1
				if (!ok) { why = ""; next }; sub(/^\[[^]]*\] /, "") }
			{ printf "%s%s\n", why, $0; why = "" }' "$overrides" >"$work/overrides"
		if [[ -s $work/overrides ]]; then
			install -D -m 0644 "$work/overrides" "$stage/usr/share/lintian/overrides/$package"
		fi
	fi
	mkdir -p "$stage/DEBIAN"
	local size
	size=$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)
	{
		while IFS= read -r line; do
			case $line in
			*@DESCRIPTION@*) sed 's/^$/./; s/^/ /' <<<"$description" ;;
			"Recommends: @RECOMMENDS@") [[ -n $recommends ]] && echo "Recommends: $recommends" ;;
			*)
				line=${line//@PACKAGE@/$package}
				line=${line//@VERSION@/$version}
				line=${line//@DEB_ARCH@/$deb_arch}
				line=${line//@MAINTAINER@/$maintainer}
				line=${line//@INSTALLED_SIZE@/$size}
				line=${line//@DEPENDS@/$depends}
				line=${line//@SUMMARY@/$summary}
				echo "$line"
				;;
			esac
		done <packaging/deb/control.in
	} >"$stage/DEBIAN/control"
	if [[ $role == device ]]; then
		install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$stage/DEBIAN/"
	fi
	(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
		xargs -0r md5sum) >"$stage/DEBIAN/md5sums"
	local out=$out_dir/${package}_${version}_${deb_arch}.deb
	dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >/dev/null
	echo "$out"
}

build_rpm() {
	local top=$work/rpmbuild
	mkdir -p "$top"/{BUILD,RPMS,SRPMS,SPECS,SOURCES,BUILDROOT}
	local spec=$top/SPECS/$package.spec
	{
		echo "%global fleet_stage $stage"
		echo "%global fleet_version $version"
		echo "%global fleet_packager $maintainer"
		cat "packaging/rpm/$package.spec"
	} >"$spec"
	# The description may not go through a macro (multi-line); write it.
	local desc=$work/description
	printf '%s\n' "$description" >"$desc"
	local changelog=$work/changelog
	rpm_changelog >"$changelog"
	rpmbuild --quiet -bb --target "$rpm_arch-linux" \
		--define "_topdir $top" \
		--define "fleet_summary $summary" \
		--define "fleet_description_file $desc" \
		--define "fleet_changelog_file $changelog" \
		"$spec" >&2
	local built
	built=$(find "$top/RPMS" -name '*.rpm' -print -quit)
	[[ -n $built ]] || { echo "package.sh: rpmbuild produced no package" >&2; exit 1; }
	local out=$out_dir/$(basename "$built")
	mv -f "$built" "$out"
	echo "$out"
}

case $format in
deb) build_deb ;;
rpm) build_rpm ;;
*) echo "package.sh: format must be deb or rpm (got $format)" >&2; exit 2 ;;
esac
