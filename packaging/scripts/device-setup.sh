#!/bin/sh
# Device setup, shell stand-in for `fleet-updater setup` (which replaces it):
# run by the package's postinst / %post, idempotent.
#
#   device-setup.sh AGENT_BINARY
#
# 1. refuses while the updater journal holds a non-terminal transaction;
# 2. users and groups (sysusers.d), directories (tmpfiles.d);
# 3. subordinate uid/gid ranges for fleet-agent when it has none, lingering;
# 4. AGENT_BINARY installed as /usr/lib/harmony-fleet/fleet-agent-v<version>
#    (its own `--version`), never garbage-collected, owned by no package;
# 5. the active link /usr/local/bin/fleet-agent created only when absent or
#    dangling: a link to a working agent (one the updater installed later,
#    say) is never moved;
# 6. the agent's drop-ins: its user manager (rootless Podman), restart
#    backoff where systemd is 254 or newer;
# 7. with systemd running: daemon-reload, enable both units, (re)start the
#    updater, start the agent when its config exists.
set -eu

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

bootstrap=${1:?usage: device-setup.sh AGENT_BINARY}
versions=/usr/lib/harmony-fleet
link=/usr/local/bin/fleet-agent
journal=/var/lib/harmony-fleet/updater/journal.json
config=/etc/harmony-fleet/agent.json
dropin_dir=/etc/systemd/system/fleet-agent.service.d
user=fleet-agent
# Subordinate ids: 65536 per user, above every range already given out.
subid_count=65536
subid_floor=100000

say() { echo "harmony-fleet: $*"; }
die() { echo "harmony-fleet: $*" >&2; exit 1; }

# 1. The journal's current transaction, if any (`"transaction": {"phase": ..`,
# phase is its first field). Terminal phases: committed, failed,
# rollback-failed.
if [ -f "$journal" ]; then
	phase=$(tr -d '\n' <"$journal" |
		sed -n 's/.*"transaction"[[:space:]]*:[[:space:]]*{[[:space:]]*"phase"[[:space:]]*:[[:space:]]*"\([a-z-]*\)".*/\1/p')
	case "$phase" in
	"" | committed | failed) ;;
	rollback-failed)
		die "the updater is quarantined (rollback-failed): repair the device first (/usr/share/doc/harmony-fleet/REPAIR.md), then run this again" ;;
	*)
		die "an agent upgrade is in progress (phase $phase in $journal): device setup during a transaction is unsupported; wait until 'fleet-updater status' shows it finished, then run this again" ;;
	esac
fi

# 2. Users, groups, directories.
systemd-sysusers /usr/lib/sysusers.d/harmony-fleet.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/harmony-fleet.conf

# 3. Subordinate ids for rootless Podman (systemd-sysusers gives none).
uid=$(id -u "$user")
for f in /etc/subuid /etc/subgid; do
	[ -f "$f" ] || : >"$f"
	grep -Eq "^($user|$uid):" "$f" && continue
	start=$(cat /etc/subuid /etc/subgid 2>/dev/null |
		awk -F: -v floor="$subid_floor" 'BEGIN { m = floor } NF >= 3 && $3 > 0 { e = $2 + $3; if (e > m) m = e } END { print m }')
	echo "$user:$start:$subid_count" >>"$f"
	say "gave $user subordinate ids $start-$((start + subid_count - 1)) in $f"
done

# 4. The bootstrap agent as a versioned binary.
[ -x "$bootstrap" ] || die "agent binary $bootstrap is missing or not executable"
version=$("$bootstrap" --version | sed -n 's/^fleet-agent \(.*\)$/\1/p')
echo "$version" | grep -Eq '^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$' ||
	die "$bootstrap --version did not print 'fleet-agent <version>' with a valid version (got '$version')"
target=$versions/fleet-agent-v$version
if ! cmp -s "$bootstrap" "$target"; then
	tmp=$versions/.fleet-agent-v$version.setup-$$
	cp "$bootstrap" "$tmp"
	chown root:root "$tmp"
	chmod 0755 "$tmp"
	sync "$tmp"
	mv -f "$tmp" "$target"
	sync "$versions"
	say "installed agent $version as $target"
fi

# 5. The active link, only when absent or dangling.
if [ -L "$link" ] && [ -e "$link" ]; then
	say "active agent kept: $link -> $(readlink "$link")"
elif [ -e "$link" ]; then
	say "warning: $link is not a symlink; left as it is (the updater cannot switch it)"
else
	mkdir -p "$(dirname "$link")"
	ln -s "$target" "$link.setup-$$"
	mv -T "$link.setup-$$" "$link"
	sync "$(dirname "$link")"
	say "active agent: $link -> $target"
fi

# 6. The agent's user manager: rootless Podman's scopes live there.
mkdir -p "$dropin_dir"
cat >"$dropin_dir/50-rootless-podman.conf.tmp" <<EOF
# Written by device setup: the lingering user manager of $user (uid $uid)
# holds rootless Podman's containers, so they outlive fleet-agent.service.
[Unit]
Wants=user@$uid.service
After=user@$uid.service

[Service]
Environment=XDG_RUNTIME_DIR=/run/user/$uid
EOF
mv -f "$dropin_dir/50-rootless-podman.conf.tmp" "$dropin_dir/50-rootless-podman.conf"

# Restart backoff where systemd has it (254 and newer; 252 would warn about
# unknown keys at every reload): 5 s doubling up to 5 min.
systemd_version=$(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p')
if [ "${systemd_version:-0}" -ge 254 ]; then
	cat >"$dropin_dir/60-restart-backoff.conf.tmp" <<EOF
# Written by device setup (systemd $systemd_version): back off a failing agent.
[Service]
RestartSteps=6
RestartMaxDelaySec=5min
EOF
	mv -f "$dropin_dir/60-restart-backoff.conf.tmp" "$dropin_dir/60-restart-backoff.conf"
else
	rm -f "$dropin_dir/60-restart-backoff.conf"
fi

# 7. systemd.
systemctl enable fleet-updater.service fleet-agent.service >/dev/null 2>&1 ||
	die "systemctl enable fleet-updater.service fleet-agent.service failed"
if [ ! -d /run/systemd/system ]; then
	say "systemd is not running here: the units start at the next boot"
	exit 0
fi
systemctl daemon-reload
loginctl enable-linger "$user" 2>/dev/null || systemctl start "user@$uid.service" ||
	say "warning: cannot start the user manager of $user yet; it starts at the next boot"
systemctl restart fleet-updater.service ||
	die "fleet-updater.service did not start: see journalctl -u fleet-updater.service"
if [ -f "$config" ]; then
	# Not waiting for READY: the agent may need minutes to reach NATS.
	systemctl start --no-block fleet-agent.service
	say "fleet-agent.service started"
else
	say "fleet-agent.service is enabled and waits for its config: write $config (root:fleet-agent, 0640; see /usr/share/doc/harmony-fleet/README.md), then run 'systemctl start fleet-agent.service'"
fi
