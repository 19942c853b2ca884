#!/usr/bin/env python3
"""The reference step (784-500-10 MLP, batch 100: forward, softmax
cross-entropy, backward with L2) in numpy, to compare dtf's kernels with
OpenBLAS on one thread. Run it as scripts/bench.sh does:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
        python3 scripts/bench_numpy.py --layers 784,500,10

Prints one JSON line: steps/s (median of rounds), GFLOP/s, and the BLAS
kernel threadpoolctl reports.
"""
import argparse
import gzip
import json
import os
import statistics
import time

import numpy as np


def load_images(data_dir, n):
    for name in ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                raw = f.read()
            count = int.from_bytes(raw[4:8], "big")
            rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
            px = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(count, rows * cols)
            return px[:n].astype(np.float32) / 255.0
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="784,500,10")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--steps", type=int, default=200, help="steps per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    layers = [int(v) for v in args.layers.split(",")]
    n, reg = args.batch, np.float32(1e-4)
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((a, b)) * 0.1).astype(np.float32) for a, b in zip(layers, layers[1:])]
    bs = [np.zeros(b, np.float32) for b in layers[1:]]
    x = load_images(args.data, n) if layers[0] == 784 else None
    if x is None:
        x = rng.random((n, layers[0]), dtype=np.float32)
    y = np.arange(n) % layers[-1]

    def step():
        acts = [x]
        for i, (w, b) in enumerate(zip(ws, bs)):
            z = acts[-1] @ w + b
            if i < len(ws) - 1:
                np.maximum(z, 0, out=z)
            acts.append(z)
        z = acts.pop()
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        s = z.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) - np.log(z[np.arange(n), y])))
        dz = z / (s * n)
        dz[np.arange(n), y] -= 1.0 / n
        grads = []
        for i in range(len(ws) - 1, -1, -1):
            a = acts[i]
            dw = a.T @ dz + reg * ws[i]
            loss += float(reg * np.sum(ws[i] * ws[i]) / 2)
            grads.append((dw, dz.sum(axis=0)))
            if i > 0:
                dz = (dz @ ws[i].T) * (a > 0)
        return loss, grads

    for _ in range(20):
        step()
    rates, cpu_rates = [], []
    for _ in range(args.rounds):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(args.steps):
            step()
        rates.append(args.steps / (time.perf_counter() - t))
        cpu_rates.append(args.steps / max(time.thread_time() - c, 1e-9))
    sps = statistics.median(rates)
    macs = sum(a * b for a, b in zip(layers, layers[1:]))
    flops = 6 * n * macs
    kernel = None
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        kernel = [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")} for i in info]
    except ImportError:
        kernel = "threadpoolctl not installed"
    print(json.dumps({
        "layers": layers, "batch": n, "steps_per_sec": sps, "ms_per_step": 1e3 / sps,
        "gflops": flops * sps / 1e9, "rates": rates,
        "cpu_steps_per_sec": statistics.median(cpu_rates), "blas": kernel,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
    }))


if __name__ == "__main__":
    main()
