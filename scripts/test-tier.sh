#!/usr/bin/env bash
# Runs one tier of the tests (docs/development/testing.md "The tiers"):
#   scripts/test-tier.sh NAME LOG_DIR COMMAND... [+++ COMMAND...]
# Each COMMAND (a `cargo test` line) runs in turn, all of them even when one
# fails; their output goes to the terminal and to LOG_DIR/NAME.log. The tier
# fails when a command fails or when, all together, they ran no test (a
# filter that matches nothing must not pass as green).
#   scripts/test-tier.sh --times LOG_DIR
# prints the time each suite took, from every tier's log in LOG_DIR, longest
# first.
set -uo pipefail
cd "$(dirname "$0")/.."

# The file a suite's binary was built from: `tests/health.rs` is named by
# the crate that holds it; a crate's unit tests by the crate.
suite_name() {
    local running=$1 binary=$2
    case $running in
    unittests*)
        echo "${binary%-*} (unit)"
        ;;
    tests/*)
        local matches
        matches=$(ls -d ./*/"$running" ./tests/*/"$running" 2>/dev/null | sed 's|^\./||')
        if [ "$(echo "$matches" | wc -l)" = 1 ] && [ -n "$matches" ]; then
            echo "$matches"
        else
            echo "$running"
        fi
        ;;
    *)
        echo "$running"
        ;;
    esac
}

times() {
    local dir=$1
    local rows
    rows=$(for log in "$dir"/*.log; do
        [ -f "$log" ] || continue
        local tier suite="" running binary
        tier=$(basename "$log" .log)
        while IFS= read -r line; do
            case $line in
            *"     Running "*)
                running=$(sed -E 's/^ *Running ([^(]*[^ (]) \(.*/\1/' <<<"$line")
                binary=$(sed -E 's|.*/deps/([^)]*)\)$|\1|' <<<"$line")
                suite=$(suite_name "$running" "$binary")
                ;;
            *"   Doc-tests "*)
                suite="$(sed -E 's/^ *Doc-tests //' <<<"$line") (doc)"
                ;;
            "test result: "*)
                if [ -n "$suite" ]; then
                    local passed failed secs
                    passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")
                    failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
                    secs=$(sed -E 's/.*finished in ([0-9.]+)s.*/\1/' <<<"$line")
                    if [ "$passed" != 0 ] || [ "$failed" != 0 ]; then
                        printf '%s\t%s\t%s\t%s\t%s\n' "$secs" "$tier" "$suite" "$passed" "$failed"
                    fi
                    suite=""
                fi
                ;;
            esac
        done <"$log"
    done | sort -t$'\t' -k1,1 -g -r)
    echo
    echo "Time each suite took (from $dir):"
    echo
    printf '| %-8s | %-11s | %-52s | %6s | %6s |\n' seconds tier suite passed failed
    printf '|----------|-------------|------------------------------------------------------|--------|--------|\n'
    local total=0 count=0
    while IFS=$'\t' read -r secs tier suite passed failed; do
        [ -n "$secs" ] || continue
        printf '| %8.1f | %-11s | %-52s | %6s | %6s |\n' "$secs" "$tier" "$suite" "$passed" "$failed"
        total=$(awk -v a="$total" -v b="$secs" 'BEGIN { print a + b }')
        count=$((count + 1))
    done <<<"$rows"
    printf '\n%d suites, %.0f s of test time (builds not included).\n' "$count" "$total"
}

if [ "${1:-}" = --times ]; then
    times "$2"
    exit 0
fi

name=$1 dir=$2
shift 2
mkdir -p "$dir"
log="$dir/$name.log"
: >"$log"
status=0
cmd=()
run() {
    [ ${#cmd[@]} -gt 0 ] || return 0
    echo "== $name: ${cmd[*]}" | tee -a "$log"
    "${cmd[@]}" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || status=$rc
    cmd=()
}
for arg in "$@"; do
    if [ "$arg" = +++ ]; then
        run
    else
        cmd+=("$arg")
    fi
done
run

ran=$(grep -E '^test result: ' "$log" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/' |
    awk '{ n += $1 + $2 } END { print n + 0 }')
if [ "$ran" = 0 ]; then
    echo "$name: no test ran: the tier's filters match nothing (see $log)" >&2
    exit 1
fi
echo "$name: $ran tests ran, log in $log"
exit "$status"
