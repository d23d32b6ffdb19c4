# Sourced by benches/fleet.sh and benches/fleet_memory.sh: a release `rush-meter serve` on a
# fresh database of the machine's PostgreSQL, beating at a 2 s interval (lease 6 s), no
# rate limit, stopped and its database dropped on exit. Expects `sessions` and `db`;
# sets `orgs`, `hosts`, `pg`, `token`, `port` and `server`; the server's log goes to
# `$server_log` (default: this shell's standard error) and extra `serve` flags come from
# `serve_flags`.
orgs=$((sessions / 4))
hosts=$((sessions / 50))
pg="${RUSH_METER_TEST_PG:-postgres://postgres@127.0.0.1:5432}"
token="fleet-bench-token-0123456789"
port="${port:-18095}"

cargo build --release --quiet
psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
export RUSH_METER_HEARTBEAT_INTERVAL_SECS=2 RUSH_METER_LEASE_SECS=6
RUST_LOG=warn target/release/rush-meter serve --database-url "$pg/$db" \
  --listen "127.0.0.1:$port" --bootstrap-admin-token "$token" --rate-limit-per-sec 0 \
  --period-settle-secs 0 ${serve_flags[@]+"${serve_flags[@]}"} 2>"${server_log:-/dev/stderr}" &
server=$!
trap 'kill $server 2>/dev/null; psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true' EXIT
until curl -fs "127.0.0.1:$port/readyz" >/dev/null; do sleep 0.2; done
