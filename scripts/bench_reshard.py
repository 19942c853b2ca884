#!/usr/bin/env python3
"""The pause of a re-shard (issue 24): dtf-ps and dtf-worker processes train
the reference model on 1 ps + 2 workers; `cluster.ps` gains a second ps (a
live edit, written by rename) and `dtf-ps -t 1` is started at once, as
`systemctl start dtf-ps@1` would; then the edit is undone (2 → 1). Per
re-shard it prints one JSON line: from the edit to the chief's re-shard
checkpoint, to the chief training again under the new placement, and to
the last worker training again (the pause); and the steps lost (the
re-shard checkpoint's step less the step restored: 0 by design).

    scripts/bench_reshard.py --bin target/release [--mode sync] [--transport tcp]
"""
import argparse, datetime, json, os, re, subprocess, tempfile, time

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--mode", default="async")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--train-secs", type=float, default=5, help="training before each re-shard")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dtf-reshard-")
    base = 24000 + os.getpid() % 5000
    addrs = [f"127.0.0.1:{p}" for p in range(base, base + 4)]
    token = os.path.join(d, "token")
    with open(token, "w") as f:
        f.write("bench-token-0123456789")
    os.chmod(token, 0o600)
    cfg = os.path.join(d, "dtf.toml")
    def write(ps):
        text = f"""[cluster]
ps = {json.dumps(addrs[:ps])}
worker = {json.dumps(addrs[2:4])}
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
    def lines(name, needle):
        try:
            with open(os.path.join(d, name)) as f:
                return [l for l in f if needle in l]
        except FileNotFoundError:
            return []
    def at(line):
        return datetime.datetime.fromisoformat(line.split()[0]).timestamp()
    def step(line):
        return int(re.search(r"\bstep=(\d+)", line).group(1))
    def wait_for(name, needle, n, what):
        end = time.time() + 120
        while len(lines(name, needle)) < n:
            if time.time() > end:
                raise SystemExit(f"{what} never came; see {d}")
            time.sleep(0.02)
        return lines(name, needle)[n - 1]
    def reshard(n, ps, edit):
        t0 = time.time()
        edit()
        done = wait_for("worker-0.log", "Re-shard checkpoint done", n, "the re-shard checkpoint")
        restored = wait_for("worker-0.log", "Restored the model from the newest", n, "the restore")
        trained = [at(wait_for(f"worker-{w}.log", "Training.", n + 1, f"worker {w} training"))
                   for w in (0, 1)]
        print(json.dumps({"bench": "reshard", "mode": args.mode, "transport": args.transport,
                          "ps": ps, "checkpoint_secs": round(at(done) - t0, 3),
                          "chief_training_secs": round(trained[0] - t0, 3),
                          "pause_secs": round(max(trained) - t0, 3),
                          "steps_lost": step(done.replace("global_step=", "step=")) - step(restored)}),
              flush=True)
    try:
        write(1)
        start("ps", 0)
        start("worker", 0)
        start("worker", 1)
        wait_for("worker-1.log", "Training.", 1, "training")
        time.sleep(args.train_secs)
        def grow():
            write(2)
            start("ps", 1)
        reshard(1, "1->2", grow)
        time.sleep(args.train_secs)
        reshard(2, "2->1", lambda: write(1))
    finally:
        for p in procs:
            p.kill()
            p.wait()

if __name__ == "__main__":
    main()
