#!/usr/bin/env bash
# `make demo`: one Harmony fleet device on this machine.
#
# Starts a local nats-server with the fleet's two-account layout (written by
# `fleetctl nats-config`) and its buckets, builds a small local
# image (busybox httpd), runs fleet-agent as device "dev1" with its own
# Podman storage, applies a sample workload with `fleetctl workload apply`,
# shows it running and its status read back from NATS, and on Ctrl-C stops
# the agent (which drains and reports) and removes everything it made.
#
# Nothing outside a temp dir is touched: Podman runs with its own --root.
# Override the published HTTP port with FLEET_DEMO_HTTP_PORT (default 8080).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=target/debug
HTTP_PORT=${FLEET_DEMO_HTTP_PORT:-8080}
DEVICE=dev1
WAIT_SECS=60

say() { printf '\n\033[1mdemo: %s\033[0m\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

NATS_SERVER=$(command -v nats-server || true)
[[ -n $NATS_SERVER ]] || NATS_SERVER=/usr/sbin/nats-server
for tool in "$NATS_SERVER" podman runc /bin/busybox curl setsid; do
  command -v "$tool" >/dev/null 2>&1 || die "missing $tool: run \`make deps\` first"
done
[[ -x $BIN/fleet-agent && -x $BIN/fleetctl ]] || die "missing binaries: run \`make build\` first"

WORK=$(mktemp -d /tmp/fleet-demo.XXXXXX)
AGENT_PID=
NATS_PID=
TAIL_PID=

pod() {
  CONTAINERS_CONF=$WORK/containers.conf podman \
    --root "$WORK/podman/root" --runroot "$WORK/podman/run" --tmpdir "$WORK/podman/tmp" "$@"
}
ctl() { "$BIN/fleetctl" "$@" --server "$NATS_URL" --password-file "$WORK/admin-password"; }

cleanup() {
  set +e
  trap - EXIT INT TERM
  [[ -n $TAIL_PID ]] && kill "$TAIL_PID" 2>/dev/null
  if [[ -n $AGENT_PID ]] && kill -0 "$AGENT_PID" 2>/dev/null; then
    say "stopping the agent (SIGTERM: it drains, reports \"stopping\", exits)"
    kill -TERM "$AGENT_PID"
    for _ in $(seq 600); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
    tail -n 4 "$WORK/agent.log"
    [[ -n ${NATS_URL:-} ]] && ctl device status "$DEVICE"
  fi
  if [[ -n $NATS_PID ]]; then kill -TERM "$NATS_PID" 2>/dev/null; wait "$NATS_PID" 2>/dev/null; fi
  if [[ -d $WORK/podman ]]; then
    pod rm --all --force --time 0 >/dev/null 2>&1
    pod rmi --all --force >/dev/null 2>&1
  fi
  rm -rf "$WORK"
  say "cleaned up"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "work dir $WORK"
# A free client port for nats-server, from 4222 up.
PORT=
for p in $(seq 4222 4321); do
  (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { PORT=$p; break; }
done
[[ -n $PORT ]] || die "no free port in 4222-4321"
NATS_URL=nats://127.0.0.1:$PORT
mkdir -p "$WORK/passwords"
printf '%s\n' "$DEVICE" >"$WORK/devices"
printf '%s\n' demo-admin-pw >"$WORK/admin-password"
chmod 600 "$WORK/admin-password"

say "starting nats-server ($("$NATS_SERVER" --version)) with the fleet layout (fleetctl nats-config)"
"$BIN/fleetctl" nats-config --devices "$WORK/devices" --passwords-dir "$WORK/passwords" \
  --admin-password-file "$WORK/admin-password" --listen "127.0.0.1:$PORT" \
  --store-dir "$WORK/nats" --output "$WORK/nats.conf"
setsid "$NATS_SERVER" -c "$WORK/nats.conf" >"$WORK/nats.log" 2>&1 &
NATS_PID=$!
for _ in $(seq $((WAIT_SECS * 10))); do
  grep -qs 'Server is ready' "$WORK/nats.log" && break
  kill -0 "$NATS_PID" 2>/dev/null || { cat "$WORK/nats.log"; die "nats-server exited"; }
  sleep 0.1
done
grep -qs 'Server is ready' "$WORK/nats.log" || { cat "$WORK/nats.log"; die "nats-server is not ready"; }
ctl buckets create

say "building the image localhost/demo/hello:1 (busybox httpd)"
mkdir -p "$WORK/podman"/{root,run,tmp} "$WORK/image/rootfs/bin" "$WORK/image/rootfs/www"
cp scripts/demo-containers.conf "$WORK/containers.conf"
cp /bin/busybox "$WORK/image/rootfs/bin/"
for applet in sh httpd sleep; do ln -s busybox "$WORK/image/rootfs/bin/$applet"; done
echo '<h1>Hello from a Harmony fleet workload</h1>' >"$WORK/image/rootfs/www/index.html"
cat >"$WORK/image/Containerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
CMD ["/bin/httpd", "-f", "-p", "8080", "-h", "/www"]
EOF
pod build --quiet --tag localhost/demo/hello:1 "$WORK/image" >/dev/null

say "starting fleet-agent as device $DEVICE"
mkdir -p "$WORK/device"
cat >"$WORK/agent.json" <<EOF
{
  "device-id": "$DEVICE",
  "nats": {
    "servers": ["$NATS_URL"],
    "auth": {"method": "user-password", "user": "$DEVICE", "password-file": "$WORK/passwords/$DEVICE"}
  },
  "podman": {
    "binary": "podman",
    "global-args": ["--root", "$WORK/podman/root", "--runroot", "$WORK/podman/run", "--tmpdir", "$WORK/podman/tmp"],
    "containers-conf": "$WORK/containers.conf"
  },
  "intervals": {"heartbeat-secs": 5, "resync-secs": 5},
  "root": "$WORK/device"
}
EOF
setsid "$BIN/fleet-agent" run --config "$WORK/agent.json" 2>"$WORK/agent.log" &
AGENT_PID=$!
for _ in $(seq $((WAIT_SECS * 10))); do
  grep -qs ' ready: ' "$WORK/agent.log" && break
  kill -0 "$AGENT_PID" 2>/dev/null || { cat "$WORK/agent.log"; AGENT_PID=; die "fleet-agent exited"; }
  sleep 0.1
done
grep ' ready: ' "$WORK/agent.log" || { cat "$WORK/agent.log"; die "fleet-agent is not ready"; }

say "applying the workload \"hello\" (fleetctl workload apply $DEVICE hello hello.json)"
cat >"$WORK/hello.json" <<EOF
{"image": "localhost/demo/hello:1", "ports": [{"host": $HTTP_PORT, "container": 8080}], "pull": "never"}
EOF
cat "$WORK/hello.json"
ctl workload apply "$DEVICE" hello "$WORK/hello.json"

for _ in $(seq $((WAIT_SECS * 2))); do
  ctl device status "$DEVICE" | grep -q 'hello: running' && break
  sleep 0.5
done
say "status read back from NATS (fleetctl device status $DEVICE)"
ctl device status "$DEVICE"
say "the container (podman ps)"
pod ps --format '{{.Names}}  {{.Image}}  {{.Status}}  {{.Labels}}'
say "the workload answering (curl http://127.0.0.1:$HTTP_PORT/)"
curl -fsS "http://127.0.0.1:$HTTP_PORT/" || echo "(no answer on port $HTTP_PORT)"

say "running; press Ctrl-C to stop and clean up. Meanwhile, try:"
echo "  remove the container (the agent restores it):"
echo "    CONTAINERS_CONF=$WORK/containers.conf podman --root $WORK/podman/root --runroot $WORK/podman/run rm -f fleet-hello"
echo "  change the workload (the agent replaces the container):"
echo "    $BIN/fleetctl workload apply $DEVICE hello $WORK/hello.json --server $NATS_URL --password-file $WORK/admin-password"
echo "agent log ($WORK/agent.log):"
tail -n 0 -f "$WORK/agent.log" &
TAIL_PID=$!
wait "$AGENT_PID"
