#!/usr/bin/env bash
# The fault harness (tests/it/chaos/): per seed, a real cluster on
# 127.0.0.1 under a fault schedule drawn from the seed, its history checked
# (docs/chaos.md). As root: the checkpoint directory is a tmpfs it fills.
#
#   scripts/chaos.sh --seeds N      seeds 1..N
#   scripts/chaos.sh --seed K       seed K alone (what a failure prints to replay it)
#   --first F                       with --seeds: seeds F..F+N-1
#   --seconds S                     faults spread over S seconds per seed (default 20)
#   --no-reference                  skip the fault-free run each seed's accuracy is compared with
#   --hosts                         each task on a host of its own (network namespaces), links
#                                   cut and slowed beside the other faults
#   --sparse                        wide & deep on embedding tables instead of the MLP
#   --list                          print each seed's plan (cluster and faults); run nothing
#
# Every seed runs even after one fails; the summary (seeds, faults by kind,
# failing seeds, wall time) is printed last and the exit status is 1 if any
# seed violated an invariant.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
seeds=3 first=1 seed= seconds=20 reference=1 hosts=0 sparse=0 list=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seeds) seeds=${2:?}; shift 2 ;;
        --first) first=${2:?}; shift 2 ;;
        --seed) seed=${2:?}; shift 2 ;;
        --seconds) seconds=${2:?}; shift 2 ;;
        --no-reference) reference=0; shift ;;
        --hosts) hosts=1; shift ;;
        --sparse) sparse=1; shift ;;
        --list) list=1; shift ;;
        -h|--help) usage ;;
        *) echo "chaos.sh: unknown argument $1" >&2; usage ;;
    esac
done
for n in "$seeds" "$first" "$seconds" ${seed:+"$seed"}; do
    case "$n" in ''|*[!0-9]*) echo "chaos.sh: not a number: $n" >&2; exit 2 ;; esac
done
if [ -n "$seed" ]; then
    range=$seed
else
    range=$first-$((first + seeds - 1))
fi
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
status=0
DTF_CHAOS_SEEDS=$range DTF_CHAOS_SECONDS=$seconds DTF_CHAOS_REFERENCE=$reference DTF_CHAOS_HOSTS=$hosts DTF_CHAOS_SPARSE=$sparse DTF_CHAOS_LIST=$list \
DTF_CHAOS_SUMMARY=$summary \
    cargo nextest run --locked --profile chaos --no-capture --run-ignored only \
    -E 'test(=chaos::from_env)' || status=$?
cat "$summary"
exit $status
