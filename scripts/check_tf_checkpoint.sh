#!/usr/bin/env bash
# TensorFlow itself checks dtf's TensorFlow checkpoints, both ways (issue 43):
#   1. a short dtf local run (Adam, so slots and beta powers are in it); dtf
#      export --tf-checkpoint; TensorFlow's
#      tf.train.latest_checkpoint + load_checkpoint read the export, and every
#      tensor matches the dtf checkpoint (read with safetensors + numpy) bit
#      for bit;
#   2. TensorFlow's compat.v1 Saver writes a checkpoint of the reference
#      program's variables; dtf local --init-from starts a run from it (its
#      values are a pattern, not trained weights: what counts is the
#      console line and that the run resumes at its step, not the accuracy).
# Prints one JSON line per check (scripts/check_tf_checkpoint.py) and the
# --init-from console line; exits non-zero on any failure.
#
#   cargo build --release && scripts/check_tf_checkpoint.sh
#
# TensorFlow lives in a venv outside the repository (made on first use;
# PyPI must be reachable then): $TF_VENV, default /var/cache/dtf-test/tf-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
DTF=${DTF:-target/release/dtf}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
TF_VENV=${TF_VENV:-/var/cache/dtf-test/tf-venv}
HIDDEN=${HIDDEN:-32}
if [[ ! -x "$TF_VENV/bin/python" ]]; then
	python3 -m venv "$TF_VENV"
	"$TF_VENV/bin/pip" install -q tensorflow-cpu safetensors numpy ||
		"$TF_VENV/bin/pip" install -q tensorflow safetensors numpy
fi
PY="$TF_VENV/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. dtf → TensorFlow.
"$DTF" local --data "$DATA" --hidden "$HIDDEN" --workers 1 --steps 200 --optimizer adam \
	--checkpoint-dir "$work/dtf" --json >/dev/null
model=$(ls "$work"/dtf/model.ckpt-*.safetensors | grep -v '\.ema\.' | sort -t- -k2 -n | tail -n1)
"$DTF" export --tf-checkpoint "$work/tf" "$model"
"$PY" scripts/check_tf_checkpoint.py read "$model" "$work/tf"

# 2. TensorFlow → dtf: the data's widths, e.g. 784,32,10.
layers=$("$DTF" inspect --json "$model" | python3 -c '
import json, sys
t = {x["name"]: x["shape"] for x in json.load(sys.stdin)["model"]["tensors"]}
w = sorted((k for k in t if k.endswith("/weights")), key=lambda k: int(k.split("/")[0][5:]))
print(",".join(str(v) for v in [t[w[0]][0]] + [t[k][1] for k in w]))')
"$PY" scripts/check_tf_checkpoint.py write "$work/from-tf" "$layers" 100
"$DTF" local --data "$DATA" --hidden "$HIDDEN" --workers 1 --steps 300 \
	--init-from "$work/from-tf" --checkpoint-dir "$work/seeded" 2>&1 |
	grep -E '^dtf local: (initialized|resumed)|^global_step'
