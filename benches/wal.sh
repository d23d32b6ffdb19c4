#!/bin/bash
# WAL a heartbeat and an admission write on one PostgreSQL (reports/citus-notes.md, "How far
# it goes"): the release server on a fresh database of the local PostgreSQL, 100 Team orgs
# and 1000 keys, then 8 s of requests of 100 heartbeats and 8 s of admissions at 32
# callers (wrk, the scripts of benches/wrk), with pg_current_wal_lsn read around each.
#   cargo build --release --bin rush-meter && benches/wal.sh [postgres://…:5432]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-postgres://postgres@127.0.0.1:5432}
db=rm_wal_$$
port=8098
token=wal-admin-token-0123456789
sql() { psql -X -At "$base/postgres" -c "$1"; }
sql "CREATE DATABASE $db" >/dev/null
RUSH_METER_RATE_LIMIT_PER_SEC=0 RUSH_METER_BOOTSTRAP_ADMIN_TOKEN=$token \
  RUSH_METER_LISTEN=127.0.0.1:$port target/release/rush-meter --database-url "$base/$db" serve \
  >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null' EXIT
until curl -sf "localhost:$port/readyz" >/dev/null; do sleep 0.2; done
put() { curl -sf -XPUT -H "Authorization: Bearer $token" -H 'content-type: application/json' "localhost:$port$1" -d "$2" >/dev/null; }
for o in $(seq 0 99); do put "/v1/orgs/org_$o" '{"plan":"team"}'; done
for k in $(seq 0 999); do put "/v1/orgs/org_$((k % 100))/keys/k$k" '{"concurrency_limit":100}'; done
# Each measured run: WAL bytes over items (requests × items a request).
measure() {
  local what=$1 route=$2 script=$3 per=$4; shift 4
  local a b out n
  a=$(sql "SELECT pg_current_wal_lsn()")
  out=$(wrk -t2 -c32 -d8s -s "benches/wrk/$script" "http://127.0.0.1:$port/v1/$route" -- "$@" $token)
  b=$(sql "SELECT pg_current_wal_lsn()")
  if grep -q 'Non-2xx' <<<"$out"; then echo "$what: some requests failed" >&2; exit 1; fi
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  local bytes
  bytes=$(sql "SELECT pg_wal_lsn_diff('$b', '$a')")
  echo "$what: $((n * per)) in $n requests, $bytes bytes of WAL, $((bytes / (n * per))) bytes each"
}
# No warm-up: wrk numbers each run's heartbeats from seq 1 again, so a second run would be
# duplicates. The first lap makes the 8,000 sessions, a few percent of the heartbeats.
measure heartbeats heartbeats heartbeats.lua 100 100 4000 100
measure admissions admissions admissions.lua 1 1000 100
