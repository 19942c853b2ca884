#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md and prints JSON lines, one per
# measurement, to stdout (and to $OUT, default bench-results.jsonl).
#
#   cargo build --release && scripts/bench.sh            # everything, ~10 min
#   QUICK=1 scripts/bench.sh                             # fewer steps and rounds
#
# The machine may be shared: each cluster run reports CPU milliseconds per
# global step besides steps/s, which is far less sensitive to other load
# than wall-clock rates. Compare numbers measured within one invocation.
set -euo pipefail
cd "$(dirname "$0")/.."
DTF=${DTF:-target/release/dtf}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-bench-results.jsonl}
STEPS=${STEPS:-3000}
REPEAT=${REPEAT:-3}
if [[ -n "${QUICK:-}" ]]; then STEPS=1000; REPEAT=1; fi
: > "$OUT"
emit() { tee -a "$OUT"; }
cluster() { python3 scripts/bench_cluster.py --dtf "$DTF" --data "$DATA" "$@" | emit; }
hosts() { python3 scripts/bench_hosts.py --dtf "$DTF" --data "$DATA" "$@" | emit; }

grep -m1 'model name' /proc/cpuinfo
echo "cores: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"

# Compute limit and kernel quality, interleaved so both see the same load.
for _ in $(seq "$REPEAT"); do
    "$DTF" bench --json --data "$DATA" --widths 500,2000,8000 --rounds 5 | sed 's/^{/{"bench":"dtf",/' | emit
    # Unset both together in this command alone (see the machine notes); threadpoolctl reports the kernel.
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
        python3 scripts/bench_numpy.py --data "$DATA" --rounds 5 | sed 's/^{/{"bench":"numpy",/' | emit
done
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
    python3 scripts/bench_numpy.py --data "$DATA" --rounds 3 --layers 784,2000,10 | sed 's/^{/{"bench":"numpy",/' | emit

# Cluster throughput, startup and memory: 1 ps + 2 workers async is the
# reference; each on both transports (shared memory, the default, and TCP),
# interleaved so both see the same load.
for _ in $(seq "$REPEAT"); do
    for t in auto tcp; do cluster --ps 1 --workers 2 --steps "$STEPS" --transport "$t"; done
done
for t in auto tcp; do
    cluster --ps 1 --workers 2 --steps "$STEPS" --mode sync --transport "$t"
    cluster --ps 1 --workers 4 --steps "$STEPS" --transport "$t"
    cluster --ps 2 --workers 4 --steps "$STEPS" --transport "$t"
done
# The ps's capacity (issue 44), on any machine: compute-free workers
# (DTF_BENCH_REPLAY=1: each pushes its first gradient at every step, so a
# step costs the worker only its side of the push) against 1 ps holding the
# reference model whole, 1 ps holding layer1/weights in 4 parts (applied on
# its cores at once), and 2 ps (min_size: layer1/weights in 2), on both
# transports, interleaved. "steps_per_sec" is pushes/s; cpu_ms_per_global_step
# the ps's CPU per push.
parts=$(mktemp -d)
printf '[model]\npartitioner = "none"\n' > "$parts/none.toml"
printf '[model]\npartitioner = "fixed"\npartitions = 4\n' > "$parts/fixed4.toml"
psload() {
    DTF_BENCH_REPLAY=1 python3 scripts/bench_cluster.py --dtf "$DTF" --data "$DATA" --steps $((STEPS * 5)) "$@" |
        sed 's/^{/{"bench":"ps_load",/' | emit
}
for _ in $(seq "$REPEAT"); do
    for t in auto tcp; do
        for w in 1 2; do
            psload --transport "$t" --workers "$w" --ps 1 --config "$parts/none.toml"
            psload --transport "$t" --workers "$w" --ps 1 --config "$parts/fixed4.toml"
            psload --transport "$t" --workers "$w" --ps 2
        done
    done
