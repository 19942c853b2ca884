#!/usr/bin/env bash
# Incremental ps snapshots (issue 42, item 5): one table of ROWS rows, 16
# wide with Adagrad, snapshotted whole, then 1 % of its rows changed and
# snapshotted as a delta; prints one JSON line: each one's bytes, its copy
# under the table's lock and its encode + write, the table's memory per row,
# and the restore of the whole snapshot with the delta applied (checked
# equal to the table). Through the ps's own code (ps::table, ps::snapshot),
# in one process, files in DIR (default /tmp: needs ~2.2 × ROWS × 200 bytes).
#
#   scripts/bench_snapshots.sh [ROWS] [DIR] [SHADOWS]    # default 1000000 /tmp 1
#
# SHADOWS=0: the table keeps no EMA shadows ([model.tables] moving_average = false).
set -euo pipefail
cd "$(dirname "$0")/.."
DTF_BENCH_ROWS=${1:-1000000} DTF_BENCH_DIR=${2:-/tmp} DTF_BENCH_SHADOWS=${3:-1} \
    cargo test --release --locked --lib bench_whole_and_delta_snapshots -- --ignored --nocapture 2>/dev/null |
    grep '^{'
