#!/usr/bin/env bash
# Whether the server's memory under a fleet it cannot keep up with is held, freed or
# grown: two fleet runs back to back against one release instance, its RSS and peak
# (VmHWM) after each run and after 30 s idle, and how often it ran out of descriptors.
# Prints; the reading is in reports/fleet.md.
#
#   benches/fleet_memory.sh [SESSIONS] [SECONDS] [-- serve flags…]   (defaults: 40000, 60)
set -euo pipefail
cd "$(dirname "$0")/.."
sessions="${1:-40000}"
secs="${2:-60}"
shift $(( $# < 2 ? $# : 2 ))
[ "${1:-}" = "--" ] && shift
orgs=$((sessions / 4))
hosts=$((sessions / 50))
pg="${RUSH_METER_TEST_PG:-postgres://postgres@127.0.0.1:5432}"
db="rm_bench_fleet_memory"
token="fleet-bench-token-0123456789"
port=18096
log=$(mktemp)

cargo build --release --quiet
psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
export RUSH_METER_HEARTBEAT_INTERVAL_SECS=2 RUSH_METER_LEASE_SECS=6
RUST_LOG=warn target/release/rush-meter serve --database-url "$pg/$db" \
  --listen "127.0.0.1:$port" --bootstrap-admin-token "$token" --rate-limit-per-sec 0 \
  --period-settle-secs 0 "$@" 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$log"; psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true' EXIT
until curl -fs "127.0.0.1:$port/readyz" >/dev/null; do sleep 0.2; done
memory() {
  echo "$1: RSS $(( $(ps -o rss= -p "$server") / 1024 )) MiB, peak $(( $(awk '/VmHWM/ {print $2}' "/proc/$server/status") / 1024 )) MiB, open descriptors $(ls "/proc/$server/fd" | wc -l), 'Too many open files' logged $(grep -c 'Too many open files' "$log" || true)"
}
memory "idle, before"
for run in 1 2; do
  target/release/rush-meter simulate --url "http://127.0.0.1:$port" --token "$token" \
    --orgs "$orgs" --sessions "$sessions" --hosts "$hosts" --duration-secs "$secs" \
    --run "fleet$run" 2>&1 | grep -E "^total|acknowledged|latency" || true
  memory "after run $run"
  sleep 30 # idle on purpose: what the server gives back once the load stops
  memory "30 s idle after run $run"
done
