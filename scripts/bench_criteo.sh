#!/usr/bin/env bash
# The Criteo-schema workload at scale (issue 42, item 6): synthetic data of
# Criteo's shape — 26 categorical fields with Zipf ids (exponents 1.05 to
# 1.2, the Kaggle set's cardinalities, up to 10^7) and 13 dense count
# columns (`dtf synth --dense 13`) — trained as wide & deep, batch 2048, over
# TCP with 1 ps (or PS) and 2 workers. Prints one JSON object: examples/s,
# the test AUC against the planted model's, TCP bytes per step of worker 1
# (the chief also reads the tables for its checkpoints), the ps's rows at
# the end and its peak RSS per row, and the ps's snapshots as the table
# grew (each whole one's rows, bytes and time; the deltas' median bytes and
# time), from its "Snapshot written." lines, and the chief's checkpoints
# (each one's step, kind — whole, base or delta —, time and bytes), from its
# "Checkpoint written." lines. Arguments after `--` go to `dtf local`
# (e.g. `--set checkpoint.full_every=5 --set checkpoint.save_secs=10`).
#
#   cargo build --release && scripts/bench_criteo.sh [ROWS] [STEPS] [PS] [-- ARGS…]   # 1000000 3000 1
set -euo pipefail
cd "$(dirname "$0")/.."
DTF=${DTF:-target/release/dtf}
rows=${1:-1000000}
steps=${2:-3000}
ps=${3:-1}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cards=1460,583,10131227,2202608,305,24,12517,633,3,93145,5683,8351593,3194,27,14992,5461306,10,5652,2173,4,7046547,18,15,286181,105,142572
exps=1.05,1.1,1.15,1.2,1.05,1.1,1.15,1.2,1.05,1.1,1.15,1.2,1.05,1.1,1.15,1.2,1.05,1.1,1.15,1.2,1.05,1.1,1.15,1.2,1.05,1.1
"$DTF" synth --out "$work/data" --rows "$rows" --fields 26 --dense 13 --cardinality "$cards" \
    --exponent "$exps" --bias -1 --json >"$work/synth.json"
"$DTF" local --data "$work/data" --label label --ps "$ps" --workers 2 --steps "$steps" \
    --batch-size 2048 --transport tcp --checkpoint-dir "$work/ckpt" --keep-run-dir --json \
    --set 'log.level=info,dtf::ps::snapshot=debug' --set checkpoint.max_to_keep=1000 "$@" \
    >"$work/run.json" 2>"$work/run.err" &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
    for p in $(pgrep -P "$pid" -x dtf-ps); do
        v=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
        [ "${v:-0}" -gt "$peak" ] && peak=$v
    done
    sleep 0.5
done
wait "$pid" || { cat "$work/run.err" >&2; exit 1; }
python3 - "$work" "$peak" "$("$DTF" inspect --json "$work/ckpt")" <<'PY'
import glob, json, os, re, statistics, sys
work, peak_kb, inspect = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
r = json.load(open(f"{work}/run.json"))
synth = json.load(open(f"{work}/synth.json"))
run_dir = r["run_dir"]
def fields(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}
bytes_per_step = None
for line in open(f"{run_dir}/logs/worker-1.log"):
    if "Worker done." in line:
        m = fields(line)
        both = int(m.get("tcp_sent_bytes", 0)) + int(m.get("tcp_received_bytes", 0))
        bytes_per_step = both / max(int(m.get("local_steps", 1)), 1)
wholes, deltas = [], []
for log in sorted(glob.glob(f"{run_dir}/logs/ps-*.log")):
    for line in open(log):
        if "Snapshot written." in line:
            m = fields(line)
            s = {k: int(m[k]) for k in ("rows", "bytes", "rows_copy_millis", "millis")}
            (deltas if m.get("delta", "0") != "0" else wholes).append(s)
rows = sum(t["rows"] for t in inspect.get("tables", []))
checkpoints = []
for line in open(f"{run_dir}/logs/worker-0.log"):
    if "Checkpoint written." in line:
        m = fields(line)
        step = int(m["step"])
        size = sum(os.path.getsize(f"{work}/ckpt/model.ckpt-{step}{ext}")
                   for ext in (".safetensors", ".ema.safetensors")
                   if os.path.exists(f"{work}/ckpt/model.ckpt-{step}{ext}"))
        checkpoints.append({"step": step, "kind": m.get("kind", "whole").strip('"'),
                            "millis": int(m["millis"]), "bytes": size})
med = lambda k: statistics.median(d[k] for d in deltas) if deltas else None
print(json.dumps({
    "rows": synth["spec"]["rows"], "steps": r.get("global_step"), "batch_size": 2048,
    "examples_per_sec": r.get("examples_per_sec"),
    "test_auc": r.get("test_auc"), "ema_test_auc": r.get("ema_test_auc"), "planted_auc": synth["planted_auc"],
    "worker1_tcp_bytes_per_step": bytes_per_step,
    "table_rows": rows, "ps_peak_rss_bytes": peak_kb * 1024,
    "ps_peak_rss_per_row": peak_kb * 1024 / rows if rows else None,
    "whole_snapshots": wholes[-8:], "deltas": len(deltas),
    "delta_median_rows": med("rows"), "delta_median_bytes": med("bytes"),
    "delta_median_millis": med("millis"), "delta_median_rows_copy_millis": med("rows_copy_millis"),
    "checkpoints": checkpoints,
}, indent=1))
PY
