#!/usr/bin/env python3
"""One `dtf local --json` run, watched from outside: every task's peak RSS
(VmHWM) and CPU seconds (utime+stime) are polled from /proc while it runs,
and the startup delay (chief's first step → last worker's first step) is
read from the workers' logs. Prints one JSON line.

    scripts/bench_cluster.py --dtf target/release/dtf --ps 1 --workers 2 --steps 3000 [--mode sync] [--save-secs 60] [--config F]

--config passes a base config to `dtf local` (e.g. `[train] optimizer = "adam"`).
"""
import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import time

TICK = os.sysconf("SC_CLK_TCK")


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def sample(pid):
    """(name, VmHWM kB, cpu seconds) of a live task, or None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/status") as f:
            hwm = next((int(l.split()[1]) for l in f if l.startswith("VmHWM:")), 0)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    role = os.path.basename(argv[0].decode())
    task = argv[argv.index(b"--task") + 1].decode() if b"--task" in argv else "?"
    return f"{role.removeprefix('dtf-')}:{task}", hwm, cpu


def first_step_times(run_dir):
    """Per worker, the time of its "Training." line (logged just before its first step)."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, "logs", "worker-*.log")):
        with open(path) as f:
            for line in f:
                if "Training." in line:
                    ts = re.match(r"(\S+?)Z?\s", line).group(1)
                    out[os.path.basename(path)[:-4]] = datetime.datetime.fromisoformat(ts).timestamp()
                    break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtf", default="target/release/dtf")
    ap.add_argument("--ps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--mode", default="async")
    ap.add_argument("--save-secs", type=int, default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--transport", default="auto", help="auto (shared memory) or tcp")
    ap.add_argument("--config", default=None)
    args = ap.parse_args()
    cmd = [args.dtf, "local", "--json", "--ps", str(args.ps), "--workers", str(args.workers),
           "--steps", str(args.steps), "--mode", args.mode, "--transport", args.transport]
    if args.save_secs is not None:
        cmd += ["--save-secs", str(args.save_secs)]
    if args.data:
        cmd += ["--data", args.data]
    if args.config:
        cmd += ["--config", args.config]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = {}
    while proc.poll() is None:
        for pid in children(proc.pid):
            s = sample(pid)
            # Skip a child caught between fork and exec (no --task yet).
            if s and not s[0].endswith(":?"):
                seen[s[0]] = (max(s[1], seen.get(s[0], (0, 0))[0]), s[2])
        time.sleep(0.1)
    out = proc.stdout.read().strip().splitlines()
    if proc.returncode != 0 or not out:
        raise SystemExit(f"dtf local failed ({proc.returncode}): {out}")
    report = json.loads(out[-1])
    starts = first_step_times(report["run_dir"])
    chief = starts.get("worker-0")
    report["startup_secs"] = max(starts.values()) - chief if chief is not None and starts else None
    report["peak_rss_mb"] = {k: round(v[0] / 1024, 1) for k, v in sorted(seen.items())}
    report["cpu_secs"] = {k: round(v[1], 2) for k, v in sorted(seen.items())}
    steps = max(report["global_step"], 1)
    report["cpu_ms_per_global_step"] = {
        "ps": round(1e3 * sum(v[1] for k, v in seen.items() if k.startswith("ps")) / steps, 3),
        "worker": round(1e3 * sum(v[1] for k, v in seen.items() if k.startswith("worker")) / steps, 3),
    }
    report["args"] = vars(args)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
