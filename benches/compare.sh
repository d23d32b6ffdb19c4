#!/usr/bin/env bash
# The ingest and admission benchmarks of a base commit beside a head commit's, on the
# same machine in the same run, interleaved (base, then head, load by load, round after
# round) so that the machine's drift falls on both alike; a figure of head is read as a
# ratio to base's. Writes reports/compare.md (reports/citus.md keeps the comparison that
# made the store distributable, with its readings).
#
#   benches/compare.sh <base-commit> [rounds] [head-commit]   (default: 2 rounds, HEAD)
#
# BENCHES (default "ingest admission"), BACKENDS (default "postgres sqlite") and
# PARTITIONED=0 (skip head on a partitioned PostgreSQL) cut the loop to what a change
# touches.
#
# Both commits are checked out in worktrees under target/, so the working tree stays free
# to edit while this runs. In both, the ingest benchmark is cut to one measurement a run
# (its ROUNDS) of the two loads compared (not the single heartbeats at 8 and 32), the same
# edit on each side, so that this script's rounds are what interleaves; the admission
# benchmark measures one load a run when given one. The base
# builds into a target directory of its own seeded from this tree's (cargo names a
# workspace crate's artifacts alike in both trees, so they cannot share one); the head
# builds into this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:?usage: benches/compare.sh <base-commit> [rounds] [head-commit]}"
rounds="${2:-2}"
head="${3:-HEAD}"
command -v wrk >/dev/null || { echo "the benchmarks drive wrk: apt-get install wrk" >&2; exit 1; }
base_rev="$(git rev-parse --short "$base")"
head_rev="$(git rev-parse --short "$head")"
base_tree="target/compare-base"
head_tree="target/compare-head"
base_target="target/compare-base-target"
out="target/compare-runs"
rm -rf "$out" && mkdir -p "$out"
checkout() {
  git worktree remove --force "$1" 2>/dev/null || rm -rf "$1"
  git worktree add --detach --force "$1" "$2" >/dev/null
  sed -i -e 's/^const ROUNDS: usize = [0-9]*;/const ROUNDS: usize = 1;/' \
    -e '/(Backend::[A-Za-z]*, 1, \(8\|32\), &Setup::ALL\[\.\.1\]),/d' "$1/benches/ingest.rs"
}
checkout "$base_tree" "$base"
checkout "$head_tree" "$head"
if [ ! -d "$base_target/release" ] && [ -d target/release ]; then
  mkdir -p "$base_target" && cp -a target/release "$base_target/"
fi
trap 'git worktree remove --force "$base_tree" 2>/dev/null || true; git worktree remove --force "$head_tree" 2>/dev/null || true' EXIT

# The paths of the two bench executables that `cargo bench --no-run` builds in `dir`
# (into the target directory `target`).
executables() {
  (cd "$1" && CARGO_TARGET_DIR="$2" cargo bench --no-run --bench ingest --bench admission \
    --message-format=json) |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("ingest", "admission"):
        print(m["target"]["name"], m["executable"])'
}
declare -A exe
while read -r name path; do exe["base_$name"]="$path"; done < <(executables "$base_tree" "$PWD/$base_target")
while read -r name path; do exe["head_$name"]="$path"; done < <(executables "$head_tree" "$PWD/target")
for k in base_ingest base_admission head_ingest head_admission; do
  [ -n "${exe[$k]:-}" ] || { echo "no executable for $k" >&2; exit 1; }
done

# One bench for one backend, within the plan only (`plan`), at one load (admission's
# callers; ingest runs its loads in turn); its figures go to
# $out/<side>.<bench>.<backend>.<round>, appended.
measure() {
  local side="$1" bench="$2" backend="$3" round="$4" program="$5" load="$6"
  shift 6
  echo "round $round: $side $bench $backend $load" >&2
  local log="$out/$side.$bench.$backend.$round.log"
  env "$@" "$program" "$backend" plan $load >>"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  grep -E 'rows/s|decisions/s' "$log" >"$out/$side.$bench.$backend.$round" || true
}
for round in $(seq 1 "$rounds"); do
  for bench in ${BENCHES:-ingest admission}; do
    loads=""
    [ "$bench" = admission ] && loads="1 8 32"
    for backend in ${BACKENDS:-postgres sqlite}; do
      for load in ${loads:-all}; do
        [ "$load" = all ] && load=""
        measure base "$bench" "$backend" "$round" "${exe[base_$bench]}" "$load"
        measure head "$bench" "$backend" "$round" "${exe[head_$bench]}" "$load"
        if [ "${PARTITIONED:-1}" != 0 ] && [ "$backend" = postgres ]; then
          measure partitioned "$bench" postgres "$round" "${exe[head_$bench]}" "$load" RUSH_METER_TEST_PG_PARTITIONS=4
        fi
      done
    done
  done
