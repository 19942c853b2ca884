#!/usr/bin/env python3
"""The pause of a re-shard (issue 24): dtf-ps and dtf-worker processes train
the reference model on 1 ps + 2 workers; `cluster.ps` gains a second ps (a
live edit, written by rename) and `dtf-ps -t 1` is started at once, as
`systemctl start dtf-ps@1` would; then the edit is undone (2 → 1). Per
re-shard it prints one JSON line: from the edit to the chief's re-shard
checkpoint, to the chief training again under the new placement, and to
the last worker training again (the pause); and the steps lost (the
re-shard checkpoint's step less the step restored: 0 by design).

With --tables DIR (RecBole atomic files, e.g. from `dtf synth`) it trains
wide & deep on them instead, waits until the ps tasks' tables hold
--min-rows rows (`dtf status`), re-shards --from → --to ps tasks once, and
adds the rows the re-shard checkpoint holds and the rows the new ps tasks
hold once the workers train again (≥ the checkpoint's: none lost).

    scripts/bench_reshard.py --bin target/release [--mode sync] [--transport tcp]
    scripts/bench_reshard.py --tables DIR --min-rows 10000000 --from 2 --to 3 [--set KEY=VALUE …]
"""
import argparse, datetime, json, os, re, subprocess, tempfile, time

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--mode", default="async")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--train-secs", type=float, default=5, help="training before each re-shard")
    ap.add_argument("--tables", help="RecBole data dir: wide & deep, one re-shard --from → --to")
    ap.add_argument("--min-rows", type=int, default=0, help="table rows before the re-shard")
    ap.add_argument("--from", dest="ps_from", type=int, default=1)
    ap.add_argument("--to", dest="ps_to", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE: a [section] key")
    ap.add_argument("--timeout", type=float, default=120, help="seconds any one wait may take")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dtf-reshard-")
    base = 24000 + os.getpid() % 5000
    ps_max = max(args.ps_from, args.ps_to)
    addrs = [f"127.0.0.1:{p}" for p in range(base, base + ps_max + 2)]
    token = os.path.join(d, "token")
    with open(token, "w") as f:
        f.write("bench-token-0123456789")
    os.chmod(token, 0o600)
    cfg = os.path.join(d, "dtf.toml")
    extra = {}
    for kv in args.set:
        key, value = kv.split("=", 1)
        section, name = key.rsplit(".", 1)
        extra.setdefault(section, []).append(f"{name} = {value}")
    data = f'dir = "{args.data}"'
    if args.tables:
        data = f'format = "recbole"\ndir = "{args.tables}"\nlabel = "label"'
        extra.setdefault("model", []).append('kind = "wide_deep"')
    def write(ps):
        sections = {
            "cluster": [f"ps = {json.dumps(addrs[:ps])}",
                        f"worker = {json.dumps(addrs[ps_max:ps_max + 2])}",
                        f'transport = "{args.transport}"', f'runtime_dir = "{d}/run"'],
            "train": [f'mode = "{args.mode}"', "last_step = 100000000"],
            "data": [data],
            "checkpoint": [f'dir = "{d}/ckpt"'],
            "ps": [f'snapshot_dir = "{d}/state"'],
            "security": [f'token_file = "{token}"'],
        }
        for k, v in extra.items():
            sections.setdefault(k, []).extend(v)
        text = "".join(f"[{k}]\n" + "\n".join(v) + "\n" for k, v in sections.items())
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
    def status():
        out = subprocess.run([os.path.join(args.bin, "dtf"), "status", "--config", cfg, "--json"],
                             capture_output=True, text=True)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return {}
    def rows(ps):
        tasks = [t for t in status().get("tasks", []) if t.get("role") == "ps"]
        if len(tasks) != ps or any(t.get("table_rows") is None for t in tasks):
            return 0
        return sum(sum(t["table_rows"].values()) for t in tasks)
    def wait_for(name, needle, n, what):
        end = time.time() + args.timeout
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
                          "steps_lost": step(done.replace("global_step=", "step=")) - step(restored),
                          **tables(ps)}),
              flush=True)
    def tables(ps):
        if not args.tables:
            return {}
        ckpt = os.path.join(d, "ckpt")
        inspect = subprocess.run([os.path.join(args.bin, "dtf"), "inspect", "--json", ckpt],
                                 capture_output=True, text=True)
        held = sum(t["rows"] for t in json.loads(inspect.stdout).get("tables", []))
        return {"checkpoint_rows": held, "rows_after": rows(int(ps.split("->")[1]))}
    try:
        if args.tables:
            write(args.ps_from)
            for i in range(args.ps_from):
                start("ps", i)
            start("worker", 0)
            start("worker", 1)
            wait_for("worker-1.log", "Training.", 1, "training")
            end = time.time() + args.timeout
            while (held := rows(args.ps_from)) < args.min_rows:
                if time.time() > end:
                    raise SystemExit(f"{held} rows after {args.timeout} s; see {d}")
                time.sleep(1)
            print(json.dumps({"rows_before": held}), flush=True)
            def grow():
                write(args.ps_to)
                for i in range(args.ps_from, args.ps_to):
                    start("ps", i)
            reshard(1, f"{args.ps_from}->{args.ps_to}", grow)
            return
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
