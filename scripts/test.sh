#!/usr/bin/env bash
# Runs every test layer of dtf on a Debian 12 machine, as root: installs what
# it needs, then formatting and lints, unit and integration tests (nextest),
# the package checks, and the system test under a real systemd.
set -euo pipefail
# --full: also the multi-host acceptance test (tests/system/multihost.sh:
# four machines and two clusters, too long for CI's default run).
full=no
[ "${1:-}" = --full ] && full=yes
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# Each layer's wall time is printed when the next one starts, and at the end;
# a layer that fails says so, with its time, as the last line.
t0=$(date +%s)
layer_start=$t0
layer=
step() {
    local now
    now=$(date +%s)
    [ -z "$layer" ] || printf '==> %s: passed in %d s\n' "$layer" $((now - layer_start))
    layer=$*
    layer_start=$now
    printf '\n==> %s\n' "$*"
}

# The tests' `dtf local` runs make their run directories under TMPDIR: one
# directory for this run, removed at the end, so nothing piles up in /tmp.
# It is traversable by all (mktemp makes it 0700), as /tmp is: a test that runs
# a command as `nobody` opens its own files to it (shm's other-user test); the
# tests' directories inside stay private.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dtf-test.XXXXXX")
chmod 0755 "$scratch"
export TMPDIR=$scratch
finish() {
    local rc=$?
    rm -rf "$scratch"
    if [ "$rc" -ne 0 ] && [ -n "$layer" ]; then
        printf '==> %s: FAILED after %d s\n' "$layer" $(($(date +%s) - layer_start))
    fi
    exit "$rc"
}
trap finish EXIT

step "Installing test dependencies"
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    ca-certificates dataset-fashion-mnist python3 python3-venv python3-numpy iproute2 >/dev/null
# The Python tools the tests use live in a virtual environment of their own,
# kept (with pip's download cache) between runs: nothing goes into the
# system's Python, and a second run downloads nothing.
# safetensors + numpy read checkpoints independently (tests/checkpoint_numpy.py);
# TensorBoard's own reader checks the chief's events files (tests/read_events.py);
# onnx's checker and onnxruntime run `dtf export --onnx` models (tests/onnx_check.py).
cache=${DTF_TEST_CACHE:-/var/cache/dtf-test}
venv=$cache/venv
if ! "$venv/bin/python3" -c 'import numpy, safetensors, tensorboard, onnx, onnxruntime' 2>/dev/null; then
    python3 -m venv "$venv"
    PIP_CACHE_DIR=$cache/pip "$venv/bin/python3" -m pip install -q --disable-pip-version-check \
        numpy safetensors tensorboard onnx onnxruntime
fi
export PATH=$venv/bin:$PATH
# MovieLens-100k in RecBole's atomic files, from the recbole 1.2.1 wheel on
# PyPI, cached beside the venv (the data tests read it there; under CI=true
# they fail without it).
export DTF_ML100K=$cache/ml-100k
PYTHON=$venv/bin/python3 scripts/fetch-ml100k.sh "$DTF_ML100K"
command -v cargo >/dev/null || { echo "cargo (Rust stable) is required" >&2; exit 1; }
cargo nextest --version >/dev/null 2>&1 || cargo install --locked -q cargo-nextest

step "Formatting and lints"
cargo fmt --check
cargo clippy --all-targets --locked -q -- -D warnings

step "Unit and integration tests"
cargo nextest run --locked --no-fail-fast --final-status-level=slow

if [ -x scripts/check-package.sh ]; then
    step "Package checks"
    scripts/check-package.sh
fi
step "Deployment files (scripts/check-deploy.sh)" && scripts/check-deploy.sh
if [ -x tests/system/run.sh ]; then
    step "System test (systemd-nspawn)"
    tests/system/run.sh
fi
if [ "$full" = yes ]; then
    step "Multi-host acceptance (systemd-nspawn hosts, the image)"
    tests/system/multihost.sh
fi
step "Done"
layer=
printf '==> all layers: %d s\n' $(($(date +%s) - t0))
