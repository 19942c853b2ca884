#!/usr/bin/env python3
"""One cluster run across "hosts": network namespaces on a bridge, each
host's veth shaped by a `tbf` qdisc on both ends (the test suite's
tests/it/hosts.rs, in Python), the daemons started with `ip netns exec`,
each host with its own runtime dir (so `transport = "auto"` takes TCP
between hosts). Prints one JSON line:

  global steps/s (whole run, from the first task's start; and steady, from
  the last worker's first step), CPU ms per global step (ps tasks, workers;
  from /proc), bytes on each host's link per global step (both directions,
  from the veth's counters: the wire, with TCP/IP headers), EMA test
  accuracy of the final checkpoint.

    scripts/bench_hosts.py --dtf target/release/dtf --data DIR --rate 1gbit \\
        --compression onebit --ps-hosts 0 --worker-hosts 1,1 --steps 3000 [--tls] [--mode sync]

Needs root, iproute2 (`ip`, `tc`), and openssl for --tls.
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")
SUBNET = "10.232.0"
TOKEN = "bench-token-0123456789abcdef"


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


class Hosts:
    """N namespaces on a bridge in a switch namespace; deleted by close()."""

    def __init__(self, n, rate):
        tag = f"dtfb-{os.getpid()}"
        self.switch = f"{tag}-sw"
        self.hosts = [f"{tag}-h{i}" for i in range(n)]
        self.made = []
        self._ns(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            self._ns(h)
            sh("ip", "link", "add", "eth0", "netns", h, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            sh("ip", "-n", self.switch, "link", "set", f"p{i}", "up")
            sh("ip", "-n", h, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
            sh("ip", "-n", h, "link", "set", "eth0", "up")
            sh("ip", "-n", h, "link", "set", "lo", "up")
            if rate:
                bps = parse_rate(rate)
                burst = str(max(bps // 8 // 250, 64 * 1024))
                for ns, dev in ((h, "eth0"), (self.switch, f"p{i}")):
                    sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                       "rate", rate, "burst", burst, "latency", "20ms")

    def _ns(self, name):
        sh("ip", "netns", "add", name)
        self.made.append(name)

    def addr(self, i):
        return f"{SUBNET}.{i + 1}"

    def link_bytes(self, i):
        """(tx, rx) bytes of host i's eth0."""
        out = sh("ip", "-n", self.hosts[i], "-s", "-j", "link", "show", "eth0").stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]

    def close(self):
        for ns in reversed(self.made):
            sh("ip", "netns", "delete", ns, check=False)


