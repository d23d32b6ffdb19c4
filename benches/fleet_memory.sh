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
db="rm_bench_fleet_memory"
port=18096
serve_flags=("$@")
server_log=$(mktemp)
# shellcheck source=benches/fleet_server.sh
source benches/fleet_server.sh
trap 'kill $server 2>/dev/null; rm -f "$server_log"; psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true' EXIT
memory() {
  echo "$1: RSS $(( $(ps -o rss= -p "$server") / 1024 )) MiB, peak $(( $(awk '/VmHWM/ {print $2}' "/proc/$server/status") / 1024 )) MiB, open descriptors $(ls "/proc/$server/fd" | wc -l), 'Too many open files' logged $(grep -c 'Too many open files' "$server_log" || true)"
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
