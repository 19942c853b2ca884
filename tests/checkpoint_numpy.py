#!/usr/bin/env python3
"""Evaluate a dtf checkpoint with nothing but safetensors + numpy.

Usage: python3 tests/checkpoint_numpy.py CKPT_FILE DATA_DIR

CKPT_FILE is a model.ckpt-<N>.safetensors file; its model.ckpt-<N>.ema.safetensors
sibling is read too. DATA_DIR holds t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte, gzipped (.gz) or raw. Prints one JSON line:
{"global_step": n, "accuracy": a, "ema_accuracy": b, "optimizer": {...},
 "slots": {name: [shape...], ...}}

The optimizer's slots (`layer1/weights/Adam`, `beta1_power`, ...) sit in the
model file beside the variables, named in its `slots` metadata; they play no
part in the accuracy, and are listed with their shapes so that a test can
check them against the variables.

This is the independent reference `dtf eval --json` is compared against, so it
reimplements the forward pass from DESIGN.md ("The model and its math"):
pixels / 255, ReLU hidden layers, linear logits, arg-max.
"""

import gzip
import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

EMA_SUFFIX = "/ExponentialMovingAverage"


def read_idx(data_dir, name):
    """The array in an IDX file (`name` or `name.gz`), shaped by its header."""
    for path, opener in ((os.path.join(data_dir, name + ".gz"), gzip.open),
                         (os.path.join(data_dir, name), open)):
        if os.path.exists(path):
            with opener(path, "rb") as f:
                raw = f.read()
            break
    else:
        sys.exit(f"{data_dir}: neither {name} nor {name}.gz exists")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        sys.exit(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    start = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(raw) - start != count:
        sys.exit(f"{path}: header says {dims} = {count} bytes, file has {len(raw) - start}")
    return np.frombuffer(raw, dtype=np.uint8, offset=start).reshape(dims)


def layers(tensors, suffix=""):
    """[(weights, biases), ...] for layer1, layer2, ... as long as they exist."""
    out = []
    i = 1
    while f"layer{i}/weights{suffix}" in tensors:
        out.append((tensors[f"layer{i}/weights{suffix}"], tensors[f"layer{i}/biases{suffix}"]))
        i += 1
    if not out:
        sys.exit(f"no layer1/weights{suffix} tensor in the checkpoint")
    return out


def accuracy(params, x, labels):
    h = x
    for k, (w, b) in enumerate(params):
        h = h @ w + b
        if k < len(params) - 1:
            h = np.maximum(h, np.float32(0))
    return float(np.mean(np.argmax(h, axis=1) == labels))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2])
    ckpt, data_dir = sys.argv[1], sys.argv[2]
    if not ckpt.endswith(".safetensors") or ckpt.endswith(".ema.safetensors"):
        sys.exit(f"{ckpt}: expected a model.ckpt-<N>.safetensors file")
    ema_path = ckpt[: -len(".safetensors")] + ".ema.safetensors"

    model = load_file(ckpt)
    ema = load_file(ema_path)
    step = int(model["global_step"])
    with safe_open(ckpt, framework="numpy") as f:
        meta = f.metadata() or {}
    optimizer = json.loads(meta.get("optimizer", '{"name": "sgd"}'))
    slots = {}
    for name in json.loads(meta.get("slots", "[]")):
        if name not in model:
            sys.exit(f"{ckpt}: metadata lists slot {name} but the file has no such tensor")
        var = name.rsplit("/", 1)[0]
        if "/" in name and model[name].shape != model[var].shape:
            sys.exit(f"{ckpt}: slot {name} has shape {model[name].shape}, {var} {model[var].shape}")
        if not np.all(np.isfinite(model[name])):
            sys.exit(f"{ckpt}: slot {name} is not finite")
        slots[name] = list(model[name].shape)

    images = read_idx(data_dir, "t10k-images-idx3-ubyte")
    labels = read_idx(data_dir, "t10k-labels-idx1-ubyte").astype(np.int64)
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255)

    result = {
        "global_step": step,
        "accuracy": accuracy(layers(model), x, labels),
        "ema_accuracy": accuracy(layers(ema, EMA_SUFFIX), x, labels),
        "optimizer": optimizer,
        "slots": slots,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
