#!/usr/bin/env bash
# dtf's main job on a Debian 12 machine, as root: installs the Fashion-MNIST
# data set, builds dtf, and trains the reference 784-500-10 MLP on a local
# cluster (1 ps + 2 workers) to step 20000. Extra arguments go to `dtf local`
# after these defaults, and the last of a repeated flag wins, so they override
# them: ./scripts/local.sh --steps 2000 --workers 3
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    apt-get update -qq
    apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi
command -v cargo >/dev/null || { echo "cargo (Rust stable) is required" >&2; exit 1; }
cargo build --release --locked -q
exec target/release/dtf local --ps 1 --workers 2 --steps 20000 "$@"
