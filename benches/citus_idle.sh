#!/usr/bin/env bash
# What idle instances cost a Citus cluster's workers: transactions a second on the workers
# (pg_stat_database, summed over both) while N instances of rush-meter run with no traffic,
# less what the cluster does by itself meanwhile (Citus's maintenance daemon: deadlock
# detection, two-phase commit recovery), measured first for as long with none running.
# Needs a cluster from ../shared/citus/cluster.sh (coordinator on PORT, workers on PORT+1
# and PORT+2) and a built binary; the database is distributed with 32 shards, as in
# production.
#
#   [RAMP=240] benches/citus_idle.sh [instances] [seconds] [port] [binary]
#       defaults: 1 instance, 300 s, 5441, target/release/rush-meter
#
# Prints two lines: the cluster alone, then the instances, each with its worker
# transactions and their rate, and the rate an instance adds.
set -euo pipefail
cd "$(dirname "$0")/.."
instances="${1:-1}"
secs="${2:-300}"
port="${3:-5441}"
bin="${4:-target/release/rush-meter}"
name="rm_idle_$$"
q() { psql -X -q -At -h 127.0.0.1 -p "$1" -U postgres -d "$2" -c "$3"; }
for p in "$port" $((port + 1)) $((port + 2)); do
  q "$p" postgres "CREATE DATABASE $name"
  q "$p" "$name" "CREATE EXTENSION citus" >/dev/null
done
q "$port" "$name" "SELECT citus_set_coordinator_host('127.0.0.1', $port)" >/dev/null
q "$port" "$name" "SELECT citus_add_node('127.0.0.1', $((port + 1)))" >/dev/null
q "$port" "$name" "SELECT citus_add_node('127.0.0.1', $((port + 2)))" >/dev/null
url="postgres://postgres@127.0.0.1:$port/$name"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for p in "$port" $((port + 1)) $((port + 2)); do
    q "$p" postgres "DROP DATABASE IF EXISTS $name WITH (FORCE)" || true
  done
}
trap cleanup EXIT
RUSH_METER_DATABASE_URL="$url" "$bin" migrate >/dev/null
psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$name" -v ON_ERROR_STOP=1 \
  -c "SET citus.shard_count = 32" -f migrations/citus/distribute.sql >/dev/null
worker_xacts() {
  local n=0
  for p in $((port + 1)) $((port + 2)); do
    n=$((n + $(q "$p" postgres "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$name'")))
  done
  echo "$n"
}
before=$(worker_xacts)
sleep "$secs"
alone=$(($(worker_xacts) - before))
for i in $(seq 1 "$instances"); do
  RUSH_METER_DATABASE_URL="$url" RUSH_METER_LISTEN="127.0.0.1:$((18080 + i))" \
    RUST_LOG=warn "$bin" serve >/dev/null 2>&1 &
  pids+=($!)
done
# Start-up is not idling, nor are the jobs' first looks: each doubles its wait while it
# finds nothing, reaching its longest (RUSH_METER_JOBS_IDLE_SECS, 120 s) within RAMP.
sleep "${RAMP:-240}"
before=$(worker_xacts)
sleep "$secs"
with=$(($(worker_xacts) - before))
awk -v i="$instances" -v s="$secs" -v a="$alone" -v n="$with" 'BEGIN {
  printf "the cluster alone, %d s: %d worker transactions, %.2f a second\n", s, a, a / s
  printf "%d idle instance(s), %d s: %d worker transactions, %.2f a second; %.2f a second an instance\n", i, s, n, n / s, (n - a) / s / i
}'
