#!/usr/bin/env bash
# A fleet against one release instance on the machine's PostgreSQL: `rush-meter simulate`
# as the load generator, its reconciliation as the check. Writes reports/fleet.md.
#
#   benches/fleet.sh [SESSIONS] [SECONDS]    (defaults: 4000 session slots, 60 s; SESSIONS/4 orgs)
#
# The server beats at a 2 s interval (lease 6 s) so that a minute's run carries a busy
# fleet's load; the figures scale to the default 15 s interval as sessions x 7.5.
set -euo pipefail
cd "$(dirname "$0")/.."
sessions="${1:-4000}"
secs="${2:-60}"
db="rm_bench_fleet"
# shellcheck source=benches/fleet_server.sh
source benches/fleet_server.sh

cmd="rush-meter simulate --orgs $orgs --sessions $sessions --hosts $hosts --duration-secs $secs --heartbeat-interval-secs 2 --lease-secs 6"
out=$(/usr/bin/time -f "simulator peak RSS %M KiB, CPU %P" target/release/rush-meter simulate \
  --url "http://127.0.0.1:$port" --token "$token" --orgs "$orgs" --sessions "$sessions" \
  --hosts "$hosts" --duration-secs "$secs" --run fleet 2>&1)
server_rss=$(ps -o rss= -p "$server" | tr -d ' ')
echo "$out"

{
  echo "# A fleet against one instance"
  echo
  echo "- Command: \`benches/fleet.sh $sessions $secs\`, which runs \`$cmd\`"
  echo "  against \`rush-meter serve\` (release, PostgreSQL $(psql "$pg/postgres" -Atc 'SHOW server_version' | cut -d' ' -f1), interval 2 s, lease 6 s, no rate limit)"
  echo "- Machine: $(nproc) cores (server, PostgreSQL and simulator share them), $(date -u +%Y-%m-%d)"
  echo "- Server RSS at the end: $((server_rss / 1024)) MiB"
  rate=$(echo "$out" | sed -n 's/.* batches (\([0-9]*\)\/s).*/\1/p')
  echo "- $rate heartbeats/s acknowledged: at the default 15 s interval, the load of about $((rate * 15)) running sessions"
  echo
  echo "What the fleet did, and the bill reconciled per org (\`unexplained\` and \`mismatched\` must be 0; the"
  echo "first 10 of $orgs orgs, then the total):"
  echo
  echo '```'
  echo "$out" | awk 'NR <= 11 || /^total/ || !/^fleet-org/ { print } NR == 12 { print "…" }'
  echo '```'
} > reports/fleet.md
