#!/usr/bin/env bash
# Issue #12 on the GPU machine: the storms that take the profiled launch call apart,
# every variant side by side (tools/bench/src/bin/storm.rs says what each isolates).
# About 3 minutes on an H200; stops starting runs past 200 s, so it ends within 4.
#
#   OUT=/some/folder tools/bench/scripts/storm-suspects.sh
#
# The storm binary is taken from beside this script (a stripped release build copied
# there with it, as in .gpu/), else from STORM. Writes, into $OUT: one log per run
# (storm-NAME.log: the command, the table, the JSON line, the exit status), all
# the JSON lines in storm-suspects.jsonl (each with "run":"NAME"), and the
# summary storm-suspects.log.
#
# Reading a run (its "part:" rows, p50 / p99 µs):
#   floor − plain                        the profiled call's own driver calls
#   floor+collector's calls − floor      (1) the collector's driver calls, met in the driver
#   kernel not recording − floor+coll.   (2)+(4) the host path: arena and event locks,
#                                        job channel, span, names
#   Perfetto layer − kernel not recording (3) the longer recorded kernel: a full queue
#                                        makes the call wait for the device
# Regimes: "own"/"legacy" (the storms of docs/performance.md, 8 blocks, work 64,
# most launches recorded); "short" (1 block, work 8: a kernel shorter than the call,
# the queue never fills, so part (3) should vanish); "gap" (20 µs spin after each
# call, the queue stays empty whatever the kernel); "settled" (no block beside an
# earlier block's drain); "big" (132 blocks, work 1024: the arena full, few recorded).
# "own-1-bisect" is "own-1" with the stand-in collector asking log2(launches) events a
# pass instead of one per launch: if its collector part is smaller, the queries cost.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
storm=${STORM:-$here/storm}
out=${OUT:?set OUT to the folder for the logs}
mkdir -p "$out"
summary=$out/storm-suspects.log
jsonl=$out/storm-suspects.jsonl
: >"$summary"
: >"$jsonl"
all=plain,floor,floor-collector,unsubscribed,host-only,profiled
start=$(date +%s)

run() { # NAME ARGS...: one storm, at most 40 s
  local name=$1
  shift
  if (($(date +%s) - start > 200)); then
    echo "=== $name: not run (past 200 s)" | tee -a "$summary"
    return
  fi
  local log=$out/storm-$name.log
  echo "=== $name: storm $* ($(date +%T))" | tee -a "$summary" >"$log"
  timeout 40 "$storm" --variants "$all" "$@" >>"$log" 2>&1
  local rc=$?
  echo "--- rc=$rc" >>"$log"
  grep -E '^\| (part|added)|^fake collector|^counts' "$log" >>"$summary"
  echo "--- rc=$rc" >>"$summary"
  grep '^{"bench":"storm"' "$log" | sed "s/^{/{\"run\":\"$name\",/" >>"$jsonl"
}

recorded=(--blocks 8 --work 64)
run own-1 "${recorded[@]}" --stream own --threads 1 --launches 50000
run own-1-bisect "${recorded[@]}" --stream own --threads 1 --launches 50000 --bisect
run legacy-1 "${recorded[@]}" --stream legacy --threads 1 --launches 50000
run own-4 "${recorded[@]}" --stream own --threads 4 --launches 50000
run legacy-4 "${recorded[@]}" --stream legacy --threads 4 --launches 50000
run settled-own-1 "${recorded[@]}" --stream own --threads 1 --launches 20000 --settle
run short-own-1 --blocks 1 --work 8 --stream own --threads 1 --launches 50000
run short-own-4 --blocks 1 --work 8 --stream own --threads 4 --launches 50000
run gap-own-1 "${recorded[@]}" --stream own --threads 1 --launches 10000 --gap 20
run gap-legacy-4 "${recorded[@]}" --stream legacy --threads 4 --launches 10000 --gap 20
run big-own-1 --stream own --threads 1 --launches 20000
echo "done in $(($(date +%s) - start)) s" | tee -a "$summary"