done
rm -r "$parts"
# EMA accuracy at 8000 steps, both transports.
for t in auto tcp; do cluster --ps 1 --workers 2 --steps 8000 --transport "$t"; done
# Scaling with the number of workers (2 cores: beyond 2 they share them).
for w in 1 8; do cluster --ps 1 --workers "$w" --steps "$STEPS"; done
# Checkpoint cost while training: save every second vs every minute.
for _ in $(seq "$REPEAT"); do
    cluster --ps 1 --workers 2 --steps "$STEPS" --save-secs 1
    cluster --ps 1 --workers 2 --steps "$STEPS" --save-secs 60
done

# Across hosts (network namespaces, tbf-shaped links; needs root): 1 ps on
# one host and 2 workers on another, and 2 ps + 4 workers over 3 hosts, at
# 1 and 10 Gbit/s, for each compression, interleaved; TLS on and off at
# 10 Gbit/s; EMA accuracy at 8000 steps. HOSTS=0 skips them.
if [[ "${HOSTS:-1}" != 0 ]]; then
    for _ in $(seq "$REPEAT"); do
        for rate in 1gbit 10gbit; do
            for c in none bf16 onebit; do
                hosts --rate "$rate" --compression "$c" --ps-hosts 0 --worker-hosts 1,1 --steps "$STEPS"
            done
        done
    done
    for c in none bf16 onebit; do
        hosts --rate 1gbit --compression "$c" --ps-hosts 0,1 --worker-hosts 2,2,2,2 --steps "$STEPS"
    done
    for _ in $(seq "$REPEAT"); do
        for tls in "" --tls; do
            hosts --rate 10gbit --compression none --ps-hosts 0 --worker-hosts 1,1 --steps "$STEPS" $tls
        done
    done
    for mode in async sync; do
        for c in none bf16 onebit; do
            hosts --rate 10gbit --compression "$c" --mode "$mode" --ps-hosts 0 --worker-hosts 1,1 --steps 8000
        done
    done
fi

# ps snapshots (ps.snapshot_secs): every second, the default, vs off,
# interleaved; and the step a kill -9 of the ps costs (bench_ps_kill.py),
# also on a lost disk (the shard from its ring neighbour).
snap_off=$(mktemp --suffix=.toml)
printf '[ps]\nsnapshot_secs = 0\n' > "$snap_off"
for _ in $(seq "$REPEAT"); do
    cluster --ps 1 --workers 2 --steps "$STEPS"
    cluster --ps 1 --workers 2 --steps "$STEPS" --config "$snap_off"
    # Two ps: the snapshots and their ring copies (ps/replica.rs).
    cluster --ps 2 --workers 2 --steps "$STEPS"
    cluster --ps 2 --workers 2 --steps "$STEPS" --config "$snap_off"
done
rm -f "$snap_off"
BIN=$(dirname "$DTF")
python3 scripts/bench_ps_kill.py --bin "$BIN" --data "$DATA" --ps 1 --workers 2 | emit
python3 scripts/bench_ps_kill.py --bin "$BIN" --data "$DATA" --ps 1 --workers 2 --mode sync | emit
python3 scripts/bench_ps_kill.py --bin "$BIN" --data "$DATA" --ps 2 --workers 4 --victim 1 | emit
python3 scripts/bench_ps_kill.py --bin "$BIN" --data "$DATA" --ps 2 --workers 4 --victim 1 --lose-disk | emit
python3 scripts/bench_ps_kill.py --bin "$BIN" --data "$DATA" --ps 2 --workers 4 --victim 0 --mode sync | emit
python3 scripts/bench_ps_kill.py --bin "$BIN" --data "$DATA" --ps 2 --workers 4 --victim 1 --mode sync --lose-disk | emit

# A worker joining a running cluster (a live cluster.worker edit, then its
# start): the time to its first applied push.
for mode in async sync; do
    python3 scripts/bench_join.py --bin "$BIN" --data "$DATA" --mode "$mode" | emit
done

# The re-shard pause (a live cluster.ps edit, 1 -> 2 ps and back): from the
# edit to every worker training again under the new placement.
for mode in async sync; do
    python3 scripts/bench_reshard.py --bin "$BIN" --data "$DATA" --mode "$mode" | emit
done
