#!/usr/bin/env bash
# A pg_auto_failover formation on this machine for the failover drill (tests/failover/):
# a monitor and two PostgreSQL 15 nodes with synchronous replication, each node run by its
# own `pg_autoctl run` keeper, everything under one directory and run as the postgres user
# (pg_autoctl refuses root).
#
#   formation.sh up DIR PORT       monitor on PORT, nodes on PORT+1 and PORT+2; waits for
#                                  a primary and a secondary; prints the formation's URI
#   formation.sh primary DIR       the port of the node that is primary now
#   formation.sh kill DIR NODE     kill -9 every process of the node: its keeper, the
#                                  keeper's children and PostgreSQL (a machine lost)
#   formation.sh freeze DIR NODE   stop (SIGSTOP) the standby's WAL receiver: the primary's
#                                  commits wait for it (synchronous replication)
#   formation.sh thaw DIR NODE     let it go on (SIGCONT)
#   formation.sh rejoin DIR NODE   start the node's keeper again: it rejoins as a standby
#   formation.sh wait DIR          until one primary and one secondary again
#   formation.sh switchover DIR    a planned switchover, back to the other node
#   formation.sh down DIR          stop everything and remove DIR
#
# The monitor's timeouts are shorter than its defaults (20 s to call a node unhealthy, 30 s
# for a lost primary to demote itself) so that the drill fits in CI: see `fast_monitor`.
set -euo pipefail

BIN=/usr/lib/postgresql/15/bin
cmd=${1:?usage: formation.sh up|primary|kill|freeze|thaw|rejoin|wait|switchover|down DIR ...}
dir=${2:?the directory of the formation}

as_pg() {
  runuser -u postgres -- env XDG_CONFIG_HOME="$dir/config" XDG_DATA_HOME="$dir/share" \
    XDG_RUNTIME_DIR="$dir/run" PG_CONFIG="$BIN/pg_config" PATH="$BIN:$PATH" "$@"
}

monitor_uri() { cat "$dir/monitor.uri"; }

# The sessions of a node's processes: `setsid` gave its keeper one, which its children
# (the start/stop process that restarts PostgreSQL, PostgreSQL itself) keep even once
# orphaned; killing the keeper alone would leave them to start PostgreSQL again.
node_sessions() {
  local own
  own=$(ps -o sid= -p $$ | tr -d ' ')
  {
    pgrep -f -- "pg_autoctl run --pgdata $dir/$1\$" || true
    [ -f "$dir/$1/postmaster.pid" ] && head -n 1 "$dir/$1/postmaster.pid"
  } | while read -r pid; do ps -o sid= -p "$pid" || true; done | tr -d ' ' | sort -u |
    grep -vx -e "$own" -e 0 -e '' || true
}

kill_node() {
  for sid in $(node_sessions "$1"); do
    pkill -9 -s "$sid" || true
    for _ in $(seq 1 50); do pgrep -s "$sid" >/dev/null || break; sleep 0.1; done
  done
}

walreceiver() {
  pgrep -P "$(head -n 1 "$dir/$1/postmaster.pid")" -f walreceiver
}

# Start a keeper in the background, in a session of its own, its log in DIR/NAME.log.
run_keeper() {
  local name=$1
  as_pg setsid pg_autoctl run --pgdata "$dir/$name" >>"$dir/$name.log" 2>&1 &
}

fast_monitor() {
  local port=$1
  psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d pg_auto_failover -v ON_ERROR_STOP=1 <<'SQL'
ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000;
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 4000;
SELECT pg_reload_conf();
SQL
}

state() {
  as_pg pg_autoctl show state --pgdata "$dir/monitor" 2>/dev/null
}

# Until the formation has one primary and one secondary, both reported and assigned.
wait_settled() {
  for _ in $(seq 1 600); do
    local s
    s=$(state || true)
    if [ "$(grep -cE '\|\s+primary\s+\|\s+primary\s*$' <<<"$s")" = 1 ] &&
      [ "$(grep -cE '\|\s+secondary\s+\|\s+secondary\s*$' <<<"$s")" = 1 ]; then
      return 0
    fi
    sleep 0.2
  done
  echo "the formation did not settle:" >&2
  state >&2 || true
  return 1
}

case $cmd in
up)
  port=${3:?the port of the monitor}
  mkdir -p "$dir/run" "$dir/config" "$dir/share"
  chown -R postgres:postgres "$dir"
  chmod 700 "$dir/run"
  as_pg pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$port" \
    --hostname 127.0.0.1 --auth trust --no-ssl >"$dir/monitor.log" 2>&1
  run_keeper monitor
  for _ in $(seq 1 100); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.1; done
  fast_monitor "$port" >/dev/null
  as_pg pg_autoctl show uri --pgdata "$dir/monitor" --formation monitor >"$dir/monitor.uri"
  for i in 1 2; do
    as_pg pg_autoctl create postgres --pgdata "$dir/node$i" --pgport $((port + i)) \
      --hostname 127.0.0.1 --name "node$i" --dbname fo --auth trust --no-ssl \
      --monitor "$(monitor_uri)" >"$dir/node$i.log" 2>&1
    run_keeper "node$i"
    # The second node is created from the first's base backup once it is primary.
    [ "$i" = 2 ] || for _ in $(seq 1 300); do state | grep -qE '\|\s+single\s+\|\s+single' && break; sleep 0.2; done
  done
  wait_settled
  as_pg pg_autoctl show uri --pgdata "$dir/monitor" --formation default
  ;;
primary)
  state | awk -F'|' '$6 ~ /primary/ && $7 ~ /primary/ { split($3, a, ":"); gsub(/ /, "", a[2]); print a[2] }'
  ;;
kill)
  kill_node "${3:?node1 or node2}"
  ;;
freeze)
  kill -STOP "$(walreceiver "${3:?node1 or node2}")"
  ;;
thaw)
  kill -CONT "$(walreceiver "${3:?node1 or node2}")" 2>/dev/null || true
  ;;
rejoin)
  node=${3:?node1 or node2}
  run_keeper "$node"
  ;;
wait)
  wait_settled
  ;;
switchover)
  as_pg pg_autoctl perform switchover --pgdata "$dir/monitor" --formation default
  ;;
down)
  for node in node1 node2 monitor; do kill_node "$node"; done
  rm -rf "$dir"
  ;;
*)
  echo "unknown command $cmd" >&2
  exit 2
  ;;
esac