done

python3 - "$out" "$base_rev" "$head_rev" "$rounds" "$*" <<'EOF' >reports/compare.md
import glob, os, re, statistics, subprocess, sys, datetime
out, base_rev, head_rev, rounds, args = sys.argv[1:]
figures = {}  # (bench, backend, load) -> side -> [rate]
for path in sorted(glob.glob(os.path.join(out, "*[0-9]")), key=lambda p: int(p.rsplit(".", 1)[1])):
    side, bench, backend, _ = os.path.basename(path).split(".")
    for line in open(path):
        # Lines name their setup (`(plan)`, and the raw transaction's), and ingest's also
        # the concurrency: only 100 heartbeats a request at 16 and one at 128 count.
        m = re.match(r"(\w+) batch (\d+)(?: at (\d+))?(?: \(([^)]*)\))?: (\d+) rows/s", line) \
            or re.match(r"(\w+) (\d+) callers(?: \(([^)]*)\))?: (\d+) decisions/s", line)
        if not m:
            continue
        groups = m.groups()
        setup, rate = groups[-2], groups[-1]
        if setup not in (None, "plan"):
            continue
        if bench == "ingest" and groups[2] not in (None, {"100": "16", "1": "128"}[groups[1]]):
            continue
        backend = groups[0].lower()  # a base without the backend argument measures both
        load = f"{groups[1]} a request" if bench == "ingest" else f"{groups[1]} callers"
        figures.setdefault((bench, backend, load), {}).setdefault(side, []).append(float(rate))
cores = os.cpu_count()
partitioned = ("" if os.environ.get("PARTITIONED") == "0" else
    ", then head on a PostgreSQL whose org tables are hash-partitioned\nfour ways "
    "(each partition a shard: statements go out once a shard)")
env = "".join(f"{k}={v!r} " if " " in v else f"{k}={v} " for k in ("BENCHES", "BACKENDS", "PARTITIONED") if (v := os.environ.get(k)))
rows = []
for (bench, backend, load) in sorted(figures, key=lambda k: (k[0] != "ingest", k[1], int(k[2].split()[0]))):
    f = figures[(bench, backend, load)]
    med = {s: statistics.median(v) for s, v in f.items()}
    def cell(side):
        if side not in med:
            return "", ""
        return f"{med[side]:.0f} ({', '.join(f'{x:.0f}' for x in f[side])})", f"{med[side] / med['base']:.2f}"
    head, ratio = cell("head")
    part, pratio = cell("partitioned")
    unit = "heartbeats/s" if bench == "ingest" else "decisions/s"
    rows.append(f"| {bench} | {backend} | {load} | {med['base']:.0f} ({', '.join(f'{x:.0f}' for x in f['base'])}) | {head} | **{ratio}** | {part} | {pratio} |")
print(f"""# A base commit and the tree, side by side

The ingest and admission benchmarks of commit {base_rev} beside {head_rev}, run
interleaved on the same machine in one run: base, head{partitioned}, load by load. The
loads are 100 heartbeats a request at 16 clients and one at 128, and 1, 8 and 32 admission
callers, with orgs within their plan; each round measures each load once on each side.
Figures are medians of {rounds} rounds (each round's in brackets); the ratio is head /
base.

- Command: `{env}benches/compare.sh {' '.join(args.split()) if args else base_rev}`
- Machine: {cores} cores, the load generator (wrk), the service and the database on them
- Date: {datetime.date.today()}

| bench | backend | load | base | head | head / base | head, 4 partitions | partitions / base |
| --- | --- | --- | --- | --- | --- | --- | --- |""")
print("\n".join(rows))
EOF
echo "wrote reports/compare.md" >&2
