#!/usr/bin/env bash
# The ingest and admission benchmarks of a base commit beside the working tree's, on the
# same machine in the same run, interleaved (base, head, head on a partitioned
# PostgreSQL, then again) so that the machine's drift falls on all alike; a figure of
# head is read as a ratio to base's. Writes reports/compare.md (reports/citus.md keeps the
# comparison that made the store distributable, with its readings).
#
#   benches/compare.sh <base-commit> [rounds]    (default: 2 rounds)
#
# BENCHES (default "ingest admission"), BACKENDS (default "postgres sqlite") and
# PARTITIONED=0 (skip the partitioned runs) cut the loop to what a change touches.
#
# The base is built in a worktree under target/, with a target directory of its own seeded
# from this tree's (cargo names a workspace crate's artifacts alike in both trees, so they
# cannot share one; seeded, only the two workspace crates build again).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:?usage: benches/compare.sh <base-commit> [rounds]}"
rounds="${2:-2}"
command -v wrk >/dev/null || { echo "the benchmarks drive wrk: apt-get install wrk" >&2; exit 1; }
base_rev="$(git rev-parse --short "$base")"
head_rev="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src core migrations || echo '+changes')"
tree="target/compare-base"
base_target="target/compare-base-target"
out="target/compare-runs"
rm -rf "$out" && mkdir -p "$out"
git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
git worktree add --detach --force "$tree" "$base" >/dev/null
if [ ! -d "$base_target/release" ] && [ -d target/release ]; then
  mkdir -p "$base_target" && cp -a target/release "$base_target/"
fi
trap 'git worktree remove --force "$tree" 2>/dev/null || true' EXIT

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
while read -r name path; do exe["base_$name"]="$path"; done < <(executables "$tree" "$PWD/$base_target")
while read -r name path; do exe["head_$name"]="$path"; done < <(executables . "$PWD/target")
for k in base_ingest base_admission head_ingest head_admission; do
  [ -n "${exe[$k]:-}" ] || { echo "no executable for $k" >&2; exit 1; }
done

# One bench for one backend; its stderr figures go to $out/<side>.<bench>.<backend>.<round>.
# The tree's benchmarks run their orgs within the plan only (`plan`), as the base's do
# (the base takes no such word, and has no other setup).
measure() {
  local side="$1" bench="$2" backend="$3" round="$4" program="$5"
  shift 5
  echo "round $round: $side $bench $backend" >&2
  local log="$out/$side.$bench.$backend.$round.log"
  local word=""
  [ "$side" = base ] || word=plan
  env "$@" "$program" "$backend" $word >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  grep -E 'rows/s|decisions/s' "$log" >"$out/$side.$bench.$backend.$round"
}
for round in $(seq 1 "$rounds"); do
  for bench in ${BENCHES:-ingest admission}; do
    for backend in ${BACKENDS:-postgres sqlite}; do
      # A base whose benchmark takes no backend argument measured both in its first run.
      if ! grep -qi "^$backend" "$out/base.$bench.postgres.$round" 2>/dev/null; then
        measure base "$bench" "$backend" "$round" "${exe[base_$bench]}"
      fi
      measure head "$bench" "$backend" "$round" "${exe[head_$bench]}"
    done
    if [ "${PARTITIONED:-1}" != 0 ]; then
      measure partitioned "$bench" postgres "$round" "${exe[head_$bench]}" RUSH_METER_TEST_PG_PARTITIONS=4
    fi
  done
done

python3 - "$out" "$base_rev" "$head_rev" "$rounds" "$*" <<'EOF' >reports/compare.md
import glob, os, re, statistics, subprocess, sys, datetime
out, base_rev, head_rev, rounds, args = sys.argv[1:]
figures = {}  # (bench, backend, load) -> side -> [rate]
for path in glob.glob(os.path.join(out, "*[0-9]")):
    side, bench, backend, _ = os.path.basename(path).split(".")
    for line in open(path):
        # The base's lines name no setup; the tree's name theirs (`(plan)`, and the raw
        # transaction's), and its ingest also the concurrency: only the base's loads (100
        # heartbeats a request at 16, one at 128) within the plan count.
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
interleaved on the same machine in one run: base, head{partitioned}. The loads are the
base's (100 heartbeats a request at 16 clients, one at 128; 1, 8 and 32 callers), with
orgs within their plan; the tree's benchmarks measure each three times a run, the base's
once. Figures are medians of every measurement of {rounds} rounds (each in brackets); the
ratio is head / base.

- Command: `{env}benches/compare.sh {' '.join(args.split()) if args else base_rev}`
- Machine: {cores} cores, the load generator (wrk), the service and the database on them
- Date: {datetime.date.today()}

| bench | backend | load | base | head | head / base | head, 4 partitions | partitions / base |
| --- | --- | --- | --- | --- | --- | --- | --- |""")
print("\n".join(rows))
EOF
echo "wrote reports/compare.md" >&2
