#!/usr/bin/env python3
"""The training a `kill -9` of a ps costs: a cluster of dtf-ps and dtf-worker
processes (the reference model, `checkpoint.save_secs = 60`), a ps killed
mid-run and restarted at once; the chief's log says which step the restarted
ps restored, the step it had seen before and the step the shard resumed at
(in sync mode with several ps, the other shards' step; `steps_lost`: the
updates the shard lost). Prints one JSON
line: steps lost, steps/s before the kill, and so the seconds of training
lost.

    scripts/bench_ps_kill.py --bin target/release --ps 1 --workers 2 [--mode sync] [--transport tcp]
    scripts/bench_ps_kill.py --bin target/release --ps 2 --workers 4 --victim 1 --lose-disk
    scripts/bench_ps_kill.py --bin target/release --ps 2 --workers 4 --victim 0 --mode sync

With --lose-disk the victim's snapshot dir is deleted before the restart (a
replaced disk or machine): its shard comes from its ring neighbour's copy.
"""
import argparse, json, os, re, shutil, signal, subprocess, sys, tempfile, time

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--ps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mode", default="async")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--victim", type=int, default=0, help="the ps task to kill")
    ap.add_argument("--lose-disk", action="store_true",
                    help="delete the victim's snapshot dir before restarting it")
    ap.add_argument("--train-secs", type=float, default=8.0, help="training before the kill")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dtf-kill-")
    ports = list(range(23000 + os.getpid() % 5000, 23000 + os.getpid() % 5000 + args.ps + args.workers))
    addrs = [f"127.0.0.1:{p}" for p in ports]
    token = os.path.join(d, "token")
    with open(token, "w") as f:
        f.write("bench-token-0123456789")
    os.chmod(token, 0o600)
    cfg = os.path.join(d, "dtf.toml")
    with open(cfg, "w") as f:
        f.write(f"""[cluster]
ps = {json.dumps(addrs[:args.ps])}
worker = {json.dumps(addrs[args.ps:])}
transport = "{args.transport}"
runtime_dir = "{d}/run"
[train]
mode = "{args.mode}"
last_step = 100000000
[data]
dir = "{args.data}"
[checkpoint]
dir = "{d}/ckpt"
save_secs = 60
[ps]
snapshot_secs = 1
snapshot_dir = "{d}/state"
[security]
token_file = "{token}"
""")
    procs = {}
    def start(role, i):
        log = open(os.path.join(d, f"{role}-{i}.log"), "a")
        procs[(role, i)] = subprocess.Popen(
            [os.path.join(args.bin, f"dtf-{role}"), "--config", cfg, "--task", str(i)],
            stdout=log, stderr=log)
    def status():
        out = subprocess.run([os.path.join(args.bin, "dtf"), "status", "--json", "--config", cfg],
                             capture_output=True, text=True).stdout
        try:
            return json.loads(out)
        except ValueError:
            return None
    try:
        for i in range(args.ps):
            start("ps", i)
        for i in range(args.workers):
            start("worker", i)
        # Wait for training, then measure the rate over train_secs.
        deadline = time.time() + 120
        while not (s := status()) or not s["tasks"][0].get("initialized"):
            dead = [f"{r}-{i}" for (r, i), p in procs.items() if p.poll() is not None]
            if dead or time.time() > deadline:
                raise SystemExit(f"training never started ({', '.join(dead) or 'timed out'}); see the logs in {d}")
            time.sleep(0.2)
        t0, s0 = time.time(), s["global_step"]
        time.sleep(args.train_secs)
        s1, t1 = status()["global_step"], time.time()
        rate = (s1 - s0) / (t1 - t0)
        procs[("ps", args.victim)].send_signal(signal.SIGKILL)
        procs[("ps", args.victim)].wait()
        if args.lose_disk:
            shutil.rmtree(os.path.join(d, "state", f"ps-{args.victim}"))
        start("ps", args.victim)
        chief_log = os.path.join(d, "worker-0.log")
        pat = re.compile(r"ps=%d .*restored_step=(\d+) before=(\d+) steps_lost=(\d+) resumed_at=(\d+)" % args.victim)
        end = time.time() + 60
        m = None
        while time.time() < end and not m:
            with open(chief_log) as f:
                m = pat.search(f.read())
            time.sleep(0.1)
        if not m:
            raise SystemExit(f"the chief never logged a snapshot restore; see {d}")
        restored, before, lost, resumed = map(int, m.groups())
        print(json.dumps({"bench": "ps_kill", "ps": args.ps, "workers": args.workers,
                          "mode": args.mode, "transport": args.transport,
                          "lost_disk": args.lose_disk,
                          "steps_per_sec": round(rate, 1), "restored_step": restored,
                          "step_before_kill": before, "resumed_at": resumed, "steps_lost": lost,
                          "seconds_of_training_lost": round(lost / rate, 3) if rate else None}))
    finally:
        for p in procs.values():
            p.kill()
            p.wait()

if __name__ == "__main__":
    main()