def parse_rate(rate):
    for unit, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if rate.endswith(unit):
            return int(rate[: -len(unit)]) * mult
    return int(rate)


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def tls_files(d, hosts):
    """A CA and one certificate for every host address (openssl)."""
    ca_key, ca_crt = f"{d}/ca.key", f"{d}/ca.crt"
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", ca_key, "-out", ca_crt, "-days", "2", "-subj", "/CN=dtf bench CA")
    key, csr, crt = f"{d}/host.key", f"{d}/host.csr", f"{d}/host.crt"
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", key, "-out", csr, "-subj", "/CN=dtf bench host")
    ext = f"{d}/ext.cnf"
    with open(ext, "w") as f:
        sans = ",".join(f"IP:{hosts.addr(i)}" for i in range(len(hosts.hosts)))
        f.write(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n")
    sh("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
       "-out", crt, "-days", "2", "-extfile", ext)
    os.chmod(key, 0o600)
    return crt, key, ca_crt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtf", default="target/release/dtf")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--rate", default="1gbit", help="tc rate of every host's link; 'none': unshaped")
    ap.add_argument("--compression", default="none")
    ap.add_argument("--ps-hosts", default="0", help="host of each ps task")
    ap.add_argument("--worker-hosts", default="1,1", help="host of each worker task")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--mode", default="async")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    a = ap.parse_args()
    bin_dir = os.path.dirname(os.path.abspath(a.dtf))
    ps_on = [int(h) for h in a.ps_hosts.split(",")]
    workers_on = [int(h) for h in a.worker_hosts.split(",")]
    n = max(ps_on + workers_on) + 1
    rate = None if a.rate == "none" else a.rate
    hosts = Hosts(n, rate)
    run = tempfile.mkdtemp(prefix="dtf-bench-hosts-")
    procs = []
    try:
        token = f"{run}/token"
        with open(token, "w") as f:
            f.write(TOKEN)
        os.chmod(token, 0o600)
        ps = [f"{hosts.addr(h)}:{2222 + i}" for i, h in enumerate(ps_on)]
        workers = [f"{hosts.addr(h)}:{2322 + i}" for i, h in enumerate(workers_on)]
        security = f'token_file = "{token}"\n'
        if a.tls:
            crt, key, ca = tls_files(run, hosts)
            security += f'tls_cert = "{crt}"\ntls_key = "{key}"\ntls_ca = "{ca}"\n'
        config = f"{run}/dtf.toml"
        with open(config, "w") as f:
            f.write(f"""[cluster]
ps = {json.dumps(ps)}
worker = {json.dumps(workers)}
transport = "auto"
compression = "{a.compression}"
[train]
mode = "{a.mode}"
last_step = {a.steps}
[data]
dir = "{a.data}"
[checkpoint]
dir = "{run}/ckpt"
save_secs = 600
[ps]
snapshot_dir = "{run}/state"
[security]
{security}""")
        start = time.time()
        tasks = [("ps", i, h) for i, h in enumerate(ps_on)] + [("worker", i, h) for i, h in enumerate(workers_on)]
        before = [hosts.link_bytes(i) for i in range(n)]
        for role, i, h in tasks:
            env = dict(os.environ, DTF_CLUSTER__RUNTIME_DIR=f"{run}/host{h}/run")
            os.makedirs(env["DTF_CLUSTER__RUNTIME_DIR"], exist_ok=True)
            log = open(f"{run}/{role}-{i}.log", "w")
            p = subprocess.Popen(["ip", "netns", "exec", hosts.hosts[h], f"{bin_dir}/dtf-{role}",
                                  "--config", config, "--task", str(i)],
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
            procs.append((role, i, p))
        cpu = {}
        while any(p.poll() is None for role, _, p in procs if role == "worker"):
            for role, i, p in procs:
                c = cpu_seconds(p.pid)
                if c is not None:
                    cpu[(role, i)] = c
            time.sleep(0.2)
        end = time.time()
        after = [hosts.link_bytes(i) for i in range(n)]
        for role, i, p in procs:
            if role == "ps":
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        failed = [f"{r}:{i}" for r, i, p in procs if p.wait() != 0]
        first = []
        for i in range(len(workers)):
            with open(f"{run}/worker-{i}.log") as f:
                for line in f:
                    if "Training." in line:
                        first.append(line.split()[0].rstrip("Z"))
                        break
        import datetime
        steady_from = max(datetime.datetime.fromisoformat(t).timestamp() for t in first) if first else start
        ev = json.loads(subprocess.run([a.dtf, "eval", "--json", "--data", a.data, f"{run}/ckpt"],
                                       capture_output=True, text=True).stdout or "{}")
        steps = ev.get("global_step", a.steps)
        ps_cpu = sum(c for (r, _), c in cpu.items() if r == "ps")
        w_cpu = sum(c for (r, _), c in cpu.items() if r == "worker")
        links = {f"host{i}": {"tx_bytes_per_step": round((after[i][0] - before[i][0]) / steps),
                              "rx_bytes_per_step": round((after[i][1] - before[i][1]) / steps)}
                 for i in range(n)}
        print(json.dumps({
            "bench": "hosts", "rate": a.rate, "compression": a.compression, "tls": a.tls,
            "mode": a.mode, "ps_hosts": ps_on, "worker_hosts": workers_on, "steps": steps,
            "steps_per_sec": round(steps / (end - start), 1),
            "steady_steps_per_sec": round(steps / max(end - steady_from, 1e-3), 1),
            "cpu_ms_per_step": {"ps": round(1000 * ps_cpu / steps, 3), "workers": round(1000 * w_cpu / steps, 3)},
            "links": links,
            "ema_accuracy": ev.get("ema_accuracy"), "accuracy": ev.get("accuracy"),
            "failed": failed,
        }), flush=True)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        hosts.close()
        if not a.keep:
            shutil.rmtree(run, ignore_errors=True)
        else:
            print(f"run directory: {run}", file=os.sys.stderr)


if __name__ == "__main__":
    main()
