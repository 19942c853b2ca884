#!/usr/bin/env python3
"""How long a worker takes to join a running cluster (issue 24): dtf-ps and
dtf-worker processes train the reference model; worker N is added to
`cluster.worker` (a live edit, written by rename as an editor or a config
manager does) and started at once, as `systemctl start dtf-worker@N` would;
the time is from its start to the ps's `Worker joined.` (its first applied
push). Prints one JSON line per join.

    scripts/bench_join.py --bin target/release [--mode sync] [--transport tcp] [--joins 3]
"""
import argparse, json, os, subprocess, tempfile, time

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--mode", default="async")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--joins", type=int, default=3, help="workers added one after another")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dtf-join-")
    base = 24000 + os.getpid() % 5000
    addrs = [f"127.0.0.1:{p}" for p in range(base, base + 3 + args.joins)]
    token = os.path.join(d, "token")
    with open(token, "w") as f:
        f.write("bench-token-0123456789")
    os.chmod(token, 0o600)
    cfg = os.path.join(d, "dtf.toml")
    def write(workers):
        text = f"""[cluster]
ps = {json.dumps(addrs[:1])}
worker = {json.dumps(addrs[1:1 + workers])}
transport = "{args.transport}"
runtime_dir = "{d}/run"
[train]
mode = "{args.mode}"
last_step = 100000000
[data]
dir = "{args.data}"
[checkpoint]
dir = "{d}/ckpt"
[ps]
snapshot_dir = "{d}/state"
[security]
token_file = "{token}"
"""
        with open(cfg + ".new", "w") as f:
            f.write(text)
        os.rename(cfg + ".new", cfg)
    procs = []
    def start(role, i):
        log = open(os.path.join(d, f"{role}-{i}.log"), "a")
        procs.append(subprocess.Popen(
            [os.path.join(args.bin, f"dtf-{role}"), "--config", cfg, "--task", str(i)],
            stdout=log, stderr=log))
    def logged(name, needle, worker=None):
        with open(os.path.join(d, name)) as f:
            return any(needle in l and (worker is None or f"worker={worker} " in l) for l in f)
    def joined(i):
        return logged("ps-0.log", "Worker joined.", i)
    def training(i):
        return logged(f"worker-{i}.log", "Training.")
    try:
        write(2)
        start("ps", 0)
        start("worker", 0)
        start("worker", 1)
        end = time.time() + 120
        while not (training(0) and training(1)):
            if time.time() > end:
                raise SystemExit(f"the first workers never joined; see {d}")
            time.sleep(0.05)
        for n in range(2, 2 + args.joins):
            write(n + 1)
            t0 = time.time()
            start("worker", n)
            while not joined(n):
                if time.time() > t0 + 120:
                    raise SystemExit(f"worker {n} never joined; see {d}")
                time.sleep(0.01)
            print(json.dumps({"bench": "join", "mode": args.mode, "transport": args.transport,
                              "worker": n, "seconds_to_first_push": round(time.time() - t0, 3)}),
                  flush=True)
    finally:
        for p in procs:
            p.kill()
            p.wait()

if __name__ == "__main__":
    main()
