#!/usr/bin/env bash
# Embedding tables at two sizes (issue 40's targets): the same wide & deep
# run over TCP on synthetic data whose ids are uniform over 10^4 ids and over
# 10^7, so that the ps's tables end ~10^4 and ~10^7 rows while every batch
# touches about as many ids. Both sets have 2,500,000 rows, so the workers'
# resident data is the same and their RSS compares the tables alone. Prints,
# per size: steps/s, TCP bytes per step of each worker (both ways, from the
# workers' "Worker done." lines; worker 0, the chief, also reads the tables
# for its checkpoints), the tables' rows (dtf inspect of the final
# checkpoint), and the peak RSS of each worker and the ps (VmHWM, sampled).
#
#   cargo build --release && scripts/bench_tables.sh [STEPS]    # default 10000
set -euo pipefail
cd "$(dirname "$0")/.."
DTF=${DTF:-target/release/dtf}
steps=${1:-10000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$DTF" synth --out "$work/small" --rows 2500000 --fields 8 --cardinality 1250 --exponent 0 >/dev/null
"$DTF" synth --out "$work/large" --rows 2500000 --fields 8 --cardinality 1250000 --exponent 0 >/dev/null
peak() { # "task:kB ..." peak VmHWM of $2's children named $1 (by --task) while $2 (dtf local) lives
    declare -A max=()
    local p t v
    while kill -0 "$2" 2>/dev/null; do
        for p in $(pgrep -P "$2" -x "$1"); do
            t=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed -n 's/.*--task \([0-9]*\).*/\1/p')
            v=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
            [ -n "$t" ] && [ "${v:-0}" -gt "${max[$t]:-0}" ] && max[$t]=$v
        done
        sleep 0.5
    done
    for t in "${!max[@]}"; do printf '%s:%s ' "$t" "${max[$t]}"; done
}
for size in small large; do
    ckpt=$work/ckpt-$size
    "$DTF" local --data "$work/$size" --label label --ps 1 --workers 2 --steps "$steps" \
        --transport tcp --checkpoint-dir "$ckpt" --keep-run-dir --json >"$work/$size.json" 2>"$work/$size.err" &
    pid=$!
    peak dtf-worker "$pid" >"$work/$size.wrss" &
    peak dtf-ps "$pid" >"$work/$size.prss" &
    wait "$pid"
    wait
    run_dir=$(python3 -c "import json;print(json.load(open('$work/$size.json'))['run_dir'])")
    python3 - "$work/$size.json" "$run_dir" "$("$DTF" inspect --json "$ckpt")" \
        "$(cat "$work/$size.wrss")" "$(cat "$work/$size.prss")" "$size" <<'PY'
import json, re, sys, glob, os
report, run_dir, inspect, wrss, prss, size = sys.argv[1:]
r = json.load(open(report))
# Per worker: worker 0 is the chief, whose TCP bytes also hold the
# checkpoints' table reads; worker 1's are the steps' alone.
workers = {}
for log in sorted(glob.glob(run_dir + "/logs/worker-*.log")):
    task = int(re.search(r"worker-(\d+)", os.path.basename(log)).group(1))
    for line in open(log):
        if "Worker done." in line:
            m = dict(re.findall(r"(\w+)=(\d+)", line))
            both = int(m.get("tcp_sent_bytes", 0)) + int(m.get("tcp_received_bytes", 0))
            workers[task] = both / max(int(m.get("local_steps", 0)), 1)
rss = lambda text: {int(t): int(kb) for t, kb in (p.split(":") for p in text.split())}
rows = {t["name"]: t["rows"] for t in json.loads(inspect).get("tables", [])}
print(json.dumps({"bench": "tables", "size": size, "steps_per_sec": r["steps_per_sec"],
    "examples_per_sec": r["examples_per_sec"], "test_auc": r.get("test_auc"),
    "tcp_bytes_per_step_by_worker": workers, "table_rows": rows,
    "worker_peak_rss_kb": rss(wrss), "ps_peak_rss_kb": rss(prss)}))
PY
done
