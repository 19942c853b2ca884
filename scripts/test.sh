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

# Each layer's wall time is printed when the next one starts, and at the end.
t0=$(date +%s)
layer_start=$t0
layer=
step() {
    local now
    now=$(date +%s)
    [ -z "$layer" ] || printf '==> %s: %d s\n' "$layer" $((now - layer_start))
    layer=$*
    layer_start=$now
    printf '\n==> %s\n' "$*"
}

step "Installing test dependencies"
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    ca-certificates dataset-fashion-mnist python3 python3-pip python3-numpy iproute2 >/dev/null
# safetensors + numpy read checkpoints independently (tests/checkpoint_numpy.py);
# TensorBoard's own reader checks the chief's events files (tests/read_events.py);
# onnx's checker and onnxruntime run `dtf export --onnx` models (tests/onnx_check.py).
if ! python3 -c 'import numpy, safetensors, tensorboard, onnx, onnxruntime' 2>/dev/null; then
    python3 -m pip install -q numpy safetensors tensorboard onnx onnxruntime 2>/dev/null \
        || python3 -m pip install -q --break-system-packages numpy safetensors tensorboard onnx onnxruntime
fi
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
printf '==> all layers: %d s\n' $(($(date +%s) - t0))
